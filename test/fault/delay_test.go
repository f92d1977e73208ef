//go:build fault || failover

package fault

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// delayedThrough schedules events with delays of 1 to 8 s on a node with
// delays on, runs fault while they wait, and checks that every scheduled
// event is handled, none before its delay, and prints the summary with
// how late they came. If fault returns a heal and not every event came
// within 30 s of the fault, heal runs (the broker node comes back) before
// the last wait, and the summary says so.
func delayedThrough(t *testing.T, url string, tweak func(*runtime.Config), events int, fault func(n *runtime.Node) (heal func())) {
	n := newNode(t, url, "delays", func(c *runtime.Config) {
		c.Delays = true
		if tweak != nil {
			tweak(c)
		}
	})
	handled := newIDSet()
	var mu sync.Mutex
	// Early and late are measured on this process's monotonic clock, from
	// the emit to the handling: the wall clock x-due is written in can be
	// stepped back by the machine's time sync (a make test run saw 39
	// events "early" by x-due with every lateness shifted by about half a
	// second), which says nothing about the cascade.
	dueAt := map[string]time.Time{}   // by event id: the emit's start plus its delay
	arrived := map[string]time.Time{} // by event id: the first handling
	early, late := 0, []time.Duration{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink := sdk.Module{Name: "sink", Emits: []string{"later"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.sink.later", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			now := time.Now()
			if _, err := time.Parse(time.RFC3339Nano, ev.Headers["x-due"]); err != nil {
				return sdk.Permanent(fmt.Errorf("a delayed event without x-due: %w", err))
			}
			mu.Lock()
			if handled.count(ev.ID) == 0 {
				arrived[ev.ID] = now
			}
			handled.add(ev.ID)
			mu.Unlock()
			return nil
		}))
	}}
	m, err := n.Load(ctx, sink, runtime.ModuleConfig{Prefetch: 64, Concurrency: 4, MaxAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	scheduled := newIDSet()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < events; i += 8 {
				d := time.Duration(1+i%8) * time.Second
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				start := time.Now()
				id, err := m.Mesh().Emit(ctx, "later", map[string]int{"i": i}, sdk.After(d), sdk.WithFreshID())
				cancel()
				if err != nil {
					t.Errorf("a delayed emit: %v", err)
					return
				}
				mu.Lock()
				dueAt[id] = start.Add(d)
				mu.Unlock()
				scheduled.add(id)
			}
		})
	}
	wg.Wait()
	heal := fault(n)
	healed := "no"
	all := func() bool { return handled.len() >= scheduled.len() }
	if heal != nil && !waitFor(30*time.Second, all) {
		t.Logf("%d of %d handled 30 s after the fault; the broker node comes back", handled.len(), scheduled.len())
		heal()
		healed = "yes"
	}
	if !waitFor(3*time.Minute, all) {
		t.Errorf("handled %d of %d scheduled events within 3 min", handled.len(), scheduled.len())
	}
	mu.Lock()
	defer mu.Unlock()
	for id, at := range arrived {
		due, ok := dueAt[id]
		if !ok {
			continue // not one this test scheduled
		}
		if at.Before(due) { // both monotonic: an elapsed time shorter than the delay
			early++
		}
		late = append(late, at.Sub(due))
	}
	if early > 0 {
		t.Errorf("%d events were handled before their delay", early)
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	pct := func(p float64) time.Duration {
		if len(late) == 0 {
			return 0
		}
		return late[int(p*float64(len(late)-1))].Round(time.Millisecond)
	}
	st := n.Stats()
	summary{
		emitted: events, confirmed: scheduled.len(), handled: handled.len(), duplicates: int(st.Duplicates),
		deadLettered: int(st.DeadLettered), lost: scheduled.missingFrom(handled),
		extra: fmt.Sprintf("scheduled=%d delivered by the mover=%d spooled=%d reconnects=%d early=%d lateness min=%v p50=%v p99=%v max=%v waited for the broker node to return=%s",
			st.Scheduled, st.DelaysDelivered, st.Spooled, st.Reconnects, early, pct(0), pct(0.5), pct(0.99), pct(1), healed),
	}.report(t)
}
