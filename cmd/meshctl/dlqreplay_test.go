package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// TestDLQReplayRefusesMeshQueues: `meshctl dlq replay` sends a dead letter
// back only to a module's event queue or a queue a module consumes. One
// that names a tool's request queue, a keeper or a module's dead-letter
// queue stays, and the replay says why and exits 1; nothing reaches those
// queues. What it sends carries its own broker user as the user-id.
func TestDLQReplayRefusesMeshQueues(t *testing.T) {
	m := newKeeperMesh(t)
	bin := build(t)
	billing := m.moduleQueue("n1", "billing", "module.shop.#")
	for _, q := range []string{"serve.echo.run", "shop.orders"} {
		if _, err := m.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	tool := m.deadLetter("module.shop.order.created", `{}`, "serve.echo.run", wire.DeadReasonPermanent, "x")
	keeper := m.deadLetter("module.shop.order.created", `{}`, wire.QueueUnrouted, wire.DeadReasonPermanent, "x")
	dead := m.deadLetter("module.shop.order.created", `{}`, "n1.billing.dead", wire.DeadReasonPermanent, "x")
	toBilling := m.deadLetter("module.shop.order.created", `{"n":1}`, billing, wire.DeadReasonPermanent, "x")
	toOrders := m.deadLetter("module.shop.order.created", `{"n":2}`, "shop.orders", wire.DeadReasonPermanent, "x")

	_, stderr := want(t, bin, m.url, 1, []string{"dlq", "replay"},
		"replayed 2 dead letters to 2 queues (3 left: names a queue replay never sends to)")
	for id, why := range map[string]string{tool: "serve.*", keeper: "mesh.*", dead: "*.dead"} {
		if !strings.Contains(stderr, "left "+id) || !strings.Contains(stderr, why) {
			t.Errorf("stderr does not say %s was left for naming a %s queue:\n%s", id, why, stderr)
		}
	}
	ch, err := m.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// meshctl has exited: whatever it sent is confirmed, so in its queue.
	if q, err := ch.QueueDeclarePassive("serve.echo.run", true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Errorf("serve.echo.run holds %d messages (%v), want none", q.Messages, err)
	}
	for q, id := range map[string]string{billing: toBilling, "shop.orders": toOrders} {
		d, ok := m.get(q)
		if !ok || d.MessageId != id || d.UserId != "guest" || d.Headers[wire.HeaderRoutingKey] != "module.shop.order.created" {
			t.Errorf("%s got %v: %s by %q with %v", q, ok, d.MessageId, d.UserId, d.Headers)
		}
	}
	// The three left are back in mesh.dead-letters (a quorum queue takes
	// back what meshctl's closed channel held as it processes the close):
	// each arrives, and no other comes first.
	if got := leftIn(t, ch, wire.QueueDead, 3); !sameSet(got, []string{tool, keeper, dead}) {
		t.Errorf("dead letters left %v, want %v", got, []string{tool, keeper, dead})
	}
}

// leftIn consumes queue until n messages came (or 10 s passed), without
// acking them, and returns their ids.
func leftIn(t *testing.T, ch *amqp.Channel, queue string, n int) []string {
	t.Helper()
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	timeout := time.After(10 * time.Second)
	for len(ids) < n {
		select {
		case d := <-deliveries:
			ids = append(ids, d.MessageId)
		case <-timeout:
			return ids
		}
	}
	return ids
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
