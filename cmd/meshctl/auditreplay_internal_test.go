package main

import (
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

// FuzzReplayTarget: --target is mesh.events, or names a module queue that
// the broker would take; anything else is refused, naming the flag.
func FuzzReplayTarget(f *testing.F) {
	for _, s := range []string{"mesh.events", "anchor.billing", "anchor.billing.events", "a..b", "a b.c", "x", "a.b.c.d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		queue, err := replayTarget(s)
		if err != nil {
			if !strings.Contains(err.Error(), "--target") {
				t.Fatalf("%q: error %v does not name the flag", s, err)
			}
			return
		}
		if queue == "" {
			if s != "" && s != "mesh.events" {
				t.Fatalf("%q taken as mesh.events", s)
			}
			return
		}
		if err := wire.ValidateQueueName(queue); err != nil || !strings.HasSuffix(queue, ".events") || strings.Count(queue, ".") != 2 {
			t.Fatalf("%q gave queue %q (%v)", s, queue, err)
		}
	})
}
