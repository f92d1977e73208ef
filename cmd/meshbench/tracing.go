package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// discard is a span exporter that drops what it is given: the benchmark
// measures making and batching spans, not a collector.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// benchTracing measures the event path (first queue type) with tracing off
// (no TracerProvider: trace contexts are only passed on) and on (every
// emit and handling recorded, batched to an exporter that drops them), in
// alternating rounds, and prints the ratios.
func benchTracing(url string, o options) error {
	qt := strings.Split(o.queueTypes, ",")[0]
	fmt.Printf("\n== tracing (%s queues) ==\n", qt)
	var offTP, onTP, offCPU, onCPU []float64
	o.publishers = o.meshPublishers
	for r := 0; r < o.rounds; r++ {
		for _, on := range []bool{false, true} {
			var tp *sdktrace.TracerProvider
			if on {
				tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
			}
			tput, cpu, err := throughput(func(s *sink) (side, error) {
				if tp == nil {
					return newMeshWith(url, qt, s, nil)
				}
				return newMeshWith(url, qt, s, tp)
			}, o)
			if tp != nil {
				_ = tp.Shutdown(context.Background())
			}
			if err != nil {
				return err
			}
			us := float64(cpu) / float64(time.Microsecond)
			name := "off"
			if on {
				name, onTP, onCPU = "on", append(onTP, tput), append(onCPU, us)
			} else {
				offTP, offCPU = append(offTP, tput), append(offCPU, us)
			}
			fmt.Printf("round %d tracing %-3s  %8.0f events/s  client CPU %5.1f µs/event\n", r+1, name, tput, us)
		}
	}
	fmt.Printf("tracing on/off: throughput ratio %.2f, client CPU ratio %.2f (off: %.0f events/s, %.1f µs/event)\n",
		median(onTP)/median(offTP), median(onCPU)/median(offCPU), median(offTP), median(offCPU))
	return nil
}
