package runtime_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// testNode starts a node on a fresh virtual host (or on url if given) with
// fast retries, and closes it when the test ends.
func testNode(t *testing.T, url, name string, tweak func(*runtime.Config)) *runtime.Node {
	t.Helper()
	if url == "" {
		url = brokertest.VHost(t)
	}
	cfg := runtime.Config{
		Node:     name,
		AMQPURL:  url,
		StateDir: t.TempDir(),
		RetryMin: 5 * time.Millisecond,
		RetryMax: 20 * time.Millisecond,
		Logger:   testLogger(),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("new node: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
	})
	return n
}

func testLogger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// rawConn dials url with plain amqp091-go, to check the wire without our
// API.
func rawConn(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("raw channel: %v", err)
	}
	return ch
}

// vhostURL returns the URL of a node's virtual host (tests pass it in).
func load(t *testing.T, n *runtime.Node, def sdk.Module, mc runtime.ModuleConfig) *runtime.Module {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := n.Load(ctx, def, mc)
	if err != nil {
		t.Fatalf("load %s: %v", def.Name, err)
	}
	return m
}

func stop(t *testing.T, m *runtime.Module) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// recorder is a handler that records the events it sees and answers with
// fail(ev).
type recorder struct {
	mu     sync.Mutex
	events []sdk.Event
	seen   chan sdk.Event
	fail   func(sdk.Event) error
}

func newRecorder(fail func(sdk.Event) error) *recorder {
	return &recorder{seen: make(chan sdk.Event, 10000), fail: fail}
}

func (r *recorder) HandleEvent(ctx context.Context, ev sdk.Event) error {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	r.seen <- ev
	if r.fail != nil {
		return r.fail(ev)
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// next waits for the next event the handler sees.
func (r *recorder) next(t *testing.T) sdk.Event {
	t.Helper()
	return r.nextWithin(t, 15*time.Second)
}

// nextWithin waits up to limit for the next event the handler sees.
func (r *recorder) nextWithin(t *testing.T, limit time.Duration) sdk.Event {
	t.Helper()
	select {
	case ev := <-r.seen:
		return ev
	case <-time.After(limit):
		t.Fatalf("timed out after %v waiting for an event at the handler", limit)
		return sdk.Event{}
	}
}

// nextDead waits for the next message in the dead-letter queue, read with
// raw amqp091-go.
func nextDead(t *testing.T, ch *amqp.Channel) amqp.Delivery {
	t.Helper()
	return nextFrom(t, ch, wire.QueueDead)
}

func nextFrom(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if ok {
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for a message in %s", queue)
	return amqp.Delivery{}
}

// queueDepth returns the ready messages in queue (passive declare).
func queueDepth(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Messages
}

func isAMQPCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

func emitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// idSet counts how many times each event id was seen.
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

// len is how many distinct ids were seen.
func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// duplicates is how many ids were seen more than once.
func (s *idSet) duplicates() int {
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

// missingFrom returns the ids of s that other never saw.
func (s *idSet) missingFrom(other *idSet) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	other.mu.Lock()
	defer other.mu.Unlock()
	var missing []string
	for id := range s.ids {
		if other.ids[id] == 0 {
			missing = append(missing, id)
		}
	}
	return missing
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchQueue declares a server-named, exclusive queue on ch bound to
// mesh.events with each of keys, to read the wire with nextFrom.
func watchQueue(t *testing.T, ch *amqp.Channel, keys ...string) string {
	t.Helper()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := ch.QueueBind(q.Name, k, wire.ExchangeEvents, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return q.Name
}
