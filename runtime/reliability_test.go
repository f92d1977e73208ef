package runtime_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestNodeNameTaken: a second node with a running node's name is refused
// with an error naming the node; the lock is an exclusive queue (405 from
// any other connection); once the first node closes, the name is free.
func TestNodeNameTaken(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	first := testNode(t, url, "anchor", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(), Logger: testLogger()})
	if !errors.Is(err, runtime.ErrNodeTaken) || !strings.Contains(err.Error(), "node anchor") {
		t.Fatalf("second node anchor: %v, want ErrNodeTaken naming the node", err)
	}
	raw := rawConn(t, url)
	if _, err := raw.QueueDeclarePassive(wire.NodeLockQueue("anchor"), false, true, true, false, nil); !isAMQPCode(err, amqp.ResourceLocked) {
		t.Errorf("lock queue from another connection: %v, want 405", err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again := testNode(t, url, "anchor", nil)
	if !again.Connected() {
		t.Error("node not connected after the name was freed")
	}
}

// TestSpoolBackPressure: while the broker is unreachable emits are
// spooled until the spool is full; then they fail at once with
// ErrBackPressure and keep nothing. When the broker is back, every
// spooled event is delivered, in order, with its original id.
func TestSpoolBackPressure(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "anchor", func(c *runtime.Config) {
		c.SpoolMaxBytes = 8 << 10
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	})
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error { return m.On("mesh.spooled.#", rec) }}, runtime.ModuleConfig{})
	proxy.Down()
	waitFor(t, 10*time.Second, func() bool { return !n.Connected() })
	var ids []string
	var full error
	for i := range 1000 {
		id, err := n.Emit(emitCtx(t), "test", "mesh.spooled.tick", map[string]int{"i": i})
		if err != nil {
			full = err
			break
		}
		ids = append(ids, id)
	}
	if !errors.Is(full, wire.ErrBackPressure) {
		t.Fatalf("emits into a full spool: %v, want ErrBackPressure", full)
	}
	if len(ids) < 10 {
		t.Fatalf("only %d events were spooled before back-pressure", len(ids))
	}
	// "At once": the emit ends with ErrBackPressure, not with its
	// context's deadline (no wall-clock bound: this machine is shared).
	// Its body is larger than the one refused: a record a few bytes
	// smaller can fit in the room left (ids and times vary in length),
	// which made this check fail now and then with a body of "1".
	bigger := map[string]string{"pad": strings.Repeat("x", 200)}
	if _, err := n.Emit(emitCtx(t), "test", "mesh.spooled.tick", bigger); !errors.Is(err, wire.ErrBackPressure) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("emit into a full spool: %v, want ErrBackPressure at once", err)
	}
	if st := n.Stats(); st.SpoolEvents != len(ids) || st.BackPressure < 2 {
		t.Errorf("stats %+v, want %d spooled and back-pressure counted", st, len(ids))
	}
	proxy.Up()
	for i, id := range ids {
		if ev := rec.next(t); ev.ID != id {
			t.Fatalf("event %d: got id %s, want %s (in emit order)", i, ev.ID, id)
		}
	}
	waitFor(t, 10*time.Second, func() bool { return n.Stats().SpoolEvents == 0 })
	if _, err := n.Emit(emitCtx(t), "test", "mesh.spooled.tick", 1); err != nil {
		t.Errorf("emit after the spool drained: %v", err)
	}
}

