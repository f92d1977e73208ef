package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

var queueTypes = []string{runtime.QueueQuorum, runtime.QueueClassic}

// TestDeadLetterAfterLimit: a handler that always fails is tried exactly
// MaxAttempts times, then its event is in the dead letters with its
// original id, headers, body and routing key, the queue, the attempt count
// and the last error.
func TestDeadLetterAfterLimit(t *testing.T) {
	t.Parallel()
	for _, qt := range queueTypes {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			url := brokertest.VHost(t)
			n := testNode(t, url, "anchor", nil)
			var calls atomic.Int32
			rec := newRecorder(func(ev sdk.Event) error {
				return fmt.Errorf("boom %d", calls.Add(1))
			})
			m := load(t, n, sdk.Module{Name: "flaky", Emits: []string{"job.failed"}, Setup: func(m sdk.Mesh) error { return m.On("module.flaky.#", rec) }},
				runtime.ModuleConfig{QueueType: qt, MaxAttempts: 3})
			id, err := m.Mesh().Emit(emitCtx(t), "job.failed", map[string]string{"job": "x"}, sdk.WithSchema("1"))
			if err != nil {
				t.Fatal(err)
			}
			raw := rawConn(t, url)
			d := nextDead(t, raw)
			for i := 1; i <= 3; i++ {
				ev := rec.next(t)
				if ev.ID != id || ev.Attempt != i {
					t.Errorf("call %d: id %s attempt %d, want %s attempt %d", i, ev.ID, ev.Attempt, id, i)
				}
				if i > 1 && qt == runtime.QueueQuorum && !ev.Redelivered {
					t.Errorf("call %d: not marked redelivered", i)
				}
			}
			if got := calls.Load(); got != 3 {
				t.Errorf("handler called %d times, want exactly 3", got)
			}
			if d.RoutingKey != "module.flaky.job.failed" || d.Exchange != wire.ExchangeDead {
				t.Errorf("dead letter key %q exchange %q", d.RoutingKey, d.Exchange)
			}
			if d.Headers["x-event-id"] != id || d.MessageId != id || d.Headers["x-source"] != "flaky" || d.Headers["x-schema"] != "1" {
				t.Errorf("dead letter lost its identity: %v", d.Headers)
			}
			if string(d.Body) != `{"job":"x"}` || d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent {
				t.Errorf("dead letter body %s, content type %q, mode %d", d.Body, d.ContentType, d.DeliveryMode)
			}
			want := map[string]any{
				"x-mesh-dead-queue": "anchor.flaky.events", "x-mesh-dead-attempts": int64(3),
				"x-mesh-dead-reason": "delivery_limit", "x-mesh-dead-error": "boom 3",
			}
			for k, v := range want {
				if d.Headers[k] != v {
					t.Errorf("%s = %#v, want %#v", k, d.Headers[k], v)
				}
			}
			// Nothing is left to deliver and nothing more arrives.
			time.Sleep(200 * time.Millisecond)
			if got := calls.Load(); got != 3 {
				t.Errorf("handler called %d times after dead-lettering", got)
			}
			if depth := queueDepth(t, raw, wire.QueueDead); depth != 0 {
				t.Errorf("%d more dead letters", depth)
			}
		})
	}
}

