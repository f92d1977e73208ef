package runtime

import (
	"slices"
	"testing"
)

// TestBrokerOrder: a node tries the addresses in their configured order
// from a random place, wrapping around, so each start gives every address
// once and the nodes of a mesh start spread over them.
func TestBrokerOrder(t *testing.T) {
	urls := []string{"a", "b", "c"}
	firsts := map[string]bool{}
	for k := range urls {
		got := brokerOrder(urls, func(n int) int {
			if n != len(urls) {
				t.Fatalf("asked for a place among %d, want %d", n, len(urls))
			}
			return k
		})
		want := append(slices.Clone(urls[k:]), urls[:k]...)
		if !slices.Equal(got, want) {
			t.Errorf("start %d: order %q, want %q", k, got, want)
		}
		firsts[got[0]] = true
	}
	if len(firsts) != len(urls) {
		t.Errorf("the orders start with %v only", firsts)
	}
	if got := brokerOrder([]string{"only"}, func(int) int { return 0 }); !slices.Equal(got, []string{"only"}) {
		t.Errorf("one address: %q", got)
	}
	if !slices.Equal(urls, []string{"a", "b", "c"}) {
		t.Errorf("the configured list changed: %q", urls)
	}
}
