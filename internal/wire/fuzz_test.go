package wire

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
)

var eventTypeSeeds = []string{
	"module.umami.site.created",
	"mesh.delivery.deployed",
	"node.anchor.joined",
	"module.umami.größe",
	"module.umami." + strings.Repeat("x", 242),
	"module.umami." + strings.Repeat("x", 243),
	"",
	".",
	"module.umami",
	"module..created",
	".module.umami.created",
	"module.umami.created.",
	"module.*.created",
	"module.umami.#",
	"module.umami.site created",
	"module.umami.site\tcreated",
	"module.umami.site\ncreated",
	"module.umami.site\x00created",
	"module.umami.\x7f",
	"module.umami.\u0085",
	"module.umami.\u00a0",
	"module.umami.\xff",
	"foo.bar.baz",
}

// FuzzValidateEventType checks that whatever ValidateEventType accepts keeps
// every SPEC §1 rule, that a key keeping every rule is accepted, and that an
// error always wraps ErrInvalid.
func FuzzValidateEventType(f *testing.F) {
	for _, s := range eventTypeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := ValidateEventType(key)
		broken := specBreaks(key)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidateEventType(%q) = %v, which does not wrap ErrInvalid", key, err)
			}
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Rule == "" {
				t.Fatalf("ValidateEventType(%q) = %T %v, want an *InvalidError with a rule", key, err, err)
			}
			if broken == "" {
				t.Fatalf("ValidateEventType(%q) = %v, but the key breaks no SPEC §1 rule", key, err)
			}
			return
		}
		if broken != "" {
			t.Fatalf("ValidateEventType(%q) = nil, but the key %s", key, broken)
		}
		if err := ValidatePattern(key); err != nil {
			t.Fatalf("ValidatePattern(%q) = %v for a valid event type", key, err)
		}
		if !MatchPattern(key, key) {
			t.Fatalf("MatchPattern(%q, %q) = false", key, key)
		}
		if !MatchPattern("#", key) {
			t.Fatalf("MatchPattern(#, %q) = false", key)
		}
		words := strings.Split(key, ".")
		if !MatchPattern(strings.Repeat("*.", len(words)-1)+"*", key) {
			t.Fatalf("%d stars do not match %q", len(words), key)
		}
		if !MatchPattern(words[0]+".#", key) {
			t.Fatalf("%s.# does not match %q", words[0], key)
		}
	})
}

// specBreaks returns the SPEC §1 rule an event type breaks, or "" when it
// keeps them all. Written independently of validate.go.
func specBreaks(key string) string {
	if len(key) > 255 {
		return "is over 255 bytes"
	}
	if !utf8.ValidString(key) {
		return "is not valid UTF-8"
	}
	words := strings.Split(key, ".")
	if len(words) < 3 {
		return "has fewer than 3 words"
	}
	for _, w := range words {
		if w == "" {
			return "has an empty word"
		}
	}
	if strings.ContainsAny(key, "*#") {
		return "contains '*' or '#'"
	}
	if strings.IndexFunc(key, unicode.IsSpace) >= 0 {
		return "contains whitespace"
	}
	if strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return "contains a control character"
	}
	switch words[0] {
	case "module", "mesh", "node":
	default:
		return "has an unknown origin"
	}
	return ""
}