// TestDuplicatesReachTheHandlerOnce: the same event (same x-event-id)
// published three times reaches a handler once, also after the node
// restarts with the same state dir; a handler marked AllowDuplicates
// sees every copy.
func TestDuplicatesReachTheHandlerOnce(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	state := t.TempDir()
	setState := func(c *runtime.Config) { c.StateDir = state }
	n := testNode(t, url, "anchor", setState)
	once, every := newRecorder(nil), newRecorder(nil)
	def := sdk.Module{Name: "idem", Setup: func(m sdk.Mesh) error {
		if err := m.On("mesh.once.#", once); err != nil {
			return err
		}
		return m.On("mesh.every.#", every, sdk.AllowDuplicates())
	}}
	load(t, n, def, runtime.ModuleConfig{})
	raw := rawConn(t, url)
	publish := func(key, id string) {
		t.Helper()
		err := raw.PublishWithContext(emitCtx(t), wire.ExchangeEvents, key, false, false, amqp.Publishing{
			Headers:     amqp.Table{"x-event-id": id, "x-source": "test", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(`{}`),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := ulid.Make().String(), ulid.Make().String()
	for range 3 {
		publish("mesh.once.x", a)
		publish("mesh.every.x", b)
	}
	publish("mesh.once.x", ulid.Make().String()) // a marker: everything before it was handled
	for range 2 {
		if ev := once.next(t); ev.ID != a && once.count() == 1 {
			t.Fatalf("first event %s, want %s", ev.ID, a)
		}
	}
	for range 3 {
		if ev := every.next(t); ev.ID != b {
			t.Fatalf("got %s, want %s", ev.ID, b)
		}
	}
	if got := once.count(); got != 2 {
		t.Errorf("de-duplicated handler ran %d times, want 2 (the event once, the marker once)", got)
	}
	if st := n.Stats(); st.Duplicates != 2 {
		t.Errorf("duplicates suppressed = %d, want 2", st.Duplicates)
	}

	// The record survives a restart of the node on the same state dir.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	n2 := testNode(t, url, "anchor", setState)
	again := newRecorder(nil)
	load(t, n2, sdk.Module{Name: "idem", Setup: func(m sdk.Mesh) error {
		if err := m.On("mesh.once.#", again); err != nil {
			return err
		}
		return m.On("mesh.every.#", every, sdk.AllowDuplicates())
	}}, runtime.ModuleConfig{})
	publish("mesh.once.x", a)
	marker := ulid.Make().String()
	publish("mesh.once.x", marker)
	if ev := again.next(t); ev.ID != marker {
		t.Errorf("after a restart the handler got %s, want only the marker %s", ev.ID, marker)
	}
	if st := n2.Stats(); st.Duplicates != 1 {
		t.Errorf("duplicates suppressed after the restart = %d, want 1", st.Duplicates)
	}
}

// TestConsumerTimeoutChecked: a handler timeout that, with the handler
// runs a delivery can wait through (prefetch / concurrency) and the retry
// back-off, could hold a delivery past the broker's consumer timeout is
// refused with an error naming the settings.
func TestConsumerTimeoutChecked(t *testing.T) {
	t.Parallel()
	err := runtime.Config{Node: "x", Module: runtime.ModuleConfig{HandlerTimeout: 30 * time.Minute}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "handler_timeout") || !strings.Contains(err.Error(), "consumer_timeout") {
		t.Errorf("handler_timeout 30m: %v, want an error naming handler_timeout and consumer_timeout", err)
	}
	if err := (runtime.Config{Node: "x", ConsumerTimeout: 2 * time.Hour, Module: runtime.ModuleConfig{HandlerTimeout: time.Hour, Prefetch: 4, Concurrency: 4}}).Validate(); err != nil {
		t.Errorf("handler_timeout 1h, one run at a time, with consumer_timeout 2h: %v", err)
	}
	cfg := runtime.Config{Node: "x"}
	if err := cfg.CheckConsumerTimeout(runtime.ModuleConfig{HandlerTimeout: 29*time.Minute + 31*time.Second, Prefetch: 1}, true); err == nil {
		t.Error("29m31s + retry_max 30s accepted under a 30 min consumer timeout")
	}
	// The default prefetch 32 at concurrency 1: 32 runs of 30s fit in 30
	// min, of 60s do not; concurrency 4 brings them to 8 runs.
	if err := cfg.CheckConsumerTimeout(runtime.ModuleConfig{}, true); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	err = cfg.CheckConsumerTimeout(runtime.ModuleConfig{HandlerTimeout: time.Minute}, true)
	if err == nil || !strings.Contains(err.Error(), "32 handler runs") || !strings.Contains(err.Error(), "concurrency") {
		t.Errorf("handler_timeout 1m behind prefetch 32: %v, want a refusal naming the runs", err)
	}
	if err := cfg.CheckConsumerTimeout(runtime.ModuleConfig{HandlerTimeout: time.Minute, Concurrency: 4}, true); err != nil {
		t.Errorf("handler_timeout 1m, concurrency 4: %v", err)
	}
	if err := cfg.CheckConsumerTimeout(runtime.ModuleConfig{HandlerTimeout: time.Minute}, false); err != nil {
		t.Errorf("handler_timeout 1m serving tools only: %v", err)
	}
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Load(ctx, sdk.Module{Name: "slow"}, runtime.ModuleConfig{HandlerTimeout: time.Hour}); err == nil || !strings.Contains(err.Error(), "consumer_timeout") {
		t.Errorf("loading a module with handler_timeout 1h: %v, want the consumer timeout refusal", err)
	}
}

// TestTLS: the node connects over amqps:// to a local TLS listener (a proxy
// that terminates TLS in front of the broker) when tls.ca_file is the CA
// that signed its certificate, and is refused with a clear error when it is
// not.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, other := brokertest.NewCA(t, "mesh test CA"), brokertest.NewCA(t, "some other CA")
	serverCert := ca.ServerCert(t)
	caFile, otherFile := ca.File, other.File
	url := brokertest.VHost(t)
	proxy := brokertest.NewTLSProxy(t, serverCert)
	tlsURL := strings.Replace(strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "amqp://", "amqps://", 1)

	n := testNode(t, tlsURL, "anchor", func(c *runtime.Config) { c.TLS.CAFile = caFile })
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error { return m.On("mesh.tls.#", rec) }}, runtime.ModuleConfig{})
	id, err := n.Emit(emitCtx(t), "test", "mesh.tls.ping", 1)
	if err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.ID != id {
		t.Errorf("got %s, want %s", ev.ID, id)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = runtime.New(ctx, runtime.Config{Node: "wrong", AMQPURL: tlsURL, StateDir: t.TempDir(), Logger: testLogger(),
		TLS: runtime.TLSConfig{CAFile: otherFile}})
	if err == nil || !strings.Contains(err.Error(), "tls.ca_file") || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("wrong CA: %v, want a refusal that points at tls.ca_file", err)
	}
	if err != nil && strings.Contains(err.Error(), "guest@") {
		t.Errorf("the error shows the password: %v", err)
	}
	_, err = runtime.New(ctx, runtime.Config{Node: "wrong", AMQPURL: tlsURL, StateDir: t.TempDir(), Logger: testLogger(),
		TLS: runtime.TLSConfig{CAFile: filepath.Join(dir, "missing.pem")}})
	if err == nil || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Errorf("missing CA file: %v, want an error naming tls.ca_file", err)
	}
}