// TestPermanentErrorDeadLettersAtOnce and a panic counts as an error.
func TestPermanentAndPanic(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var permanentCalls, panicCalls atomic.Int32
	m := load(t, n, sdk.Module{Name: "strict", Emits: []string{"bad", "panics"}, Setup: func(m sdk.Mesh) error {
		if err := m.On("module.strict.bad", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			permanentCalls.Add(1)
			return sdk.Permanent(errors.New("cannot parse order"))
		})); err != nil {
			return err
		}
		return m.On("module.strict.panics", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			panicCalls.Add(1)
			panic("nil map")
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 2})
	raw := rawConn(t, url)

	id, err := m.Mesh().Emit(emitCtx(t), "bad", 1)
	if err != nil {
		t.Fatal(err)
	}
	d := nextDead(t, raw)
	if d.MessageId != id || d.Headers["x-mesh-dead-reason"] != "permanent" || d.Headers["x-mesh-dead-attempts"] != int64(1) ||
		!strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), "cannot parse order") {
		t.Errorf("permanent dead letter: %v", d.Headers)
	}
	if got := permanentCalls.Load(); got != 1 {
		t.Errorf("permanent handler called %d times, want 1", got)
	}

	if _, err := m.Mesh().Emit(emitCtx(t), "panics", 1); err != nil {
		t.Fatal(err)
	}
	d = nextDead(t, raw)
	if d.Headers["x-mesh-dead-reason"] != "delivery_limit" || d.Headers["x-mesh-dead-attempts"] != int64(2) ||
		!regexp.MustCompile(`^handler panicked at runtime/failure_test\.go:[0-9]+: nil map$`).MatchString(fmt.Sprint(d.Headers["x-mesh-dead-error"])) {
		t.Errorf("panic dead letter: %v", d.Headers)
	}
	if got := panicCalls.Load(); got != 2 {
		t.Errorf("panicking handler called %d times, want 2", got)
	}
}

// TestMalformedMessagesAreDeadLettered publishes messages that break the
// contract with raw amqp091-go: each is dead-lettered with a reason, never
// reaches the handler, and good events behind them keep flowing.
func TestMalformedMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	for _, qt := range queueTypes {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			url := brokertest.VHost(t)
			n := testNode(t, url, "anchor", nil)
			rec := newRecorder(nil)
			load(t, n, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error { return m.On("mesh.test.#", rec) }},
				runtime.ModuleConfig{QueueType: qt})
			raw := rawConn(t, url)
			good := func() amqp.Publishing {
				return amqp.Publishing{
					Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "t", "x-node": "n",
						"x-time": time.Now().UTC().Format(time.RFC3339)},
					ContentType: "application/json", DeliveryMode: 2, Body: []byte(`{}`),
				}
			}
			cases := []struct {
				name   string
				mutate func(*amqp.Publishing)
				reason string
			}{
				{"no id", func(p *amqp.Publishing) { delete(p.Headers, "x-event-id") }, "x-event-id is missing"},
				{"id not ulid", func(p *amqp.Publishing) { p.Headers["x-event-id"] = "42" }, "not a ULID"},
				{"source int", func(p *amqp.Publishing) { p.Headers["x-source"] = int32(5) }, "x-source is int32"},
				{"no node", func(p *amqp.Publishing) { delete(p.Headers, "x-node") }, "x-node is missing"},
				{"bad time", func(p *amqp.Publishing) { p.Headers["x-time"] = "yesterday" }, "RFC 3339"},
				{"xml", func(p *amqp.Publishing) { p.ContentType = "application/xml" }, "content type"},
				{"not json", func(p *amqp.Publishing) { p.Body = []byte("<a/>") }, "not valid JSON"},
				{"no headers", func(p *amqp.Publishing) { p.Headers = nil }, "missing"},
			}
			for _, c := range cases {
				p := good()
				c.mutate(&p)
				p.MessageId = c.name
				if err := raw.PublishWithContext(emitCtx(t), "mesh.events", "mesh.test.bad", false, false, p); err != nil {
					t.Fatal(err)
				}
			}
			// A good one behind them.
			p := good()
			if err := raw.PublishWithContext(emitCtx(t), "mesh.events", "mesh.test.good", false, false, p); err != nil {
				t.Fatal(err)
			}
			if ev := rec.next(t); ev.Type != "mesh.test.good" {
				t.Errorf("handler got %s", ev.Type)
			}
			for _, c := range cases {
				d := nextDead(t, raw)
				if d.MessageId != c.name {
					t.Errorf("dead letter %q, want %q (order)", d.MessageId, c.name)
				}
				if d.Headers["x-mesh-dead-reason"] != "malformed" || !strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), c.reason) {
					t.Errorf("%s: dead letter says %v / %v, want malformed / %q", c.name, d.Headers["x-mesh-dead-reason"], d.Headers["x-mesh-dead-error"], c.reason)
				}
				if d.RoutingKey != "mesh.test.bad" {
					t.Errorf("%s: routing key %q", c.name, d.RoutingKey)
				}
			}
			if got := rec.count(); got != 1 {
				t.Errorf("handler saw %d events, want only the good one", got)
			}
		})
	}
}

