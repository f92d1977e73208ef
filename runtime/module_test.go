package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestBindingsFollowTheModule: a module restarted with a changed pattern
// set no longer receives the dropped pattern, and receives the new one.
func TestBindingsFollowTheModule(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	state := t.TempDir()
	n := testNode(t, url, "anchor", func(c *runtime.Config) { c.StateDir = state })
	rec := newRecorder(nil)
	subscribe := func(patterns ...string) sdk.Module {
		return sdk.Module{Name: "watcher", Setup: func(m sdk.Mesh) error {
			for _, p := range patterns {
				if err := m.On(p, rec); err != nil {
					return err
				}
			}
			return nil
		}}
	}
	m := load(t, n, subscribe("mesh.a.#", "mesh.b.#"), runtime.ModuleConfig{})
	for _, typ := range []string{"mesh.a.x", "mesh.b.x"} {
		if _, err := n.Emit(emitCtx(t), "test", typ, 1); err != nil {
			t.Fatal(err)
		}
		if ev := rec.next(t); ev.Type != typ {
			t.Fatalf("got %s, want %s", ev.Type, typ)
		}
	}
	stop(t, m)
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Close(closeCtx); err != nil {
		t.Fatal(err)
	}

	// A new node process with the same state dir: the record survives.
	n2 := testNode(t, url, "anchor", func(c *runtime.Config) { c.StateDir = state })
	load(t, n2, subscribe("mesh.a.#", "mesh.c.#"), runtime.ModuleConfig{})
	raw := rawConn(t, url)
	before := queueDepth(t, raw, wire.QueueUnrouted)
	if _, err := n2.Emit(emitCtx(t), "test", "mesh.b.x", 1); err != nil {
		t.Fatal(err)
	}
	// Confirmed means routed: with mesh.b.# unbound, the event went to the
	// unrouted keeper, not to the module's queue.
	if got := queueDepth(t, raw, wire.QueueUnrouted); got != before+1 {
		t.Errorf("unrouted queue has %d, want %d: mesh.b.# is still bound", got, before+1)
	}
	for _, typ := range []string{"mesh.c.x", "mesh.a.y"} {
		if _, err := n2.Emit(emitCtx(t), "test", typ, 1); err != nil {
			t.Fatal(err)
		}
		if ev := rec.next(t); ev.Type != typ {
			t.Fatalf("got %s, want %s (the dropped pattern was delivered)", ev.Type, typ)
		}
	}
}

// TestCausationThroughContext: an event emitted inside a handler carries the
// handled event's id, with nothing done by the author.
func TestCausationThroughContext(t *testing.T) {
	t.Parallel()
	n := testNode(t, "", "anchor", nil)
	rec := newRecorder(nil)
	var self sdk.Mesh
	m := load(t, n, sdk.Module{Name: "chain", Emits: []string{"first", "second"}, Setup: func(m sdk.Mesh) error {
		self = m
		if err := m.On("module.chain.first", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := self.Emit(ctx, "second", map[string]string{"from": ev.ID})
			return err
		})); err != nil {
			return err
		}
		return m.On("module.chain.second", rec)
	}}, runtime.ModuleConfig{})
	first, err := m.Mesh().Emit(emitCtx(t), "first", 1)
	if err != nil {
		t.Fatal(err)
	}
	ev := rec.next(t)
	if ev.CausationID != first {
		t.Errorf("second event's causation %q, want the first event's id %q", ev.CausationID, first)
	}
	if ev.Source != "chain" || ev.Node != "anchor" {
		t.Errorf("source %q node %q", ev.Source, ev.Node)
	}
	// Outside a handler there is no cause.
	if _, err := m.Mesh().Emit(emitCtx(t), "second", 1); err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.CausationID != "" {
		t.Errorf("causation %q outside a handler", ev.CausationID)
	}
}

