package runtime

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
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
