//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestBrokerAlarm: a memory alarm blocks every publishing connection.
// While it lasts the node keeps consuming (a backlog drains, acks flow),
// emits return within their deadline (spooled), the node says it is
// blocked; once it clears, everything emitted arrives and calls are
// answered. Lost 0.
func TestBrokerAlarm(t *testing.T) {
	url := brokertest.VHost(t)
	ensureBrokerRuns(t)
	was := brokertest.MemoryWatermark(t)
	restore := func() { _, _ = brokertest.CtlOutput("set_vm_memory_high_watermark", was) }
	restore()
	t.Cleanup(restore)
	n := newNode(t, url, "alarm", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	handled := newIDSet()
	sink := sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("module.feed.tick", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { handled.add(ev.ID); return nil })),
			m.Serve("alarm.echo", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return r.Body, nil })),
		)
	}}
	feed, err := n.Load(ctx, sdk.Module{Name: "feed", Emits: []string{"tick"}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := n.Load(ctx, sink, runtime.ModuleConfig{Prefetch: 64, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil { // its queue keeps what comes: a backlog
		t.Fatal(err)
	}
	confirmed := newIDSet()
	const backlog = 300
	for i := range backlog {
		id, err := feed.Mesh().Emit(ctx, "tick", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		confirmed.add(id)
	}

	// A call made before the alarm, answered during it: the reply waits
	// on the publishing connection, and must not stall the acks of the
	// consuming one.
	entered, release := make(chan struct{}), make(chan struct{})
	slow, err := n.Load(ctx, sdk.Module{Name: "slow", Setup: func(m sdk.Mesh) error {
		return m.Serve("alarm.slow", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
			close(entered)
			<-release
			return "late", nil
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop(context.Background())
	answered := make(chan error, 1)
	go func() {
		var got string
		err := n.Call(ctx, "test", "alarm.slow", nil, &got)
		if err == nil && got != "late" {
			err = fmt.Errorf("answered %q", got)
		}
		answered <- err
	}()
	<-entered

	rabbitmqctl(t, "set_vm_memory_high_watermark", "absolute", "1")
	// Whatever happens, the alarm ends within two minutes: a node that
	// stalls during it must fail this test, not hang it with the broker
	// left in alarm for every test after it.
	var forced atomic.Bool
	watchdog := time.AfterFunc(2*time.Minute, func() { forced.Store(true); restore() })
	defer watchdog.Stop()
	// The broker blocks a connection when it publishes: emits now, each
	// within its own deadline, until the node says it is blocked.
	var during, overran int
	for i := 0; !n.Blocked() || during < 50; i++ {
		ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		id, err := feed.Mesh().Emit(ectx, "tick", map[string]int{"during": i})
		cancel()
		if err != nil && !errors.Is(err, wire.ErrBackPressure) {
			t.Fatalf("emit during the alarm: %v (after %v)", err, time.Since(start))
		}
		if time.Since(start) > 5*time.Second {
			overran++
		}
		if err == nil {
			confirmed.add(id)
			during++
		}
		if i > 5000 {
			t.Fatal("the node never saw the broker block it")
		}
	}
	if overran > 0 {
		t.Errorf("%d emits overran their 5s deadline", overran)
	}
	close(release) // the reply is sent now, into the blocked connection
	// Consuming goes on: the backlog drains while the alarm lasts.
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	s, err = n.Load(lctx, sink, runtime.ModuleConfig{Prefetch: 64, Concurrency: 4})
	lcancel()
	if err != nil {
		t.Fatalf("loading a module during the alarm (its consuming connection must not be blocked): %v", err)
	}
	defer s.Stop(context.Background())
	if !waitFor(time.Minute, func() bool { return handled.len() >= backlog }) {
		t.Fatalf("%d of the %d events waiting before the alarm handled during it", handled.len(), backlog)
	}
	if !n.Blocked() {
		t.Fatal("the alarm cleared before the backlog drained: the test proves nothing")
	}
	blockedStats := n.Stats()

	watchdog.Stop()
	restore()
	if forced.Load() {
		t.Fatal("the alarm had to be cleared by the watchdog: the node stalled while it lasted")
	}
	if !waitFor(time.Minute, func() bool { return !n.Blocked() }) {
		t.Fatal("the node still blocked a minute after the alarm cleared")
	}
	if !waitFor(2*time.Minute, func() bool { return handled.len() >= confirmed.len() }) {
		t.Errorf("handled %d of %d after the alarm", handled.len(), confirmed.len())
	}
	if err := <-answered; err != nil {
		t.Errorf("the call answered during the alarm: %v", err)
	}
	var echo string
	if err := n.Call(ctx, "test", "alarm.echo", "after", &echo); err != nil || echo != "after" {
		t.Errorf("a call after the alarm: %q, %v", echo, err)
	}
	st := n.Stats()
	if handled.overOnce() > 0 {
		t.Errorf("%d events handled twice", handled.overOnce())
	}
	summary{emitted: confirmed.len(), confirmed: confirmed.len(), handled: handled.len(), duplicates: int(st.Duplicates),
		deadLettered: int(st.DeadLettered), lost: confirmed.missingFrom(handled),
		extra: fmt.Sprintf("backlog drained during the alarm=%d emitted during it=%d (spooled %d) blocks=%d", backlog, during, blockedStats.Spooled, st.Blocks)}.report(t)
}
