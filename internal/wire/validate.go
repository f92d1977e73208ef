package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes is the AMQP limit for a routing key, exchange or queue name.
const MaxNameBytes = 255

// ErrInvalid is wrapped by every *InvalidError and by every other breach
// of the contract a module can make (a body that is not JSON, a bad
// option); sdk.ErrInvalid is this error.
var ErrInvalid = errors.New("invalid")

// ErrAlreadyStarted is wrapped by the refusal of an On, Consume, Exclusive
// or Serve once a module's Setup has returned. It wraps ErrInvalid: to a
// module it is a breach of the contract like any other.
var ErrAlreadyStarted = fmt.Errorf("%w: the module already started (On, Consume, Exclusive and Serve are for Setup)", ErrInvalid)

// ErrNotStarted is wrapped by the refusal of an Emit or Call while the
// module's Setup runs. It wraps ErrInvalid.
var ErrNotStarted = fmt.Errorf("%w: the module has not started yet (Emit and Call are for Run and handlers, not Setup)", ErrInvalid)

// ErrForbidden is wrapped by the refusal of what a module's grants do not
// allow; sdk.ErrForbidden is this error.
var ErrForbidden = errors.New("forbidden")

// ErrPermanent marks an error retrying cannot fix; sdk.ErrPermanent is
// this error.
var ErrPermanent = errors.New("permanent")

// ErrConflict marks the error of a handling that found its event's id
// handled already with other content (an inbox's record, wire.Digest
// differs): the event is dead-lettered at once with reason
// DeadReasonConflict. sdk.ErrConflict is this error.
var ErrConflict = errors.New("conflict")

// ErrClosed is returned once a mesh has been closed; sdk.ErrClosed is
// this error.
var ErrClosed = errors.New("mesh closed")

// ErrNoServer is returned by a call of a tool nobody serves;
// sdk.ErrNoServer is this error.
var ErrNoServer = errors.New("no server for this tool")

// ErrTransient is wrapped by every error of an emit or call that may not
// recur: the same emit or call may succeed later. sdk.ErrTransient is this
// error; the hosts tell its kinds apart with the errors below, which the
// sdk does not export.
var ErrTransient = errors.New("transient")

// The kinds of transient error.
var (
	// ErrRefused: the broker refused the event (a negative confirm, a
	// full queue) or could neither route nor keep it.
	ErrRefused = fmt.Errorf("%w: refused by the broker", ErrTransient)
	// ErrConnectionLost: the broker connection dropped while the emit or
	// call was in flight; an event may or may not have reached the broker.
	ErrConnectionLost = fmt.Errorf("%w: broker connection lost", ErrTransient)
	// ErrBackPressure: the broker is unreachable and the node's spool is
	// full; nothing was kept.
	ErrBackPressure = fmt.Errorf("%w: back-pressure: the node's spool is full", ErrTransient)
)

// CheckToolGrant refuses a tool that module may not serve: grants are
// topic patterns of tool keys, nil places no limit. The refusal names the
// key of meshd's config that grants tools.
func CheckToolGrant(module, tool string, grants []string) error {
	if grants == nil {
		return nil
	}
	for _, g := range grants {
		if MatchPattern(g, tool) {
			return nil
		}
	}
	return fmt.Errorf("serve %s: %w: module %s's entry in mesh.yaml does not grant it (%s): add %q to its tools:",
		tool, ErrForbidden, module, GrantsHave("tools", grants), tool)
}

// GrantsHave says what a module's grant list holds, in mesh.yaml's terms,
// for a refusal: `its calls: are ["a.*"]`, or `it has no calls:`.
func GrantsHave(key string, grants []string) string {
	if len(grants) == 0 {
		return "it has no " + key + ":"
	}
	q := make([]string, len(grants))
	for i, g := range grants {
		q[i] = strconv.Quote(g)
	}
	return "its " + key + ": are [" + strings.Join(q, ", ") + "]"
}

// InvalidError says which rule a routing key, pattern or name broke.
type InvalidError struct {
	What  string // "event type", "pattern", "queue name", "module name", ...
	Value string
	Rule  string
}

