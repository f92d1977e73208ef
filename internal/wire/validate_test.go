package wire_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// key255 is an event type of exactly the AMQP limit.
var key255 = "module.umami." + strings.Repeat("x", wire.MaxNameBytes-len("module.umami."))

// key256 is one byte over the AMQP limit.
var key256 = key255 + "y"

type badCase struct {
	name  string
	value string
	// rule lists words of which at least one must appear in the Rule text.
	rule []string
}

// checkInvalid asserts that err is a non-nil *wire.InvalidError wrapping
// wire.ErrInvalid, for value, and that its rule names one of rule.
func checkInvalid(t *testing.T, err error, what, value string, rule []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%q: got nil error, want one naming %q", value, rule)
	}
	if !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("%q: errors.Is(err, ErrInvalid) is false for %v", value, err)
	}
	var ie *wire.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("%q: error %T %v is not a *wire.InvalidError", value, err, err)
	}
	if what != "" && ie.What != what {
		t.Errorf("%q: What = %q, want %q", value, ie.What, what)
	}
	if ie.Value != value {
		t.Errorf("Value = %q, want %q", ie.Value, value)
	}
	found := false
	for _, r := range rule {
		if strings.Contains(ie.Rule, r) {
			found = true
			break
		}
	}
	if !found {
		t.Errorf("%q: Rule %q mentions none of %q", value, ie.Rule, rule)
	}
	if !strings.Contains(err.Error(), ie.Rule) {
		t.Errorf("%q: Error() %q does not contain the rule %q", value, err.Error(), ie.Rule)
	}
}

func TestValidateEventTypeGood(t *testing.T) {
	if len(key255) != 255 {
		t.Fatalf("key255 is %d bytes", len(key255))
	}
	for _, key := range []string{
		"module.umami.site.created",
		"mesh.delivery.deployed",
		"node.anchor.joined",
		"module.umami.site",
		"node.anchor-1.left",
		"module.my_mod.a.b.c.d.e",
		"module.umami.größe", // non-ASCII letters are fine
		key255,
	} {
		if err := wire.ValidateEventType(key); err != nil {
			t.Errorf("ValidateEventType(%q) = %v, want nil", key, err)
		}
	}
}

func TestValidateEventTypeBad(t *testing.T) {
	if len(key256) != 256 {
		t.Fatalf("key256 is %d bytes", len(key256))
	}
	for _, tc := range []badCase{
		{"empty", "", []string{"empty"}},
		{"one word", "module", []string{"3"}},
		{"two words", "module.umami", []string{"3"}},
		{"empty word", "module..created", []string{"empty"}},
		{"leading dot", ".module.umami.created", []string{"empty"}},
		{"trailing dot", "module.umami.created.", []string{"empty"}},
		{"double dot", "module.umami..site.created", []string{"empty"}},
		{"only dots", "...", []string{"empty"}},
		{"star word", "module.*.created", []string{"'*'"}},
		{"star in word", "module.um*mi.created", []string{"'*'"}},
		{"hash word", "module.umami.#", []string{"'#'"}},
		{"hash in word", "module.umami.site#1", []string{"'#'"}},
		{"space", "module.umami.site created", []string{"whitespace"}},
		{"no-break space", "module.umami.site\u00a0created", []string{"whitespace"}},
		{"ideographic space", "module.umami.site\u3000created", []string{"whitespace"}},
		{"tab", "module.umami.site\tcreated", []string{"whitespace", "control"}},
		{"newline", "module.umami.site.created\n", []string{"whitespace", "control"}},
		{"carriage return", "module.umami\r.created", []string{"whitespace", "control"}},
		{"NUL", "module.umami.site\x00created", []string{"control"}},
		{"escape", "module.umami.\x1bcreated", []string{"control"}},
		{"DEL", "module.umami.created\x7f", []string{"control"}},
		{"C1 control", "module.umami.cre\u0085ated", []string{"control", "whitespace"}},
		{"invalid UTF-8", "module.umami.\xff", []string{"UTF-8"}},
		{"truncated UTF-8", "module.umami.gr\xc3", []string{"UTF-8"}},
		{"256 bytes", key256, []string{"255", "256"}},
		{"unknown origin", "foo.bar.baz", []string{"origin"}},
		{"origin case", "Module.umami.created", []string{"origin"}},
		{"origin prefix", "modules.umami.created", []string{"origin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidateEventType(tc.value), "event type", tc.value, tc.rule)
		})
	}
}

// TestValidateEventTypeReplacementCharacter: U+FFFD, properly encoded, is
// valid UTF-8 and none of the characters SPEC §1 forbids, so a key holding it
// must be accepted (and never refused as "not valid UTF-8").
func TestValidateEventTypeReplacementCharacter(t *testing.T) {
	key := "module.umami.site\uFFFDcreated"
	if err := wire.ValidateEventType(key); err != nil {
		t.Errorf("ValidateEventType(%q) = %v, want nil (the key is valid UTF-8 and breaks no SPEC §1 rule)", key, err)
	}
}