// FuzzDecodeMeta checks that DecodeMeta never panics, that what it accepts
// keeps the contract and that what it refuses is ErrMalformed.
func FuzzDecodeMeta(f *testing.F) {
	good := ulid.Make().String()
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC).Format(time.RFC3339)
	f.Add(good, "umami", "anchor", now, "application/json", []byte(`{"a":1}`), "acme")
	f.Add(good, "umami", "anchor", "2025-03-04T05:06:07.123456789+02:00", "application/json; charset=utf-8", []byte(`[]`), "")
	f.Add(strings.ToLower(good), "s", "n", now, "Application/JSON", []byte(`null`), "x")
	f.Add("123", "umami", "anchor", now, "application/json", []byte(`{}`), "")
	f.Add("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "umami", "anchor", now, "application/json", []byte(`{}`), "")
	f.Add("81ARZ3NDEKTSV4RRFFQ69G5FAV", "umami", "anchor", now, "application/json", []byte(`{}`), "")
	f.Add(good, "", "anchor", now, "application/json", []byte(`{}`), "")
	f.Add(good, "umami", "", now, "application/json", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", "", "application/json", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", "2025-03-04T05:06:07", "application/json", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", now, "", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", now, "text/plain", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", now, "application/json; charset", []byte(`{}`), "")
	f.Add(good, "umami", "anchor", now, "application/json", []byte(`not json`), "")
	f.Add(good, "umami", "anchor", now, "application/json", []byte(``), "")
	f.Add(good, "umami", "anchor", now, "application/json", []byte(`{"a":`), "")
	f.Add(good, "umami", "anchor", now, "application/json", []byte("\xff"), "\xff")
	f.Fuzz(func(t *testing.T, id, source, node, ts, contentType string, body []byte, extra string) {
		headers := map[string]any{
			HeaderEventID: id,
			HeaderSource:  source,
			HeaderNode:    node,
			HeaderTime:    ts,
			"x-extra":     extra,
			"x-bytes":     []byte(extra),
			"traceparent": extra,
		}
		check := func(m Meta, err error) {
			t.Helper()
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("DecodeMeta error %v does not wrap ErrMalformed", err)
				}
				var me *MalformedError
				if !errors.As(err, &me) || me.Reason == "" {
					t.Fatalf("DecodeMeta error %T %v is not a *MalformedError with a reason", err, err)
				}
				return
			}
			if _, perr := ulid.ParseStrict(m.ID); perr != nil {
				t.Fatalf("accepted id %q, which is not a ULID: %v", m.ID, perr)
			}
			if m.ID != id {
				t.Fatalf("ID = %q, want %q", m.ID, id)
			}
			if m.Source == "" || m.Node == "" {
				t.Fatalf("accepted empty source %q or node %q", m.Source, m.Node)
			}
			if m.Source != source || m.Node != node {
				t.Fatalf("Source, Node = %q, %q, want %q, %q", m.Source, m.Node, source, node)
			}
			if !json.Valid(body) {
				t.Fatalf("accepted body %q, which is not JSON", body)
			}
			if m.Time.Location() != time.UTC {
				t.Fatalf("Time %v is not in UTC", m.Time)
			}
			if pt, perr := time.Parse(time.RFC3339Nano, ts); perr != nil || !pt.Equal(m.Time) {
				t.Fatalf("Time = %v from %q (%v)", m.Time, ts, perr)
			}
			if m.Extra["x-extra"] != extra || m.Extra["x-bytes"] != extra {
				t.Fatalf("Extra = %q, want x-extra and x-bytes = %q", m.Extra, extra)
			}
			if _, ok := m.Extra["traceparent"]; ok {
				t.Fatalf("traceparent in Extra")
			}
		}
		check(DecodeMeta(headers, contentType, body))

		// The same values as byte strings decode the same way.
		bheaders := map[string]any{
			HeaderEventID: []byte(id),
			HeaderSource:  []byte(source),
			HeaderNode:    []byte(node),
			HeaderTime:    []byte(ts),
			"x-extra":     extra,
			"x-bytes":     []byte(extra),
		}
		m1, err1 := DecodeMeta(headers, contentType, body)
		m2, err2 := DecodeMeta(bheaders, contentType, body)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("string headers: %v; byte headers: %v", err1, err2)
		}
		if err1 == nil && (m1.ID != m2.ID || m1.Source != m2.Source || m1.Node != m2.Node || !m1.Time.Equal(m2.Time)) {
			t.Fatalf("string and byte headers decode differently: %+v vs %+v", m1, m2)
		}
		check(m2, err2)

		// The extra value in a header the decoder reads must never panic.
		for _, k := range []string{HeaderCausationID, HeaderSchema, HeaderRoutingKey, HeaderAttempt} {
			h := map[string]any{
				HeaderEventID: id, HeaderSource: source, HeaderNode: node, HeaderTime: ts,
				k: extra,
			}
			m, err := DecodeMeta(h, contentType, body)
			if k == HeaderAttempt && err == nil {
				t.Fatalf("accepted string x-mesh-attempt %q", extra)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeMeta error %v does not wrap ErrMalformed", err)
			}
			if err == nil && k == HeaderCausationID && m.CausationID != extra {
				t.Fatalf("CausationID = %q, want %q", m.CausationID, extra)
			}
		}
	})
}

