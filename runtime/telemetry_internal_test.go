package runtime

import (
	"testing"
	"time"

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
