package nodeconfig

import (
	"regexp"
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

// TestPatternRegexpMatchesLikeTheBroker: the regular expression of a topic
// pattern matches exactly the keys the pattern matches (wire.MatchPattern,
// itself checked against the broker's binding semantics).
func TestPatternRegexpMatchesLikeTheBroker(t *testing.T) {
	patterns := []string{"#", "*", "a", "a.*", "a.#", "#.a", "a.#.b", "*.b.#", "#.#", "a.#.#.b", "#.*", "*.#.*", "a.b.c", "m1.*"}
	keys := []string{"a", "b", "a.b", "b.a", "a.b.c", "a.x.b", "a.x.y.b", "x.b.y", "x.b", "m1.echo", "m1.echo.x", "a.a", "c.a.b"}
	for _, p := range patterns {
		re := regexp.MustCompile("^(?:" + PatternRegexp(p) + ")$")
		for _, k := range keys {
			if got, want := re.MatchString(k), wire.MatchPattern(p, k); got != want {
				t.Errorf("pattern %q key %q: regexp %q says %v, the broker %v", p, k, PatternRegexp(p), got, want)
			}
		}
	}
}

// FuzzPatternRegexp: for any valid pattern and key, the regular
// expression agrees with wire.MatchPattern.
func FuzzPatternRegexp(f *testing.F) {
	f.Add("a.#.b", "a.x.b")
	f.Add("#.*", "a")
	f.Add("*.#", "a.b.c")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if wire.ValidatePattern(pattern) != nil || wire.ValidateEventType(key) != nil {
			return
		}
		re := regexp.MustCompile("^(?:" + PatternRegexp(pattern) + ")$")
		if got, want := re.MatchString(key), wire.MatchPattern(pattern, key); got != want {
			t.Errorf("pattern %q key %q: regexp %q says %v, the broker %v", pattern, key, PatternRegexp(pattern), got, want)
		}
	})
}
