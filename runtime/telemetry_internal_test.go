package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/meshkit/mesh/sdk"
)

// BenchmarkRecordHandler is what metrics add to each handler run with
// meshd's meter provider: one histogram record with a precomputed
// attribute set. (The counters cost nothing per event: they are read
// when metrics are collected.)
func BenchmarkRecordHandler(b *testing.B) {
	n := &Node{cfg: Config{Node: "bench", MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}}
	if err := n.startTelemetry(); err != nil {
		b.Fatal(err)
	}
	m := &Module{node: n, outcomeOpts: outcomeOptions("bench")}
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		m.recordHandler(start, outcomeOK)
	}
}

// BenchmarkRecordTimeInQueue is what the time in queue adds to each
// first delivery with meshd's meter provider: the clock read, a header
// looked up (x-due, absent) and one histogram record with a precomputed
// attribute set.
func BenchmarkRecordTimeInQueue(b *testing.B) {
	n := &Node{cfg: Config{Node: "bench", MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}}
	if err := n.startTelemetry(); err != nil {
		b.Fatal(err)
	}
	m := &Module{node: n, queueTimeOpt: metric.WithAttributeSet(attribute.NewSet(attribute.String("module", "bench")))}
	emitted := time.Now().Add(-time.Second).UTC()
	headers := amqp.Table{"x-event-id": "01J", "x-source": "a", "x-node": "n", "x-time": emitted.Format(time.RFC3339Nano)}
	b.ReportAllocs()
	for b.Loop() {
		m.recordTimeInQueue(emitted, headers)
	}
}

// TestTimeInQueue: a delivery's time in the queue runs from its event's
// time, or from its due time when that is later (a delayed event); an
// unknown time, or one further ahead than clocks differ, is not recorded,
// and one a little ahead counts as no wait.
func TestTimeInQueue(t *testing.T) {
	now := time.Now().UTC()
	rfc := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	for _, c := range []struct {
		name     string
		emitted  time.Time
		headers  amqp.Table
		recorded bool
		min      float64 // seconds; at most a minute more
	}{
		{"unknown", time.Time{}, nil, false, 0},
		{"an hour ahead", now.Add(time.Hour), nil, false, 0},
		{"a second ahead", now.Add(time.Second), nil, true, 0},
		{"waited 5s", now.Add(-5 * time.Second), nil, true, 5},
		{"delayed, due 2s ago", now.Add(-time.Hour), amqp.Table{"x-due": rfc(now.Add(-2 * time.Second))}, true, 2},
		{"due before its time", now.Add(-5 * time.Second), amqp.Table{"x-due": rfc(now.Add(-time.Hour))}, true, 5},
		{"a due time that is no time", now.Add(-5 * time.Second), amqp.Table{"x-due": "soon"}, true, 5},
	} {
		reader := sdkmetric.NewManualReader()
		n := &Node{cfg: Config{Node: "clock", MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}}
		if err := n.startTelemetry(); err != nil {
			t.Fatal(err)
		}
		m := &Module{node: n, queueTimeOpt: metric.WithAttributeSet(attribute.NewSet(attribute.String("module", "clock")))}
		m.recordTimeInQueue(c.emitted, c.headers)
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var points []metricdata.HistogramDataPoint[float64]
		for _, sm := range rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				if h, ok := mt.Data.(metricdata.Histogram[float64]); ok && mt.Name == "mesh.delivery.time_in_queue" {
					points = append(points, h.DataPoints...)
				}
			}
		}
		switch {
		case !c.recorded:
			if len(points) != 0 {
				t.Errorf("%s: recorded %v, want nothing", c.name, points)
			}
		case len(points) != 1 || points[0].Count != 1:
			t.Errorf("%s: recorded %v, want one", c.name, points)
		case points[0].Sum < c.min || points[0].Sum > c.min+60:
			t.Errorf("%s: %vs in the queue, want %vs or a little more", c.name, points[0].Sum, c.min)
		}
	}
}

