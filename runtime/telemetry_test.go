package runtime_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestMetrics: a node's OpenTelemetry metrics count, per module and
// origin (the emitter's x-source, "outside" for a message without one),
// what its handlers were delivered, took, failed and gave up on, and per
// module what it emitted; the latency
// histograms record each handler run by outcome, each call by tool and
// outcome, and each first delivery's time in the queue; the node's gauges
// say it is connected.
func TestMetrics(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	reader := sdkmetric.NewManualReader()
	n := testNode(t, url, "metered", func(c *runtime.Config) {
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	rec := newRecorder(func(ev sdk.Event) error {
		switch {
		case ev.Type == "mesh.metered.bad":
			return sdk.Permanent(errors.New("never"))
		case ev.Type == "mesh.metered.retry" && ev.Attempt == 1:
			return errors.New("not yet")
		}
		return nil
	})
	m := load(t, n, sdk.Module{Name: "meter", Emits: []string{"said"}, Setup: func(m sdk.Mesh) error {
		return errors.Join(m.On("mesh.metered.#", rec),
			m.Serve("meter.echo", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return r.Body, nil })))
	}}, runtime.ModuleConfig{})
	for _, typ := range []string{"mesh.metered.good", "mesh.metered.bad"} {
		if _, err := n.Emit(emitCtx(t), "test", typ, 1); err != nil {
			t.Fatal(err)
		}
		rec.next(t)
	}
	if _, err := n.Emit(emitCtx(t), "elsewhere", "mesh.metered.retry", 1); err != nil {
		t.Fatal(err)
	}
	rec.next(t)
	rec.next(t)
	// A message without the contract's headers: dead-lettered as
	// malformed before any handler, from no origin the mesh knows.
	raw := rawConn(t, url)
	if err := raw.Publish("mesh.events", "mesh.metered.raw", false, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Mesh().Emit(emitCtx(t), "said", 1); err != nil {
		t.Fatal(err)
	}
	var out int
	if err := n.Call(emitCtx(t), "test", "meter.echo", 7, &out); err != nil || out != 7 {
		t.Fatalf("call: %d, %v", out, err)
	}
	if err := n.Call(emitCtx(t), "test", "nobody.home", 7, &out); !errors.Is(err, sdk.ErrNoServer) {
		t.Fatalf("call nobody.home: %v", err)
	}
	// The node counts an event as dead-lettered once the broker confirmed
	// its dead letter, after the handler ran.
	waitFor(t, 10*time.Second, func() bool { st := n.Stats(); return st.DeadLettered == 2 && st.Handled == 2 })

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	histograms := map[string]uint64{}
	key := func(name string, attrs attribute.Set) string {
		s := name
		for _, kv := range attrs.ToSlice() {
			s += " " + string(kv.Key) + "=" + kv.Value.Emit()
		}
		return s
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[key(mt.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					sums[key(mt.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					histograms[key(mt.Name, p.Attributes)] = p.Count
				}
			}
		}
	}
	for k, want := range map[string]int64{
		"mesh.events.delivered module=meter origin=test":          2,
		"mesh.events.handled module=meter origin=test":            1,
		"mesh.handler.failures module=meter origin=test":          0, // a permanent error is dead-lettered at once
		"mesh.events.dead_lettered module=meter origin=test":      1,
		"mesh.events.delivered module=meter origin=elsewhere":     2,
		"mesh.events.handled module=meter origin=elsewhere":       1,
		"mesh.handler.failures module=meter origin=elsewhere":     1,
		"mesh.events.dead_lettered module=meter origin=elsewhere": 0,
		"mesh.events.delivered module=meter origin=outside":       1,
		"mesh.events.dead_lettered module=meter origin=outside":   1,
		"mesh.events.emitted module=meter":                        1,
		"mesh.connected":                                          1,
		"mesh.publish.blocked":                                    0,
	} {
		if got, ok := sums[k]; !ok || got != want {
			t.Errorf("%s = %d (reported %v), want %d", k, got, ok, want)
		}
	}
	for k, want := range map[string]uint64{
		"mesh.handler.duration module=meter outcome=ok":             2,
		"mesh.handler.duration module=meter outcome=error":          1,
		"mesh.handler.duration module=meter outcome=permanent":      1,
		"mesh.rpc.call.duration outcome=ok tool=meter.echo":         1,
		"mesh.rpc.call.duration outcome=no_server tool=nobody.home": 1,
		// First deliveries only: good, bad and retry's first; not its
		// retry, nor the raw message, which has no time.
		"mesh.delivery.time_in_queue module=meter": 3,
	} {
		if got := histograms[k]; got != want {
			t.Errorf("%s count %d, want %d (histograms: %v)", k, got, want, histograms)
		}
	}
}

// TestQueueMetrics: the node reports the events waiting in a module's
// queue (mesh.queue.depth) and its consumers, as it read them from the
// broker at its last look, and how long each event waited before the
// module took it (mesh.delivery.time_in_queue).
func TestQueueMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	looked := make(chan struct{}, 1)
	n := testNode(t, "", "depths", func(c *runtime.Config) {
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		c.HeartbeatInterval = 50 * time.Millisecond // how often it looks at its queues
	})
	n.SetTestHooks(runtime.TestHooks{LookedAt: func() {
		select {
		case looked <- struct{}{}:
		default:
		}
	}})
	// lookAgain returns once the node has looked at its queues in a look
	// that began after lookAgain was called: a signal already waiting is
	// dropped, the next may come from a look under way, the one after it
	// from a look that began after that one ended.
	lookAgain := func() {
		t.Helper()
		select {
		case <-looked:
		default:
		}
		for range 2 {
			select {
			case <-looked:
			case <-time.After(10 * time.Second):
				t.Fatal("the node does not look at its queues")
			}
		}
	}
	release := make(chan struct{})
	took := make(chan sdk.Event, 10)
	load(t, n, sdk.Module{Name: "waiter", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.waited.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			took <- ev
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	}}, runtime.ModuleConfig{Prefetch: 1, HandlerTimeout: time.Minute})
	const events = 4
	for range events {
		if _, err := n.Emit(emitCtx(t), "test", "mesh.waited.thing", 1); err != nil {
			t.Fatal(err)
		}
	}
	confirmed := time.Now() // every event is in the queue
	select {
	case <-took:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler took no event")
	}
	// One event is at the handler (prefetch 1); the others wait.
	lookAgain()
	gauges, _ := collect(t, reader)
	for k, want := range map[string]int64{"mesh.queue.depth module=waiter": events - 1, "mesh.queue.consumers module=waiter": 1} {
		if got, ok := gauges[k]; !ok || got != want {
			t.Errorf("%s = %d (reported %v), want %d", k, got, ok, want)
		}
	}
	held := time.Since(confirmed)
	close(release)
	for range events - 1 {
		select {
		case <-took:
		case <-time.After(15 * time.Second):
			t.Fatal("the handler took no more events")
		}
	}
	lookAgain()
	gauges, histograms := collect(t, reader)
	if got, ok := gauges["mesh.queue.depth module=waiter"]; !ok || got != 0 {
		t.Errorf("mesh.queue.depth module=waiter = %d (reported %v) once every event was taken, want 0", got, ok)
	}
	h, ok := histograms["mesh.delivery.time_in_queue module=waiter"]
	if !ok || h.Count != events {
		t.Fatalf("mesh.delivery.time_in_queue module=waiter: count %d (reported %v), want %d (histograms: %v)", h.Count, ok, events, histograms)
	}
	// The last event waited at least from its confirm until the first
	// handler let go.
	if longest, ok := h.Max.Value(); !ok || longest < held.Seconds() {
		t.Errorf("the longest time in the queue is %vs (known %v), want at least %vs", longest, ok, held.Seconds())
	}
}

// collect reads the metrics of reader: the values of the int64 sums and
// gauges, and the float64 histograms, by name and attributes ("name k=v
// k=v", the attributes sorted).
func collect(t *testing.T, reader *sdkmetric.ManualReader) (map[string]int64, map[string]metricdata.HistogramDataPoint[float64]) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	values := map[string]int64{}
	histograms := map[string]metricdata.HistogramDataPoint[float64]{}
	key := func(name string, attrs attribute.Set) string {
		s := name
		for _, kv := range attrs.ToSlice() {
			s += " " + string(kv.Key) + "=" + kv.Value.Emit()
		}
		return s
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					values[key(mt.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					values[key(mt.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					histograms[key(mt.Name, p.Attributes)] = p
				}
			}
		}
	}
	return values, histograms
}