// Error returns what was checked, the offending value and the rule it broke,
// for example
//
//	event type "orders..created": word 2 is empty (no leading, trailing or double dots)
func (e *InvalidError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.What, e.Value, e.Rule)
}

// Unwrap lets errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(what, value, rule string, args ...any) error {
	return &InvalidError{What: what, Value: value, Rule: fmt.Sprintf(rule, args...)}
}

// checkWord applies the rules every word of a key shares.
func checkWord(what, value, word string, i int) error {
	if word == "" {
		return invalid(what, value, "word %d is empty (no leading, trailing or double dots)", i+1)
	}
	for _, r := range word {
		switch {
		case r == '*' || r == '#':
			return invalid(what, value, "word %d contains %q, which only a pattern may use, as a whole word", i+1, r)
		case unicode.IsControl(r):
			return invalid(what, value, "word %d contains a control character", i+1)
		case unicode.IsSpace(r):
			return invalid(what, value, "word %d contains whitespace", i+1)
		}
	}
	return nil
}

func checkLength(what, value string) error {
	if value == "" {
		return invalid(what, value, "is empty")
	}
	if len(value) > MaxNameBytes {
		return invalid(what, value, "is %d bytes, over the AMQP limit of %d", len(value), MaxNameBytes)
	}
	if !utf8.ValidString(value) {
		return invalid(what, value, "is not valid UTF-8")
	}
	return nil
}

// ValidateEventType checks a full event type (the routing key): at least three
// dotted words, the first one of Origins, no empty word, no '*', '#',
// whitespace or control characters, at most 255 bytes. It never cleans.
func ValidateEventType(key string) error {
	const what = "event type"
	if err := checkLength(what, key); err != nil {
		return err
	}
	n, err := checkWords(what, key)
	if err != nil {
		return err
	}
	if n < 3 {
		return invalid(what, key, "has %d words, needs at least 3 (<origin>.<name>.<event>)", n)
	}
	switch origin, _, _ := strings.Cut(key, "."); origin {
	case "module", "mesh", "node":
	default:
		return invalid(what, key, "origin %q is not one of module, mesh, node", origin)
	}
	return nil
}

// checkWords checks each dotted word of s by checkWord and returns how
// many there are; it allocates nothing (it runs on every emit and
// delivery).
func checkWords(what, s string) (n int, err error) {
	for rest, more := s, true; more; n++ {
		var w string
		w, rest, more = strings.Cut(rest, ".")
		if err := checkWord(what, s, w, n); err != nil {
			return n, err
		}
	}
	return n, nil
}

// ValidateRelativeType checks the name a module emits under its own
// namespace ("site.created"): one or more words, each following the event
// type rules. The full type module.<module>.<name> is checked separately.
func ValidateRelativeType(name string) error {
	const what = "event name"
	if err := checkLength(what, name); err != nil {
		return err
	}
	_, err := checkWords(what, name)
	return err
}

// ValidatePattern checks an AMQP topic pattern: words as in an event type,
// or a whole word that is '*' (one word) or '#' (zero or more words).
func ValidatePattern(pattern string) error {
	const what = "pattern"
	if err := checkLength(what, pattern); err != nil {
		return err
	}
	for i, w := range strings.Split(pattern, ".") {
		if w == "*" || w == "#" {
			continue
		}
		if err := checkWord(what, pattern, w, i); err != nil {
			return err
		}
	}
	return nil
}

// ValidateSubscription checks a topic pattern of event types (a module's
// subscription, a grant of event types, a tail or dead-letter filter): a
// valid pattern (ValidatePattern) that can match some event type. It
// refuses what could never match, each time with the fix: a first word
// that is not an origin (module, mesh, node) or a wildcard, and fewer
// than three words without '#' (an event type has at least three).
func ValidateSubscription(pattern string) error {
	if err := ValidatePattern(pattern); err != nil {
		return err
	}
	words := strings.Split(pattern, ".")
	switch words[0] {
	case "module", "mesh", "node", "*", "#":
	default:
		return invalid("pattern", pattern, "begins with %q, not an origin (module, mesh, node) or a wildcard, so it never matches an event type (<origin>.<name>.<event>): did you mean %q?",
			words[0], "module."+pattern)
	}
	if len(words) < 3 && !strings.Contains(pattern, "#") {
		return invalid("pattern", pattern, "has %d words and no '#', so it never matches an event type, which has at least 3 (<origin>.<name>.<event>): did you mean %q?",
			len(words), pattern+".#")
	}
	return nil
}