// BenchmarkTracingOff is what tracing adds to an emit and a handling when
// it is off (no TracerProvider): the no-op spans and the checks for a
// trace context to pass on.
func BenchmarkTracingOff(b *testing.B) {
	n := &Node{cfg: Config{Node: "bench"}}
	n.startTracing()
	headers := amqp.Table{"x-event-id": "01J"}
	d := amqp.Delivery{Headers: headers, RoutingKey: "module.a.b", MessageId: "01J"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		pctx, span := n.startPublish(ctx, "module.a.b", "01J")
		injectTrace(pctx, headers)
		endSpan(span, nil)
		_, span = n.startProcess(ctx, d, "q", "module.a.b", "a")
		endSpan(span, nil)
	}
}

// TestOriginsAreBounded: a module's metrics name each valid x-source as
// its origin, a missing or invalid one as "outside", and, past maxOrigins
// distinct sources, every further one as "other", so a publisher
// inventing sources cannot grow them without bound.
func TestOriginsAreBounded(t *testing.T) {
	m := &Module{def: sdk.Module{Name: "shop"}, log: slog.New(slog.DiscardHandler)}
	origin := func(src any) string {
		d := amqp.Delivery{Headers: amqp.Table{}}
		if src != nil {
			d.Headers["x-source"] = src
		}
		c := m.from(d)
		c.delivered.Add(1)
		v, _ := c.attrs.Value("origin")
		if mod, _ := c.attrs.Value("module"); mod.AsString() != "shop" {
			t.Errorf("module attribute %q", mod.AsString())
		}
		return v.AsString()
	}
	for src, want := range map[any]string{"billing": "billing", nil: "outside", "": "outside", "a.b": "outside", 42: "outside"} {
		if got := origin(src); got != want {
			t.Errorf("x-source %v: origin %q, want %q", src, got, want)
		}
	}
	for i := range maxOrigins {
		origin(fmt.Sprintf("src%d", i))
	}
	if got := origin("late"); got != originOther {
		t.Errorf("past %d origins: %q", maxOrigins, got)
	}
	if got := origin("billing"); got != "billing" {
		t.Errorf("a known origin after the cap: %q", got)
	}
	n := 0
	m.counts.origins.Range(func(any, any) bool { n++; return true })
	if n != maxOrigins+1 {
		t.Errorf("%d origins kept, want %d and other", n, maxOrigins)
	}
}

// TestCachesAreBounded: a module calling ever new tool names grows
// neither the record options of call metrics nor the server checks past
// their bounds.
func TestCachesAreBounded(t *testing.T) {
	n := &Node{cfg: Config{Node: "bounded"}}
	if err := n.startTelemetry(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 * maxCallOpts {
		n.recordCall(time.Now(), fmt.Sprintf("tool.n%d", i), "ok")
	}
	kept := 0
	n.callOpts.Range(func(any, any) bool { kept++; return true })
	if kept > maxCallOpts || n.callOptsLen.Load() != int64(kept) {
		t.Errorf("%d call record options kept (counted %d), want at most %d", kept, n.callOptsLen.Load(), maxCallOpts)
	}

	c := &caller{served: map[string]time.Time{}, checked: map[string]serverCheck{}}
	now := time.Now()
	for i := range 3 * maxServerChecks {
		tool := fmt.Sprintf("tool.n%d", i)
		c.checked[tool] = serverCheck{at: now, served: true}
		c.served[tool] = now
		c.pruneChecks(now)
	}
	if len(c.checked) > maxServerChecks || len(c.served) > maxServerChecks {
		t.Errorf("%d checks and %d servers kept, want at most %d", len(c.checked), len(c.served), maxServerChecks)
	}
	// Fresh ones survive a prune that old ones make necessary.
	c = &caller{served: map[string]time.Time{}, checked: map[string]serverCheck{}}
	for i := range maxServerChecks {
		c.checked[fmt.Sprintf("old.n%d", i)] = serverCheck{at: now.Add(-time.Minute)}
	}
	c.checked["fresh.one"] = serverCheck{at: now, served: true}
	c.pruneChecks(now)
	if _, ok := c.checked["fresh.one"]; !ok || len(c.checked) != 1 {
		t.Errorf("after a prune: %d checks, fresh kept %v", len(c.checked), ok)
	}
}
