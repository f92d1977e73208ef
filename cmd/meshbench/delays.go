package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// benchDelays measures delayed emits (ADR 32): their throughput beside
// plain emits from the same node and emitters, in alternating rounds, and
// their lateness (handled minus x-due) for delays of 1 s, 1 min and 1 h.
// The longer two are compressed: lateness comes from the levels an event
// waits in (each an expiry and a dead-lettering hop), not from their TTLs,
// so 1 min (60 s: 4 levels, 32+16+8+4) is measured with 15 s (4 levels,
// 8+4+2+1) and 1 h (3600 s: 5 levels, 2048+1024+512+16) with 31 s (5
// levels, 16+8+4+2+1).
func benchDelays(url string, o options) error {
	fmt.Println("\n== delayed emits (quorum delay levels, sdk.After) ==")
	state, err := os.MkdirTemp("", "meshbench-delays-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "bench", AMQPURL: url, StateDir: state, Delays: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	var late lateness
	if _, err := node.Load(ctx, sdk.Module{Name: "late", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.bench.delayed.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			late.saw(ev)
			return nil
		}))
	}}, runtime.ModuleConfig{Concurrency: 32}); err != nil {
		return err
	}
	defer func() { _ = deleteQueue(url, "bench.late.events") }()

	// Throughput: o.events delayed by 1 s against as many plain ones, from
	// o.meshPublishers emitters; nothing consumes the plain ones.
	n := min(o.events, 10_000)
	var plain, delayed []float64
	for range o.rounds {
		for _, d := range []time.Duration{0, time.Second} {
			start := time.Now()
			if err := emitN(ctx, node, o.meshPublishers, n, d); err != nil {
				return err
			}
			rate := float64(n) / time.Since(start).Seconds()
			if d == 0 {
				plain = append(plain, rate)
			} else {
				delayed = append(delayed, rate)
			}
		}
	}
	fmt.Printf("emit throughput: plain %.0f/s, delayed %.0f/s (%d events, %d emitters, median of %d rounds)\n",
		median(plain), median(delayed), n, o.meshPublishers, o.rounds)
	// A delayed emit costs the broker a topic match of a 29-word key against
	// up to 29 bindings more than a plain one (ADR 32): a third of a plain
	// emit is the floor.
	record("delayed emit / plain emit, throughput", pairedRatio(delayed, plain), 0.3, true, "")
	if err := late.await(ctx, o.rounds*n); err != nil {
		return err
	}
	burst := late.take()
	fmt.Printf("lateness of those %d (1 s, a burst): p50 %s, p99 %s\n", len(burst), ms(pct(burst, .5)), ms(pct(burst, .99)))

	// Lateness at a steady rate: each delay at 100/s for 5 s, at once.
	delays := []struct {
		name string
		d    time.Duration
	}{{"1 s", time.Second}, {"1 min (as 15 s)", 15 * time.Second}, {"1 h (as 31 s)", 31 * time.Second}}
	var wg sync.WaitGroup
	errs := make(chan error, len(delays))
	for _, dl := range delays {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for range 500 {
				<-tick.C
				if _, err := node.Emit(ctx, "bench", "mesh.bench.delayed."+fmt.Sprint(dl.d.Seconds()), json.RawMessage(body(0)), sdk.After(dl.d)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if err := late.await(ctx, len(delays)*500); err != nil {
		return err
	}
	byType := late.byType()
	for _, dl := range delays {
		xs := byType["mesh.bench.delayed."+fmt.Sprint(dl.d.Seconds())]
		p50, p99 := pct(xs, .5), pct(xs, .99)
		fmt.Printf("lateness of %s at 100/s: p50 %s, p99 %s (%d events)\n", dl.name, ms(p50), ms(p99), len(xs))
		record("delay lateness p99, "+dl.name, p99.Seconds()*1000, 250, false, "ms")
	}
	return nil
}

// emitN emits n events through node from emitters goroutines, delayed by
// d (0: plain), each waiting for its confirm.
func emitN(ctx context.Context, node *runtime.Node, emitters, n int, d time.Duration) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, emitters)
	eventType, opts := "mesh.bench.plain", []sdk.EmitOption(nil)
	if d > 0 {
		eventType, opts = "mesh.bench.delayed.burst", []sdk.EmitOption{sdk.After(d)}
	}
	for range emitters {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
				if _, err := node.Emit(ctx, "bench", eventType, json.RawMessage(body(i)), opts...); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// lateness collects how long after its x-due each delayed event was
// handled, by type.
type lateness struct {
	mu   sync.Mutex
	seen map[string][]time.Duration
	n    int
}

func (l *lateness) saw(ev sdk.Event) {
	due, err := time.Parse(time.RFC3339Nano, ev.Headers["x-due"])
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string][]time.Duration{}
	}
	l.seen[ev.Type] = append(l.seen[ev.Type], time.Since(due))
	l.n++
}

// await waits until n events were seen since the last take.
func (l *lateness) await(ctx context.Context, n int) error {
	for {
		l.mu.Lock()
		got := l.n
		l.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d delayed events came due in time", got, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// take returns every lateness seen and forgets them.
func (l *lateness) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []time.Duration
	for _, xs := range l.seen {
		all = append(all, xs...)
	}
	l.seen, l.n = nil, 0
	return all
}

func (l *lateness) byType() map[string][]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen
}

// pct is the p-th quantile of xs.
func pct(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(p*float64(len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
