package runtime

import (
	"strings"
	"testing"
)

// TestCallerPatterns: what each form of a callers entry allows, and what
// is refused as malformed.
func TestCallerPatterns(t *testing.T) {
	billing := Caller{Node: "berlin", Module: "billing", User: "node-berlin"}
	for _, c := range []struct {
		pattern string
		caller  Caller
		want    bool
	}{
		{"billing", billing, true},
		{"berlin/billing", billing, true},
		{"paris/billing", billing, false},
		{"*/billing", billing, true},
		{"berlin/*", billing, true},
		{"*/*", billing, true},
		{"tax", billing, false},
		{"user:node-berlin", billing, true},
		{"user:node-paris", billing, false},
		{"user:node-berlin", Caller{Node: "berlin", Module: "billing"}, false}, // no verified user
		{"meshctl", Caller{Node: "ops", Module: "meshctl", User: "admin"}, true},
	} {
		if err := ValidateCallerPattern(c.pattern); err != nil {
			t.Errorf("%q refused: %v", c.pattern, err)
		}
		if got := c.caller.matches(c.pattern); got != c.want {
			t.Errorf("%q matches %v = %v, want %v", c.pattern, c.caller, got, c.want)
		}
	}
	for _, bad := range []string{"", "a b", "a.b", "user:", "user:a b", "a/b/c", "/x", "x/", "#", "billing.*"} {
		if err := ValidateCallerPattern(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCallersOf: the node config's entry wins over the module's default,
// the most specific tool pattern wins, and a tool neither names is open.
func TestCallersOf(t *testing.T) {
	configured := map[string][]string{"audit.*": {"berlin/reports"}, "audit.replayed": {"meshctl"}}
	defaults := map[string][]string{"audit.*": {"meshctl"}, "audit.#": {"nobody"}, "dispatcher.*": {"meshctl"}}
	for _, c := range []struct {
		tool    string
		want    []string
		limited bool
	}{
		{"audit.query", []string{"berlin/reports"}, true},
		{"audit.replayed", []string{"meshctl"}, true},
		{"audit.query.deep", []string{"nobody"}, true},
		{"dispatcher.pause", []string{"meshctl"}, true},
		{"tax.rate", nil, false},
	} {
		got, limited := callersOf(c.tool, configured, defaults)
		if limited != c.limited || len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
			t.Errorf("callersOf(%s) = %q %v, want %q %v", c.tool, got, limited, c.want, c.limited)
		}
	}
}

// FuzzCallerPattern: a pattern ValidateCallerPattern accepts is one of
// its three forms, and matching never panics; one it refuses matches no
// caller it could be mistaken for.
func FuzzCallerPattern(f *testing.F) {
	for _, s := range []string{"billing", "berlin/billing", "*/billing", "berlin/*", "user:ops", "user:", "a/b/c", "a b", "", "*"} {
		f.Add(s, "berlin", "billing", "ops")
	}
	f.Fuzz(func(t *testing.T, p, node, module, user string) {
		c := Caller{Node: node, Module: module, User: user}
		matched := c.matches(p)
		if err := ValidateCallerPattern(p); err != nil {
			return
		}
		switch rest, isUser := strings.CutPrefix(p, "user:"); {
		case isUser:
			if matched != (user != "" && user == rest) {
				t.Fatalf("%q matches %+v = %v", p, c, matched)
			}
		case strings.Count(p, "/") > 1:
			t.Fatalf("%q accepted with more than one /", p)
		}
	})
}