func TestValidatePattern(t *testing.T) {
	for _, p := range []string{
		"#",
		"*",
		"*.*.*",
		"module.umami.#",
		"node.*.joined",
		"module.#.created",
		"#.created",
		"#.#",
		"module.umami.site.created",
		key255,
	} {
		if err := wire.ValidatePattern(p); err != nil {
			t.Errorf("ValidatePattern(%q) = %v, want nil", p, err)
		}
	}
	for _, tc := range []badCase{
		{"empty", "", []string{"empty"}},
		{"double dot", "a..b", []string{"empty"}},
		{"leading dot", ".a.#", []string{"empty"}},
		{"trailing dot", "a.#.", []string{"empty"}},
		{"star inside word", "mod*ule.x", []string{"'*'"}},
		{"hash inside word", "module.x#", []string{"'#'"}},
		{"double star", "module.**", []string{"'*'"}},
		{"double hash", "module.##", []string{"'#'"}},
		{"space", "a b", []string{"whitespace"}},
		{"control", "a.\x00.b", []string{"control"}},
		{"invalid UTF-8", "a.\xfe.#", []string{"UTF-8"}},
		{"over 255 bytes", "#." + strings.Repeat("a", 254), []string{"255", "256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidatePattern(tc.value), "pattern", tc.value, tc.rule)
		})
	}
}

// TestValidateSubscription: a pattern that could never match an event
// type is refused, with the fix; any other valid pattern passes.
func TestValidateSubscription(t *testing.T) {
	for _, p := range []string{"#", "*.*.*", "module.umami.#", "node.*.joined", "module.#.created", "#.created", "*.#", "mesh.#", "module.umami.site.created"} {
		if err := wire.ValidateSubscription(p); err != nil {
			t.Errorf("ValidateSubscription(%q) = %v, want nil", p, err)
		}
	}
	for _, tc := range []badCase{
		{"no origin", "orders.placed", []string{`did you mean "module.orders.placed"`}},
		{"no origin, wildcard after", "orders.#", []string{"not an origin"}},
		{"two words", "module.umami", []string{`at least 3`, `"module.umami.#"`}},
		{"one word", "node", []string{"has 1 words"}},
		{"two words with a star", "module.*", []string{"no '#'"}},
		{"bad pattern", "module..x", []string{"empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidateSubscription(tc.value), "pattern", tc.value, tc.rule)
		})
	}
}

func TestValidateWord(t *testing.T) {
	for _, w := range []string{"umami", "anchor-1", "node_2", "a", strings.Repeat("w", 255)} {
		if err := wire.ValidateWord("node name", w); err != nil {
			t.Errorf("ValidateWord(%q) = %v, want nil", w, err)
		}
	}
	for _, tc := range []badCase{
		{"empty", "", []string{"empty"}},
		{"dot", "a.b", []string{"'.'", "single word"}},
		{"leading dot", ".a", []string{"'.'", "single word"}},
		{"star", "a*", []string{"'*'"}},
		{"hash", "#", []string{"'#'"}},
		{"space", "a b", []string{"whitespace"}},
		{"newline", "a\n", []string{"whitespace", "control"}},
		{"control", "a\x01", []string{"control"}},
		{"invalid UTF-8", "a\x80", []string{"UTF-8"}},
		{"over 255 bytes", strings.Repeat("w", 256), []string{"255", "256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidateWord("module name", tc.value), "module name", tc.value, tc.rule)
		})
	}
}

func TestValidateQueueName(t *testing.T) {
	for _, q := range []string{
		wire.ModuleQueue("anchor", "umami"),
		wire.QueueDead,
		wire.QueueUnrouted,
		"serve.tool.key",
		strings.Repeat("q", 255),
	} {
		if err := wire.ValidateQueueName(q); err != nil {
			t.Errorf("ValidateQueueName(%q) = %v, want nil", q, err)
		}
	}
	for _, tc := range []badCase{
		{"empty", "", []string{"empty"}},
		{"space", "anchor.umami events", []string{"whitespace"}},
		{"tab", "anchor\tumami", []string{"whitespace", "control"}},
		{"NUL", "anchor\x00umami", []string{"control"}},
		{"invalid UTF-8", "anchor.\xff.events", []string{"UTF-8"}},
		{"over 255 bytes", strings.Repeat("q", 256), []string{"255", "256"}},
		{"derived over 255 bytes", wire.ModuleQueue(strings.Repeat("n", 125), strings.Repeat("m", 125)), []string{"255"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidateQueueName(tc.value), "queue name", tc.value, tc.rule)
		})
	}
}

func TestValidateRelativeType(t *testing.T) {
	for _, n := range []string{"site.created", "created", "site.page.viewed"} {
		if err := wire.ValidateRelativeType(n); err != nil {
			t.Errorf("ValidateRelativeType(%q) = %v, want nil", n, err)
		}
		if err := wire.ValidateEventType(wire.ModuleEventType("umami", n)); err != nil {
			t.Errorf("ValidateEventType(ModuleEventType(umami, %q)) = %v, want nil", n, err)
		}
	}
	for _, tc := range []badCase{
		{"empty", "", []string{"empty"}},
		{"double dot", "site..created", []string{"empty"}},
		{"trailing dot", "site.created.", []string{"empty"}},
		{"star", "site.*", []string{"'*'"}},
		{"hash", "#", []string{"'#'"}},
		{"space", "site created", []string{"whitespace"}},
		{"over 255 bytes", strings.Repeat("s", 256), []string{"255", "256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, wire.ValidateRelativeType(tc.value), "", tc.value, tc.rule)
		})
	}
}

