package runtime

import (
	"context"
	"testing"
)

// TestEndedHandlingsAreBounded: a module's host knows its live handlings
// and the last keptEndedHandlings that ended, and forgets older ones.
func TestEndedHandlingsAreBounded(t *testing.T) {
	var hs handlings
	live, endLive := hs.begin(context.Background())
	var tokens []uint64
	for range keptEndedHandlings + 100 {
		token, end := hs.begin(context.Background())
		end()
		tokens = append(tokens, token)
	}
	if _, ok := hs.find(live); !ok {
		t.Error("a live handling is not found")
	}
	for i, token := range tokens {
		_, ok := hs.find(token)
		if want := i >= 100; ok != want {
			t.Fatalf("ended handling %d of %d found %v, want %v", i, len(tokens), ok, want)
		}
	}
	if len(hs.ended) != keptEndedHandlings || len(hs.live) != 1 {
		t.Errorf("%d ended and %d live handlings kept, want %d and 1", len(hs.ended), len(hs.live), keptEndedHandlings)
	}
	endLive()
	if _, ok := hs.find(live); !ok {
		t.Error("a handling just ended is not found")
	}
	if _, ok := hs.find(tokens[100]); ok {
		t.Error("the oldest ended handling is still known after one more ended")
	}
	if _, ok := hs.find(0); ok {
		t.Error("token 0 names a handling")
	}
}
