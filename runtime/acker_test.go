package runtime_test

import (
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAcksLeaveNothingBehind: with acks coalesced, every handled event is
// acknowledged on the wire once the queue runs dry (the broker counts them
// all acknowledged, none ready or unacknowledged), and nothing comes back when the
// module is stopped and loaded again (no duplicate is seen).
func TestAcksLeaveNothingBehind(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "acks", nil)
	rec := newRecorder(nil)
	def := sdk.Module{Name: "acked", Setup: func(m sdk.Mesh) error { return m.On("mesh.acks.#", rec) }}
	m := load(t, n, def, runtime.ModuleConfig{})
	const events, emitters = 300, 15 // 300 is no multiple of the acks held before a flush (8)
	var wg sync.WaitGroup
	for i := range emitters {
		wg.Go(func() {
			for range events / emitters {
				if _, err := n.Emit(emitCtx(t), "test", "mesh.acks.one", i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for range events {
		rec.next(t)
	}
	waitFor(t, 60*time.Second, func() bool {
		ready, unacked, acked := brokertest.QueueCounts(t, url, "acks.acked.events")
		return ready == 0 && unacked == 0 && acked == events
	})
	stop(t, m)
	load(t, n, def, runtime.ModuleConfig{})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.acks.marker", 0); err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.Type != "mesh.acks.marker" {
		t.Errorf("after the restart the module got %s first, want the marker", ev.Type)
	}
	if d := n.Stats().Duplicates; d != 0 {
		t.Errorf("%d events delivered again after the restart", d)
	}
}