func TestInvalidErrorText(t *testing.T) {
	err := wire.ValidateEventType("foo.bar.baz")
	var ie *wire.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("got %T %v", err, err)
	}
	msg := err.Error()
	for _, part := range []string{"event type", `"foo.bar.baz"`, ie.Rule} {
		if !strings.Contains(msg, part) {
			t.Errorf("Error() %q does not contain %q", msg, part)
		}
	}
}

// TestMatchPattern follows RabbitMQ's topic exchange: the key and the binding
// are split on '.', an empty string being zero words (rabbit_exchange_type_topic
// split_topic_key(<<>>) = []); '*' is exactly one word (which may be empty,
// as in "a..b"); '#' is zero or more words.
func TestMatchPattern(t *testing.T) {
	for _, tc := range []struct {
		pattern, key string
		want         bool
	}{
		// '#' alone matches everything.
		{"#", "a", true},
		{"#", "a.b", true},
		{"#", "module.umami.site.created", true},
		{"#", "", true},
		{"#.#", "a", true},
		{"#.#", "", true},

		// literals
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b.d", false},
		{"a", "ab", false},
		{"ab", "a", false},
		{"a", "a", true},

		// '*' is exactly one word.
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.*", "a", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.*.*", "a.b.c", true},
		{"*.*.*", "a.b", false},
		{"*.*.*", "a.b.c.d", false},
		{"node.*.joined", "node.anchor.joined", true},
		{"node.*.joined", "node.anchor.left", false},
		{"node.*.joined", "node.a.b.joined", false},
		{"node.*.joined", "node.joined", false},
		{"a.*.b", "a..b", true}, // the empty word is still a word

		// '#' is zero or more words.
		{"a.#", "a", true},
		{"a.#", "a.b", true},
		{"a.#", "a.b.c", true},
		{"a.#", "b.a", false},
		{"a.#", "ab", false},
		{"#.c", "c", true},
		{"#.c", "a.b.c", true},
		{"#.c", "c.d", false},
		{"#.c", "a.c.d", false},
		{"a.#.c", "a.c", true},
		{"a.#.c", "a.b.c", true},
		{"a.#.c", "a.b.d.c", true},
		{"a.#.c", "a.b", false},
		{"a.#.c", "a.c.d", false},
		{"a.#.c", "a.c.c", true},
		{"module.umami.#", "module.umami.site.created", true},
		{"module.umami.#", "module.umamix.site.created", false},
		{"module.#.created", "module.umami.site.created", true},
		{"module.#.created", "module.created", true},
		{"module.#.created", "module.umami.site.deleted", false},
		{"#.a.#", "a", true},
		{"#.a.#", "b.a.c", true},
		{"#.a.#", "b.c", false},
		{"a.#.#.b", "a.b", true},
		{"a.#.#.b", "a.x.y.z.b", true},

		// '*' and '#' together.
		{"*.#", "a", true},
		{"*.#", "a.b.c", true},
		{"#.*", "a", true},
		{"#.*", "a.b", true},
		{"*.#.*", "a", false},
		{"*.#.*", "a.b", true},
		{"*.#.*", "a.b.c", true},
		{"#.*.#", "a", true},
		{"#.*.*.#", "a", false},
		{"#.*.*.#", "a.b", true},

		// The empty routing key is zero words in RabbitMQ, so only a
		// pattern that can match zero words matches it.
		{"*.#", "", false},
		{"#.*", "", false},
		{"*", "", false},
		{"a", "", false},
		{"a.#", "", false},
	} {
		if got := wire.MatchPattern(tc.pattern, tc.key); got != tc.want {
			t.Errorf("MatchPattern(%q, %q) = %v, want %v", tc.pattern, tc.key, got, tc.want)
		}
	}
}

// TestMatchPatternPathological guards the cost of matching: a valid pattern
// and key, both well under the 255-byte limit, whose words make a naive
// backtracking matcher try every way of spreading the key over the '#'s.
// Matching is a word-by-word dynamic program of at most 128×128 steps, so a
// second is a budget no correct matcher comes near; it is not a benchmark.
func TestMatchPatternPathological(t *testing.T) {
	pattern := strings.Repeat("#.a.", 6) + "#.b" // 27 bytes
	key := strings.Repeat("a.", 60) + "c"        // 121 bytes
	if err := wire.ValidatePattern(pattern); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- wire.MatchPattern(pattern, key) }()
	select {
	case got := <-done:
		if got {
			t.Errorf("MatchPattern(%q, %q) = true, want false", pattern, key)
		}
	case <-time.After(time.Second):
		t.Errorf("MatchPattern(%q, %q) still running after 1s: matching is exponential in the number of '#' words", pattern, key)
	}
}