// refMatch is an independent reference for RabbitMQ topic matching: both
// strings are split on '.', an empty string being zero words (as RabbitMQ's
// split_topic_key does); each key word is written with a terminating '.', and
// the pattern becomes a regular expression in which a word is itself, '*' is
// one word and '#' is any number of words.
func refMatch(pattern, key string) bool {
	var re strings.Builder
	re.WriteString(`\A`)
	if pattern != "" {
		for _, w := range strings.Split(pattern, ".") {
			switch w {
			case "*":
				re.WriteString(`[^.]*\.`)
			case "#":
				re.WriteString(`(?:[^.]*\.)*`)
			default:
				re.WriteString(regexp.QuoteMeta(w) + `\.`)
			}
		}
	}
	re.WriteString(`\z`)
	subject := ""
	if key != "" {
		subject = key + "."
	}
	return regexp.MustCompile(re.String()).MatchString(subject)
}

// keyLike reports whether key passes the word rules of an event type (any
// number of words, any first word).
func keyLike(key string) bool {
	if checkLength("key", key) != nil {
		return false
	}
	for i, w := range strings.Split(key, ".") {
		if checkWord("key", key, w, i) != nil {
			return false
		}
	}
	return true
}

func TestRefMatchSanity(t *testing.T) {
	for _, tc := range []struct {
		p, k string
		want bool
	}{
		{"#", "", true},
		{"*.#", "", false},
		{"a.#.c", "a.c", true},
		{"a.#.c", "a.b", false},
		{"a.*", "a.b.c", false},
		{"a.*.b", "a..b", true},
		{"a+b", "aab", false},
	} {
		if got := refMatch(tc.p, tc.k); got != tc.want {
			t.Errorf("refMatch(%q, %q) = %v, want %v", tc.p, tc.k, got, tc.want)
		}
	}
}

// TestMatchPatternExhaustive compares MatchPattern with refMatch on every
// pattern of up to five words over {a, b, *, #} and every key of up to five
// words over {a, b}.
func TestMatchPatternExhaustive(t *testing.T) {
	gen := func(alphabet []string, maxWords int) []string {
		out := []string{}
		level := []string{""}
		for n := 1; n <= maxWords; n++ {
			var next []string
			for _, prefix := range level {
				for _, w := range alphabet {
					s := w
					if prefix != "" {
						s = prefix + "." + w
					}
					next = append(next, s)
				}
			}
			out = append(out, next...)
			level = next
		}
		return out
	}
	patterns := gen([]string{"a", "b", "*", "#"}, 5)
	keys := gen([]string{"a", "b"}, 5)
	for _, p := range patterns {
		for _, k := range keys {
			if got, want := MatchPattern(p, k), refMatch(p, k); got != want {
				t.Errorf("MatchPattern(%q, %q) = %v, want %v", p, k, got, want)
			}
		}
	}
}

func FuzzMatchPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"#", "a"},
		{"a.*", "a.b"},
		{"a.*", "a.b.c"},
		{"a.#", "a"},
		{"#.c", "a.b.c"},
		{"a.#.c", "a.b.d.c"},
		{"a.#.c", "a.b"},
		{"*.#.*", "a"},
		{"#.*.#.*.#", "a.b.c"},
		{"module.umami.#", "module.umami.site.created"},
		{"node.*.joined", "node.anchor.joined"},
		{"module.#.created", "module.created"},
		{"#.a.#.a.#", "a.b.a.b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if ValidatePattern(pattern) != nil || !keyLike(key) {
			t.Skip()
		}
		if got, want := MatchPattern(pattern, key), refMatch(pattern, key); got != want {
			t.Fatalf("MatchPattern(%q, %q) = %v, want %v", pattern, key, got, want)
		}
	})
}

