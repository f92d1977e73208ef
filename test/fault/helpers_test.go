//go:build fault || failover

package fault

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// summary is what every fault test reports in its last line.
type summary struct {
	emitted, confirmed, handled, duplicates, deadLettered, lost int
	extra                                                       string
}

func (s summary) report(t *testing.T) {
	t.Helper()
	line := fmt.Sprintf("summary %s: emitted=%d confirmed=%d handled=%d duplicates_suppressed=%d dead_lettered=%d lost=%d",
		t.Name(), s.emitted, s.confirmed, s.handled, s.duplicates, s.deadLettered, s.lost)
	if s.extra != "" {
		line += " (" + s.extra + ")"
	}
	fmt.Println(line)
	if s.lost != 0 {
		t.Errorf("lost %d events", s.lost)
	}
}

// rabbitmqctl runs the broker's control tool against the fault tests'
// private broker node (brokertest's MESH_TEST_RABBITMQ_NODE, set by
// TestMain), never the user's.
func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	if _, err := brokertest.CtlOutput(args...); err != nil {
		t.Fatal(err)
	}
}

// ensureBrokerRuns starts the broker application again when the test ends,
// whatever happened, and waits until it answers.
func ensureBrokerRuns(t *testing.T) {
	t.Cleanup(func() {
		_, _ = brokertest.CtlOutput("start_app")
		waitBroker(t)
	})
}

// waitBroker waits until the broker accepts an AMQP connection.
func waitBroker(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		conn, err := amqp.Dial("amqp://guest:guest@" + brokertest.Host() + "/")
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker does not answer: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newNode starts a node that reconnects fast.
func newNode(t *testing.T, url, name string, tweak func(*runtime.Config)) *runtime.Node {
	t.Helper()
	cfg := runtime.Config{
		Node: name, AMQPURL: url, StateDir: t.TempDir(), Logger: testLogger(),
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("new node: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return n
}

// idSet counts how many times each id was seen.
type idSet struct {
	mu  sync.Mutex
	ids map[string]int
}

func newIDSet() *idSet { return &idSet{ids: make(map[string]int)} }

func (s *idSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[id]++
}

func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *idSet) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

// overOnce is how many ids were seen more than once.
func (s *idSet) overOnce() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.ids {
		if c > 1 {
			n++
		}
	}
	return n
}

// missingFrom counts the ids of s that other never saw.
func (s *idSet) missingFrom(other *idSet) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	other.mu.Lock()
	defer other.mu.Unlock()
	n := 0
	for id := range s.ids {
		if other.ids[id] == 0 {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or limit passes; it reports whether
// cond held.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// stream emits tick events from a few goroutines until stopped.
type stream struct {
	attempts  atomic.Int64
	confirmed *idSet
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startStream(t *testing.T, mesh sdk.Mesh, workers int) *stream {
	s := &stream{confirmed: newIDSet(), stop: make(chan struct{})}
	for w := range workers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// The load is paced: one emit per worker every 2 ms at most.
			pace := time.NewTicker(2 * time.Millisecond)
			defer pace.Stop()
			for i := 0; ; i++ {
				select {
				case <-s.stop:
					return
				case <-pace.C:
				}
				s.attempts.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				id, err := mesh.Emit(ctx, "tick", map[string]int{"worker": w, "i": i})
				cancel()
				if err != nil {
					t.Errorf("emit: %v", err)
					return
				}
				s.confirmed.add(id)
			}
		}()
	}
	return s
}

func (s *stream) end() {
	close(s.stop)
	s.wg.Wait()
}

// sinkModule handles module.sink.tick by recording its id.
func sinkModule(handled *idSet) sdk.Module {
	return sdk.Module{Name: "sink", Emits: []string{"tick", "full", "nowhere"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.sink.tick", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled.add(ev.ID)
			return nil
		}))
	}}
}

// awaitHandledOnce waits until every event s confirmed was handled, and
// fails the test for any handled more than once.
func awaitHandledOnce(t *testing.T, s *stream, handled *idSet) {
	t.Helper()
	if !waitFor(2*time.Minute, func() bool { return handled.len() >= s.confirmed.len() }) {
		t.Errorf("handled %d of %d confirmed events within 2 min", handled.len(), s.confirmed.len())
	}
	if handled.overOnce() > 0 {
		t.Errorf("%d events reached the handler more than once", handled.overOnce())
	}
}
