package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// The consuming side alone (issue 48, item 3): b.N events wait in a queue,
// then a consumer drains them, timed from its start to the last handled.
// "raw" is amqp091-go at its best for a consumer (prefetch 32, the body
// decoded, each delivery acked from the one goroutine that reads them);
// "mesh" is a module at concurrency 32 and prefetch 32 (what meshbench's
// goals run), "mesh-c1" one at its default concurrency, 1. Beside ns/op each reports cpu-µs/event: this process's
// user and system time over the drain, per event, which is the client's
// cost of consuming: go test -run '^$' -bench Drain -benchtime 20000x ./runtime

// drainBody is what each event carries: meshbench's 256-byte body.
var drainBody = benchBody

func BenchmarkDrain(b *testing.B) {
	for _, qt := range []string{runtime.QueueClassic, runtime.QueueQuorum} {
		b.Run(qt+"/raw", func(b *testing.B) { drainRaw(b, qt) })
		b.Run(qt+"/mesh", func(b *testing.B) { drainMesh(b, qt, runtime.DefaultPrefetch) })
		b.Run(qt+"/mesh-c1", func(b *testing.B) { drainMesh(b, qt, 1) })
	}
}

// processCPU is this process's user and system time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// syscalls is how many read and write system calls this process made so
// far (/proc/self/io: syscr, syscw), or zeros.
func syscalls() (reads, writes int) {
	b, _ := os.ReadFile("/proc/self/io")
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.Atoi(v)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// timeDrain times drain (which returns once every event is handled) and
// reports its CPU per event, and the read and write system calls per
// event (a read brings deliveries, a write sends acks: how many events
// each carries is what the broker and the client pay per event).
func timeDrain(b *testing.B, drain func()) {
	b.ReportAllocs()
	cpu0 := processCPU()
	r0, w0 := syscalls()
	b.ResetTimer()
	drain()
	b.StopTimer()
	r, w := syscalls()
	n := float64(b.N)
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/n, "cpu-µs/event")
	b.ReportMetric(float64(r-r0)/n, "reads/event")
	b.ReportMetric(float64(w-w0)/n, "writes/event")
}

// decodeDrainBody decodes what a drained event carries, as a handler
// would.
func decodeDrainBody(body []byte) error {
	var p struct {
		SentNanos int64 `json:"sent_ns"`
		Seq       int   `json:"seq"`
	}
	return json.Unmarshal(body, &p)
}

func drainRaw(b *testing.B, qt string) {
	ch := brokertest.Channel(b, brokertest.VHost(b))
	q, err := ch.QueueDeclare("raw.drain", true, false, false, false, amqp.Table{"x-queue-type": qt})
	if err != nil {
		b.Fatal(err)
	}
	fill(b, ch, "", q.Name)
	if err := ch.Qos(runtime.DefaultPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	timeDrain(b, func() {
		deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			d := <-deliveries
			if err := decodeDrainBody(d.Body); err != nil {
				b.Fatal(err)
			}
			if err := d.Ack(false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// fill publishes b.N events with the contract's headers to exchange with
// key, keeping 256 confirms in flight.
func fill(b *testing.B, ch *amqp.Channel, exchange, key string) {
	b.Helper()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var inFlight []*amqp.DeferredConfirmation
	for i := range b.N {
		now := time.Now().UTC()
		id := fmt.Sprintf("01K%023d", i) // a ULID's shape: 26 characters of Crockford's base32
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{
			Headers:      amqp.Table{"x-event-id": id, "x-source": "src", "x-node": "bench", "x-time": now.Format(time.RFC3339Nano)},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    id,
			Timestamp:    now,
			UserId:       "guest",
			Body:         drainBody,
		})
		if err != nil {
			b.Fatal(err)
		}
		if inFlight = append(inFlight, dc); len(inFlight) == 256 {
			for _, dc := range inFlight {
				if ok, err := dc.WaitContext(ctx); !ok || err != nil {
					b.Fatalf("fill: not confirmed: %v", err)
				}
			}
			inFlight = inFlight[:0]
		}
	}
	for _, dc := range inFlight {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			b.Fatalf("fill: not confirmed: %v", err)
		}
	}
}

// drainMesh drains the queue with a module handling concurrency events at
// once.
func drainMesh(b *testing.B, qt string, concurrency int) {
	url := brokertest.VHost(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "bench", AMQPURL: url, StateDir: b.TempDir(), Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close(context.Background())
	var handled atomic.Int64
	done := make(chan struct{})
	want := int64(b.N)
	def := sdk.Module{Name: "drain", Setup: func(m sdk.Mesh) error {
		return m.On("module.src.#", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error {
			if err := decodeDrainBody(ev.Body); err != nil {
				return sdk.Permanent(err)
			}
			if handled.Add(1) == want {
				close(done)
			}
			return nil
		}))
	}}
	mc := runtime.ModuleConfig{QueueType: qt, Concurrency: concurrency}
	// Loaded once to declare its queue and bindings, stopped while the
	// queue fills, loaded again to drain it.
	m, err := n.Load(ctx, def, mc)
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	ch := brokertest.Channel(b, url)
	fill(b, ch, "mesh.events", "module.src.measured")
	timeDrain(b, func() {
		m, err := n.Load(ctx, def, mc)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Stop(context.Background())
		select {
		case <-done:
		case <-ctx.Done():
			b.Fatalf("handled %d of %d", handled.Load(), want)
		}
	})
}
