package runtime_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// The event path's allocations and CPU per event, on the real broker
// (issue 30, item 3): go test -run '^$' -bench 'Emit' -benchmem ./runtime.
// Throughput against raw amqp091-go is meshbench's; these say what one
// event costs the client, emit side and handling side.

// benchNode is a node in a virtual host of its own, closed at the end.
func benchNode(b *testing.B) *runtime.Node {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "bench", AMQPURL: brokertest.VHost(b), StateDir: b.TempDir(), Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

var benchBody = json.RawMessage(`{"sent_ns":1764800000000000000,"seq":1,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)

// BenchmarkEmit is a module's Emit from 64 goroutines, each waiting for
// its confirm, into a queue nobody consumes (the emit side alone).
func BenchmarkEmit(b *testing.B) {
	n := benchNode(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := n.Load(ctx, sdk.Module{Name: "emitter", Emits: []string{"measured"}}, runtime.ModuleConfig{})
	if err != nil {
		b.Fatal(err)
	}
	emitInParallel(b, m.Mesh())
}

// BenchmarkEmitAndHandle is Emit from 64 goroutines into a module that
// handles what it emits, de-duplicating (the default), until every event
// was handled: both sides of the path.
func BenchmarkEmitAndHandle(b *testing.B) {
	n := benchNode(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var handled, want int
	done := make(chan struct{})
	m, err := n.Load(ctx, sdk.Module{Name: "loop", Emits: []string{"measured"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.loop.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if handled++; handled == want {
				close(done)
			}
			return nil
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	want = b.N
	mu.Unlock()
	emitInParallel(b, m.Mesh())
	select {
	case <-done:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("handled %d of %d", handled, b.N)
	}
}

// emitInParallel times b.N emits of benchBody through mesh from 64
// goroutines (32 per core on this machine's 2), each waiting for its emit.
func emitInParallel(b *testing.B, mesh sdk.Mesh) {
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := mesh.Emit(context.Background(), "measured", benchBody); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