// FuzzValidateSubscription: a pattern it accepts matches some valid event
// type, and a valid pattern it refuses matches none of the types tried
// (each '*' and '#' filled with origins and plain words).
func FuzzValidateSubscription(f *testing.F) {
	for _, p := range []string{"#", "*", "*.*", "*.*.*", "#.created", "orders.placed", "module.x", "module.#", "mesh.*.#", "x.#.y", "#.#", "*.#.*"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, pattern string) {
		if ValidatePattern(pattern) != nil || strings.Count(pattern, "*")+strings.Count(pattern, "#") > 4 {
			t.Skip()
		}
		accepted := ValidateSubscription(pattern) == nil
		matched := ""
		for _, key := range witnesses(strings.Split(pattern, ".")) {
			if ValidateEventType(key) == nil && MatchPattern(pattern, key) {
				matched = key
				break
			}
		}
		if accepted && matched == "" {
			t.Fatalf("ValidateSubscription accepts %q, and no event type tried matches it", pattern)
		}
		if !accepted && matched != "" {
			t.Fatalf("ValidateSubscription refuses %q, which matches the event type %q", pattern, matched)
		}
	})
}

// witnesses are keys made from a pattern's words, each wildcard filled
// in every way of a few.
func witnesses(words []string) []string {
	fills := map[string][]string{"*": {"module", "x"}, "#": {"", "module", "x", "module.x", "x.x", "module.x.x"}}
	keys := []string{""}
	for _, w := range words {
		options, wild := fills[w]
		if !wild {
			options = []string{w}
		}
		var next []string
		for _, k := range keys {
			for _, o := range options {
				switch {
				case o == "":
					next = append(next, k)
				case k == "":
					next = append(next, o)
				default:
					next = append(next, k+"."+o)
				}
			}
		}
		keys = next
	}
	return keys
}

// FuzzValidateToolKey: a key it accepts makes a valid serve queue name and
// contains no pattern characters, whitespace or control characters.
func FuzzValidateToolKey(f *testing.F) {
	for _, s := range []string{"invoice.create", "audit", "a..b", "a.*", "x y", strings.Repeat("k", 249), strings.Repeat("k", 250), ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := ValidateToolKey(key)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if err := ValidateQueueName(ServeQueue(key)); err != nil {
			t.Fatalf("accepted key %q makes an invalid queue name: %v", key, err)
		}
		if strings.ContainsAny(key, "*# \t\n") || strings.Contains(key, "..") || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
			t.Fatalf("accepted key %q breaks a word rule", key)
		}
	})
}

// FuzzCheckKey: a key CheckKey accepts is at most MaxKeyBytes of UTF-8
// without control characters, one it refuses is refused with ErrInvalid,
// and every key has a slot in range whose header is a single word the
// headers exchange matches (no x- prefix).
func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"", "account-7", "a\nb", "\xff", strings.Repeat("k", MaxKeyBytes+1), "ключ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := CheckKey(key)
		ok := len(key) <= MaxKeyBytes && utf8.ValidString(key) && !strings.ContainsFunc(key, unicode.IsControl)
		switch {
		case err == nil && !ok:
			t.Fatalf("CheckKey(%q) accepted it", key)
		case err != nil && (ok || !errors.Is(err, ErrInvalid)):
			t.Fatalf("CheckKey(%q) = %v", key, err)
		}
		if s := Slot(key); s < 0 || s >= Slots {
			t.Fatalf("Slot(%q) = %d", key, s)
		}
		if h := SlotHeader(key); !strings.HasPrefix(h, SlotHeaderPrefix) || strings.HasPrefix(h, "x-") {
			t.Fatalf("SlotHeader(%q) = %q", key, h)
		}
	})
}
