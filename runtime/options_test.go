package runtime_test

import (
	"slices"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestPriority: a classic queue declared with a maximum priority delivers
// the waiting events highest priority first; a quorum queue accepts the
// priority and keeps publication order.
func TestPriority(t *testing.T) {
	t.Parallel()
	cases := []struct {
		queueType   string
		maxPriority int
		want        []int
	}{
		{runtime.QueueClassic, 9, []int{9, 5, 1}},
		{runtime.QueueQuorum, 0, []int{1, 9, 5}},
	}
	for _, c := range cases {
		t.Run(c.queueType, func(t *testing.T) {
			t.Parallel()
			n := testNode(t, "", "anchor", nil)
			rec := newRecorder(nil)
			mod := sdk.Module{Name: "prio", Setup: func(m sdk.Mesh) error { return m.On("module.prio.#", rec) }}
			mc := runtime.ModuleConfig{QueueType: c.queueType, MaxPriority: c.maxPriority}
			m := load(t, n, mod, mc)
			stop(t, m) // the queue and its binding stay; events wait in it
			for _, p := range []int{1, 9, 5} {
				if _, err := n.Emit(emitCtx(t), "prio", "module.prio.job", p, sdk.WithPriority(uint8(p))); err != nil {
					t.Fatal(err)
				}
			}
			load(t, n, mod, mc)
			var got []int
			for range 3 {
				var p int
				if err := rec.next(t).Decode(&p); err != nil {
					t.Fatal(err)
				}
				got = append(got, p)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("handled in order %v, want %v", got, c.want)
			}
		})
	}
}

// TestTTL: an event still waiting in a queue when its time to live runs out
// is not handled; the broker sets it aside in the dead letters as expired.
func TestTTL(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	rec := newRecorder(nil)
	mod := sdk.Module{Name: "ttl", Setup: func(m sdk.Mesh) error { return m.On("module.ttl.#", rec) }}
	stop(t, load(t, n, mod, runtime.ModuleConfig{}))
	id, err := n.Emit(emitCtx(t), "ttl", "module.ttl.offer", 1, sdk.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	d := nextDead(t, rawConn(t, url))
	if d.MessageId != id || d.Headers["x-first-death-reason"] != "expired" {
		t.Errorf("dead letter %s: %v", d.MessageId, d.Headers)
	}
	load(t, n, mod, runtime.ModuleConfig{})
	if _, err := n.Emit(emitCtx(t), "ttl", "module.ttl.fresh", 2); err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.Type != "module.ttl.fresh" {
		t.Errorf("handled %s, want only the fresh event", ev.Type)
	}
}
