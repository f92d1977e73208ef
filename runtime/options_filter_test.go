package runtime_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestFilteredEventsAreAcknowledgedAndCounted: events the handler's filter
// rejects are acknowledged (nothing is left in the queue once the module
// stops, checked with raw amqp091-go), counted in Stats and not
// dead-lettered; the handler sees only what the filter accepts, at its
// first attempt.
func TestFilteredEventsAreAcknowledgedAndCounted(t *testing.T) {
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	rec := newRecorder(nil)
	m := load(t, n, sdk.Module{Name: "picky", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.pick.#", rec, sdk.Filter("body.keep = true and source = 'test'"))
	}}, runtime.ModuleConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := n.Emit(ctx, "test", "mesh.pick.x", map[string]any{"keep": false, "i": i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.Emit(ctx, "other", "mesh.pick.x", map[string]any{"keep": true}); err != nil { // another source
		t.Fatal(err)
	}
	kept, err := n.Emit(ctx, "test", "mesh.pick.x", map[string]any{"keep": true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.ID != kept || ev.Attempt != 1 {
		t.Fatalf("the handler got %s at attempt %d first, want %s at 1", ev.ID, ev.Attempt, kept)
	}
	stop(t, m) // settles what was taken: what was not acked goes back to the queue
	if got := n.Stats().Filtered; got != 6 {
		t.Errorf("Stats().Filtered = %d, want 6", got)
	}
	if rec.count() != 1 {
		t.Errorf("the handler ran %d times, want once", rec.count())
	}
	raw := rawConn(t, url)
	for _, queue := range []string{wire.ModuleQueue("anchor", "picky"), wire.QueueDead} {
		q, err := raw.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != 0 {
			t.Errorf("%s holds %d messages, want 0", queue, q.Messages)
		}
	}
}

// TestServeAllowDuplicatesRunsARepeatedRequest: a retried handler's call
// repeats its request id; a tool served plainly answers the repeat from
// its stored answer (one run), one served with AllowDuplicates runs again.
func TestServeAllowDuplicatesRunsARepeatedRequest(t *testing.T) {
	n := testNode(t, "", "anchor", nil)
	var once, every atomic.Int32
	count := func(c *atomic.Int32) sdk.ToolHandler {
		return sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return c.Add(1), nil })
	}
	load(t, n, sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.Serve("dup.once", count(&once)), m.Serve("dup.every", count(&every), sdk.AllowDuplicates()))
	}}, runtime.ModuleConfig{})
	done := make(chan int, 4)
	load(t, n, sdk.Module{Name: "caller", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.call.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if err := errors.Join(m.Call(ctx, "dup.once", nil, nil), m.Call(ctx, "dup.every", nil, nil)); err != nil {
				return err
			}
			done <- ev.Attempt
			if ev.Attempt == 1 {
				return errors.New("fail the first attempt, after both calls")
			}
			return nil
		}))
	}}, runtime.ModuleConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.Emit(ctx, "test", "mesh.call.x", map[string]int{}); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 2; want++ {
		select {
		case a := <-done:
			if a != want {
				t.Fatalf("attempt %d, want %d", a, want)
			}
		case <-ctx.Done():
			t.Fatal("the handler's attempts did not come")
		}
	}
	if once.Load() != 1 || every.Load() != 2 {
		t.Errorf("dup.once ran %d times (want 1), dup.every %d (want 2)", once.Load(), every.Load())
	}
}

// TestFailingRunStopsTheModule: an in-process module whose Run fails
// stops consuming (checked with raw amqp091-go: its queue keeps what is
// emitted and has no consumer), says why in Err and in the node's
// readiness, and a module loaded again under its name clears it.
func TestFailingRunStopsTheModule(t *testing.T) {
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	fail := make(chan struct{})
	def := sdk.Module{Name: "fragile", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.fragile.#", newRecorder(nil))
	}, Run: func(ctx context.Context, m sdk.Mesh) error {
		select {
		case <-fail:
			return errors.New("lost its socket")
		case <-ctx.Done():
			return nil
		}
	}}
	m := load(t, n, def, runtime.ModuleConfig{})
	if err := n.Ready(); err != nil {
		t.Fatalf("ready before the failure: %v", err)
	}
	close(fail)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for m.Err() == nil { // set once the module has stopped
		select {
		case <-ctx.Done():
			t.Fatal("the module did not stop after its Run failed")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := m.Err(); !strings.Contains(err.Error(), "lost its socket") {
		t.Errorf("Err: %v", err)
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "module fragile stopped: its Run failed: lost its socket") {
		t.Errorf("Ready: %v", err)
	}
	if _, err := n.Emit(ctx, "test", "mesh.fragile.x", map[string]int{}); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, url)
	q, err := raw.QueueDeclarePassive(wire.ModuleQueue("anchor", "fragile"), true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Consumers != 0 || q.Messages != 1 {
		t.Errorf("the stopped module's queue: %d consumers, %d messages; want 0 and 1", q.Consumers, q.Messages)
	}
	def.Run = nil
	load(t, n, def, runtime.ModuleConfig{})
	if err := n.Ready(); err != nil {
		t.Errorf("ready after the module was loaded again: %v", err)
	}
}