// ValidateWord checks a name that becomes one word of routing keys and queue
// names: a node or module name. what names the field ("node name").
func ValidateWord(what, name string) error {
	if err := checkLength(what, name); err != nil {
		return err
	}
	if strings.Contains(name, ".") {
		return invalid(what, name, "contains '.', but must be a single word")
	}
	return checkWord(what, name, name, 0)
}

// ValidateQueueName checks a queue name the runtime derives: not empty, at
// most 255 bytes, no whitespace or control characters.
func ValidateQueueName(name string) error {
	const what = "queue name"
	if err := checkLength(what, name); err != nil {
		return err
	}
	if strings.HasPrefix(name, "amq.") {
		return invalid(what, name, "starts with \"amq.\", which the broker reserves")
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return invalid(what, name, "contains whitespace or a control character")
		}
	}
	return nil
}

// MatchPattern reports whether an AMQP topic pattern matches a routing key,
// with the broker's semantics: '*' is exactly one word, '#' zero or more, and
// the empty key has no words. It runs in time proportional to the product of
// the word counts, whatever the pattern.
func MatchPattern(pattern, key string) bool {
	hash := strings.IndexByte(pattern, '#')
	switch {
	case hash < 0:
		return matchWords(pattern, key)
	case pattern == "#":
		return true
	case hash == len(pattern)-1 && strings.HasSuffix(pattern, ".#"):
		// The common "module.umami.#": the words before it, then any.
		return matchPrefix(pattern[:len(pattern)-2], key)
	}
	return matchTable(words(pattern), words(key))
}

// matchPrefix reports whether key starts with words that pattern (no '#')
// matches word by word, without allocating: pattern + ".#" matches key.
func matchPrefix(pattern, key string) bool {
	if key == "" {
		return false // the prefix has a word at least; the key has none
	}
	for {
		pw, prest, pmore := strings.Cut(pattern, ".")
		kw, krest, kmore := strings.Cut(key, ".")
		if pw != "*" && pw != kw {
			return false
		}
		if !pmore {
			return true
		}
		if !kmore {
			return false
		}
		pattern, key = prest, krest
	}
}

func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// matchWords matches a pattern without '#' word by word, without allocating.
func matchWords(pattern, key string) bool {
	if pattern == "" || key == "" {
		return pattern == key
	}
	for {
		pw, prest, pmore := strings.Cut(pattern, ".")
		kw, krest, kmore := strings.Cut(key, ".")
		if pw != "*" && pw != kw {
			return false
		}
		if !pmore || !kmore {
			return pmore == kmore
		}
		pattern, key = prest, krest
	}
}

// matchTable matches by dynamic programming over (pattern word, key word):
// next[j] says whether p[i+1:] matches k[j:].
func matchTable(p, k []string) bool {
	n := len(k)
	next := make([]bool, n+1)
	cur := make([]bool, n+1)
	next[n] = true
	for i := len(p) - 1; i >= 0; i-- {
		for j := n; j >= 0; j-- {
			switch {
			case p[i] == "#":
				cur[j] = next[j] || (j < n && cur[j+1])
			case j < n && (p[i] == "*" || p[i] == k[j]):
				cur[j] = next[j+1]
			default:
				cur[j] = false
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

// ValidateToolKey checks a tool key ("invoice.create"): one or more dotted
// words with the event type's word rules, short enough that its serve
// queue name (serve.<key>) stays within 255 bytes.
func ValidateToolKey(key string) error {
	const what = "tool key"
	if err := checkLength(what, key); err != nil {
		return err
	}
	if limit := MaxNameBytes - len(ServeQueue("")); len(key) > limit {
		return invalid(what, key, "is %d bytes, over %d (its queue name serve.<key> must fit in %d)", len(key), limit, MaxNameBytes)
	}
	_, err := checkWords(what, key)
	return err
}