// signalHandler is a slog.Handler that closes seen the first time a
// record's message starts with prefix.
type signalHandler struct {
	prefix string
	once   *sync.Once
	seen   chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestRestartAfterACrashWaitsForItsLock: a node started on a state dir
// whose last run did not close (its running marker is there, as after a
// SIGKILL) finds its node lock still taken, as it is while the broker has
// not yet seen the dead run's connection go; it waits for the lock instead
// of failing, and starts once the lock is released. (A node whose last run
// closed fails at once: TestNodeNameTaken.)
func TestRestartAfterACrashWaitsForItsLock(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	holder := testNode(t, url, "anchor", nil)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "running"), []byte("12345\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waiting := signalHandler{prefix: "the node lock is taken", once: new(sync.Once), seen: make(chan struct{})}
	type result struct {
		n   *runtime.Node
		err error
	}
	started := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		n, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: dir, Logger: slog.New(waiting), LockWait: time.Minute,
			ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
		started <- result{n, err}
	}()
	select {
	case <-waiting.seen:
	case r := <-started:
		t.Fatalf("New returned at once (%v) instead of waiting for the lock of the run that did not close", r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := holder.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-started
	if r.err != nil {
		t.Fatalf("New after the lock was released: %v", r.err)
	}
	if err := r.n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "running")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the running marker is left after Close: %v", err)
	}
}