// TestModuleRules: On after start, duplicate patterns, bad names and bad
// configs are refused with errors that name what broke.
func TestModuleRules(t *testing.T) {
	t.Parallel()
	n := testNode(t, "", "anchor", nil)
	m := load(t, n, sdk.Module{Name: "late", Setup: func(m sdk.Mesh) error {
		if err := m.On("mesh.x.#", newRecorder(nil)); err != nil {
			return err
		}
		if err := m.On("mesh.x.#", newRecorder(nil)); err == nil {
			return errors.New("duplicate pattern accepted")
		}
		if err := m.On("mesh..x", newRecorder(nil)); !errors.Is(err, sdk.ErrInvalid) {
			return errors.New("bad pattern accepted")
		}
		return nil
	}}, runtime.ModuleConfig{})
	if err := m.Mesh().On("mesh.y.#", newRecorder(nil)); !errors.Is(err, wire.ErrAlreadyStarted) {
		t.Errorf("On after start: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Load(ctx, sdk.Module{Name: "late"}, runtime.ModuleConfig{}); err == nil {
		t.Error("a second module of the same name was loaded")
	}
	if _, err := n.Load(ctx, sdk.Module{Name: "a.b"}, runtime.ModuleConfig{}); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("module name with a dot: %v", err)
	}
	if _, err := n.Load(ctx, sdk.Module{Name: "prio"}, runtime.ModuleConfig{MaxPriority: 5}); err == nil {
		t.Error("max priority on a quorum queue accepted")
	}
	if _, err := n.Load(ctx, sdk.Module{Name: "conc"}, runtime.ModuleConfig{Prefetch: 4, Concurrency: 8}); err == nil {
		t.Error("concurrency over prefetch accepted")
	}
	// A module queue with other arguments than the broker has is refused
	// with a clear error, not silently used.
	stop(t, m)
	if _, err := n.Load(ctx, sdk.Module{Name: "late", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.x.#", newRecorder(nil))
	}}, runtime.ModuleConfig{MaxAttempts: 9}); err == nil {
		t.Error("changed attempt limit on an existing quorum queue accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	err := runtime.Config{Node: "a b", MaxBodyBytes: -1, Module: runtime.ModuleConfig{QueueType: "stream", Prefetch: -3}}.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, field := range []string{"node", "max_body_bytes", "queue_type", "prefetch"} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if err := (runtime.Config{Node: "anchor"}).Validate(); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
}

// TestModuleThatStopsConsumingIsUnbound: a module that subscribed before and
// now subscribes nothing has its queue unbound, so events stop piling up in
// it.
func TestModuleThatStopsConsumingIsUnbound(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	stop(t, load(t, n, sdk.Module{Name: "fickle", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.a.#", newRecorder(nil))
	}}, runtime.ModuleConfig{}))
	load(t, n, sdk.Module{Name: "fickle"}, runtime.ModuleConfig{})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.a.x", 1); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, url)
	if depth := queueDepth(t, raw, "anchor.fickle.events"); depth != 0 {
		t.Errorf("the queue of a module that consumes nothing got %d events", depth)
	}
	if depth := queueDepth(t, raw, wire.QueueUnrouted); depth != 1 {
		t.Errorf("unrouted queue has %d events, want 1", depth)
	}
}

// TestEmitGrants: with sdk.AsFullType a module emits under its own
// namespace, and under mesh./node. only what its config grants; serving a
// tool outside its tool grants is refused.
func TestEmitGrants(t *testing.T) {
	t.Parallel()
	n := testNode(t, "", "anchor", nil)
	m := load(t, n, sdk.Module{Name: "deployer", Emits: []string{"done"}}, runtime.ModuleConfig{EmitGrants: []string{"mesh.delivery.#"}})
	ctx := emitCtx(t)
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"mesh.delivery.deployed", true},
		{"module.deployer.done", true},
		{"node.anchor.joined", false},
		{"module.other.done", false},
		{"mesh.billing.paid", false},
	} {
		_, err := m.Mesh().Emit(ctx, c.name, 1, sdk.AsFullType())
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, sdk.ErrForbidden) {
			t.Errorf("%s: %v, want ErrForbidden", c.name, err)
		}
	}
	_, err := n.Load(ctx, sdk.Module{Name: "server", Setup: func(m sdk.Mesh) error {
		return m.Serve("billing.pay", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return nil, nil }))
	}}, runtime.ModuleConfig{ToolGrants: []string{"invoice.*"}})
	if !errors.Is(err, sdk.ErrForbidden) {
		t.Errorf("serving an ungranted tool: %v", err)
	}
}

// TestModuleWhoseQueueIsDeletedAttachesAgain: the attachment's watch. An
// operator deletes a running module's queue (its consumer is cancelled by
// the broker): the module declares the queue again, binds it to its
// patterns and consumes it, on the same session, so what is emitted
// afterwards reaches its handler.
func TestModuleWhoseQueueIsDeletedAttachesAgain(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "phoenix", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.phoenix.#", rec)
	}}, runtime.ModuleConfig{})
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const queue = "anchor.phoenix.events"
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	// The queue is back, consumed, once a passive declare (on a channel of
	// its own: a missing queue closes it) finds a consumer.
	waitFor(t, 30*time.Second, func() bool {
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		q, err := c.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
	id, err := n.Emit(emitCtx(t), "test", "mesh.phoenix.risen", 1)
	if err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.ID != id {
		t.Fatalf("handled %s, want %s", ev.ID, id)
	}
}