// TestPoisonEventDoesNotBlockOthers: one event that always fails among
// good ones; the good ones are all handled, the poison one dead-lettered.
func TestPoisonEventDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var good atomic.Int32
	done := make(chan struct{})
	const total = 50
	m := load(t, n, sdk.Module{Name: "orders", Emits: []string{"poison", "placed"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.orders.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if ev.Type == "module.orders.poison" {
				return errors.New("poison")
			}
			if good.Add(1) == total {
				close(done)
			}
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 4})
	if _, err := m.Mesh().Emit(emitCtx(t), "poison", 1); err != nil {
		t.Fatal(err)
	}
	for i := range total {
		if _, err := m.Mesh().Emit(emitCtx(t), "placed", i); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("only %d of %d good events handled", good.Load(), total)
	}
	d := nextDead(t, rawConn(t, url))
	if d.RoutingKey != "module.orders.poison" || d.Headers["x-mesh-dead-attempts"] != int64(4) {
		t.Errorf("dead letter %s after %v attempts", d.RoutingKey, d.Headers["x-mesh-dead-attempts"])
	}
}

// TestHandlerTimeoutCountsAsFailure: a handler that hangs past its timeout
// is a failed attempt; the event is retried and then dead-lettered.
func TestHandlerTimeoutCountsAsFailure(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var calls atomic.Int32
	m := load(t, n, sdk.Module{Name: "slow", Emits: []string{"hang"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.slow.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			calls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 2, HandlerTimeout: 50 * time.Millisecond})
	if _, err := m.Mesh().Emit(emitCtx(t), "hang", 1); err != nil {
		t.Fatal(err)
	}
	d := nextDead(t, rawConn(t, url))
	if !strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), "timed out") || calls.Load() != 2 {
		t.Errorf("dead letter error %v after %d calls", d.Headers["x-mesh-dead-error"], calls.Load())
	}
}

// TestHungHandlerDoesNotStopTheModule: a handler that ignores its context
// and never returns is counted as a failed attempt at its timeout, and the
// module, with a single worker, goes on handling other events meanwhile.
func TestHungHandlerDoesNotStopTheModule(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var hangs atomic.Int32
	rec := newRecorder(nil)
	m := load(t, n, sdk.Module{Name: "stuck", Emits: []string{"hang", "ok"}, Setup: func(m sdk.Mesh) error {
		if err := m.On("module.stuck.hang", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			hangs.Add(1)
			<-release // ignores ctx on purpose
			return nil
		})); err != nil {
			return err
		}
		return m.On("module.stuck.ok", rec)
	}}, runtime.ModuleConfig{MaxAttempts: 2, HandlerTimeout: 100 * time.Millisecond, Concurrency: 1})
	if _, err := m.Mesh().Emit(emitCtx(t), "hang", 1); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := m.Mesh().Emit(emitCtx(t), "ok", i); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		rec.next(t)
	}
	d := nextDead(t, rawConn(t, url))
	if d.RoutingKey != "module.stuck.hang" || d.Headers["x-mesh-dead-attempts"] != int64(2) ||
		!strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), "timed out after 100ms") {
		t.Errorf("dead letter %s: %v", d.RoutingKey, d.Headers)
	}
	if got := hangs.Load(); got != 2 {
		t.Errorf("hanging handler called %d times, want 2", got)
	}
}
