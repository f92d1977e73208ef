package runtime_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestStopMidStreamLosesNothing: a module stopped while events stream in,
// with handlers still running, and loaded again: every event emitted is
// handled at least once; what was in flight at the stop either finished
// and was acked or went back to the queue.
func TestStopMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var mu sync.Mutex
	seen := make(map[int]int)
	var cut atomic.Int32
	var stalling atomic.Bool
	stalled := make(chan struct{}, 1)
	handler := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		var i int
		if err := ev.Decode(&i); err != nil {
			return sdk.Permanent(err)
		}
		work := time.After(2 * time.Millisecond)
		if stalling.Load() {
			work = nil // from now on, handlers run until the stop cuts them off
			select {
			case stalled <- struct{}{}:
			default:
			}
		}
		select {
		case <-work:
		case <-ctx.Done():
			cut.Add(1)
			return ctx.Err()
		}
		mu.Lock()
		seen[i]++
		mu.Unlock()
		return nil
	})
	mod := sdk.Module{Name: "steady", Emits: []string{"tick"}, Setup: func(m sdk.Mesh) error { return m.On("module.steady.#", handler) }}
	mc := runtime.ModuleConfig{Concurrency: 4, MaxAttempts: 10}
	m := load(t, n, mod, mc)

	const total = 400
	emitted := make(chan struct{})
	go func() {
		defer close(emitted)
		for i := range total {
			if _, err := m.Mesh().Emit(context.Background(), "tick", i); err != nil {
				t.Errorf("emit %d: %v", i, err)
				return
			}
		}
	}()
	// Stop while the stream is in full flow, with a short grace.
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= total/4 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stalling.Store(true)
	select { // a handler is in flight and will not finish by itself
	case <-stalled:
	case <-time.After(15 * time.Second):
		t.Fatal("no handler started after the stall began")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_ = m.Stop(ctx)
	cancel()
	stalling.Store(false)
	<-emitted
	load(t, n, mod, mc)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == total {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	var missing []int
	dups := 0
	for i := range total {
		switch c := seen[i]; {
		case c == 0:
			missing = append(missing, i)
		case c > 1:
			dups += c - 1
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d events lost after the stop: %v", len(missing), missing)
	}
	if cut.Load() == 0 {
		t.Error("the stop cut no handler off: the test did not stop mid-stream")
	}
	t.Logf("emitted %d, handled %d distinct, %d handled twice (at least once allows it), %d handlers cut off by the stop",
		total, len(seen), dups, cut.Load())
}
