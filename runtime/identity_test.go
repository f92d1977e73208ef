package runtime_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/replay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestIdentityKeepsRetriesAndReplays: with the identity rule enforced
// (node far is shop's user; the operator's user may publish as any node),
// what the runtime and meshctl send again is held to the original
// publisher as owned.go reads it, so none of it is refused: a classic
// queue's retry (the node's copy, shop's user kept in x-mesh-user-id), a
// dead letter reaching a DeadLetters handler, the node's own emits (its
// own user, named by nobody), the operator's audit replays to mesh.events
// and to one queue. A replay by a user the rule does not list is refused
// with reason identity.
func TestIdentityKeepsRetriesAndReplays(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	shop, shopURL := brokerUser(t, url, ".*", ".*", ".*", "")
	operator, operatorURL := brokerUser(t, url, ".*", ".*", ".*", "")
	stranger, strangerURL := brokerUser(t, url, ".*", ".*", ".*", "")
	n := testNode(t, url, "berlin", func(c *runtime.Config) {
		c.Identity = runtime.IdentityConfig{Mode: runtime.IdentityEnforce, Users: map[string]string{"far": shop}, Operators: []string{operator}}
	})
	rec := newRecorder(func(ev sdk.Event) error {
		var order struct{ Poison, Retry bool }
		if err := ev.Decode(&order); err != nil || order.Poison {
			return sdk.Permanent(errors.New("poison"))
		}
		if order.Retry && ev.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", rec) }},
		runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxAttempts: 5})
	dead := newRecorder(nil)
	load(t, n, sdk.Module{Name: "undertaker", DeadLetters: dead}, runtime.ModuleConfig{})

	_, ch := dialAs(t, shopURL)
	publish := func(body string) string {
		id := ulid.Make().String()
		publishConfirmed(t, ch, wire.ExchangeEvents, "module.shop.order.created", amqp.Publishing{
			Headers: contractHeaders(id, "shop", nil), ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent,
			MessageId: id, UserId: shop, Body: []byte(body),
		})
		return id
	}

	// A retry: the node's copy, as the node's user, held to shop's.
	retried := publish(`{"Retry":true}`)
	for attempt := 1; attempt <= 2; attempt++ {
		if ev := rec.next(t); ev.ID != retried || ev.Attempt != attempt || ev.UserID != shop {
			t.Fatalf("attempt %d: %s attempt %d from %q, want %s from %s", attempt, ev.ID, ev.Attempt, ev.UserID, retried, shop)
		}
	}
	// A dead letter (published by the node, of shop's event) reaches the
	// DeadLetters handler: dead letters are not held to the rule.
	poison := publish(`{"Poison":true}`)
	rec.next(t)
	if ev := dead.next(t); ev.ID != poison || ev.UserID != shop || ev.DeadReason != wire.DeadReasonPermanent {
		t.Errorf("DeadLetters handler got %s from %q (%s), want %s from %s", ev.ID, ev.UserID, ev.DeadReason, poison, shop)
	}
	// The node's own emit: x-node berlin, its own user, which the rule
	// does not name.
	own, err := n.Emit(emitCtx(t), "shop", "module.shop.order.created", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.ID != own || ev.Node != "berlin" {
		t.Errorf("the node's own emit: %s from node %s", ev.ID, ev.Node)
	}

	// The operator's replays, to mesh.events and to the module's queue,
	// of an event of node far: as the operator's user, kept.
	at := time.Now().UTC().Add(-time.Hour)
	event := func() replay.Event {
		id := ulid.Make().String()
		return replay.Event{ID: id, Type: "module.shop.order.created", UserID: shop, Time: at, Body: []byte(`{}`),
			Headers: map[string]string{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "far", wire.HeaderTime: at.Format(time.RFC3339Nano)}}
	}
	conn, _ := dialAs(t, operatorURL)
	for i, queue := range []string{"", "berlin.billing.events"} {
		ev := event()
		if _, err := replay.Run(emitCtx(t), conn, &oneEventLog{events: []replay.Event{ev}}, replay.Options{ID: fmt.Sprintf("01REPLAY%018d", i), Queue: queue}); err != nil {
			t.Fatalf("replay to %q: %v", queue, err)
		}
		if got := rec.next(t); got.ID != ev.ID || got.UserID != operator || got.Node != "far" {
			t.Errorf("the operator's replay to %q: %s from %q (node %s), want %s from %s", queue, got.ID, got.UserID, got.Node, ev.ID, operator)
		}
	}
	// A replay by a user the rule does not list is a claim of node far.
	strangerConn, _ := dialAs(t, strangerURL)
	claim := event()
	if _, err := replay.Run(emitCtx(t), strangerConn, &oneEventLog{events: []replay.Event{claim}}, replay.Options{ID: "01REPLAY000000000000000009"}); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, url)
	d := nextDead(t, raw)
	for d.MessageId == poison {
		d = nextDead(t, raw)
	}
	if d.MessageId != claim.ID || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonIdentity || d.Headers[wire.HeaderUserID] != stranger ||
		!strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadError]), "x-node far published by broker user "+stranger+"; identity.users says far is "+shop) {
		t.Errorf("the stranger's replay: dead letter %s with %v", d.MessageId, d.Headers)
	}
}
