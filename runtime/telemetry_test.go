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
// histograms record each handler run by outcome and each call by tool and
// outcome; the node's gauges say it is connected.
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
	} {
		if got := histograms[k]; got != want {
			t.Errorf("%s count %d, want %d (histograms: %v)", k, got, want, histograms)
		}
	}
}
