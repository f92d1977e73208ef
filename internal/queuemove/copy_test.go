package queuemove_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/queuemove"
	"github.com/meshkit/mesh/internal/wire"
)

// TestCopyTrustsOnlyVerifiedHeaders: a moved message keeps its body,
// properties and own headers, and says its type and publisher by the
// runtime's rules. Through an exchange, the type is the routing key and
// the publisher the broker-verified user-id, whatever x-mesh-* headers
// the publisher forged; sent straight to the queue, its type counts with
// a verified user-id, and the publisher it names only if that user is the
// mover's own (the runtime's rule for its own copies).
func TestCopyTrustsOnlyVerifiedHeaders(t *testing.T) {
	forged := amqp.Table{wire.HeaderRoutingKey: "module.billing.paid", wire.HeaderUserID: "billing-node", "x-tenant": "acme", "x-delivery-count": int64(3)}
	for _, c := range []struct {
		name           string
		d              amqp.Delivery
		wantType, user string
	}{
		{"through an exchange", amqp.Delivery{Exchange: "mesh.events", RoutingKey: "module.shop.sold", UserId: "shop-node", Headers: forged}, "module.shop.sold", "shop-node"},
		{"through an exchange, no user-id", amqp.Delivery{Exchange: "mesh.events", RoutingKey: "module.shop.sold", Headers: forged}, "module.shop.sold", ""},
		{"straight, from the mover's own user", amqp.Delivery{RoutingKey: "n1.ledger.events", UserId: "mover", Headers: forged}, "module.billing.paid", "billing-node"},
		{"straight, from another verified user", amqp.Delivery{RoutingKey: "n1.ledger.events", UserId: "ops", Headers: forged}, "module.billing.paid", "ops"},
		{"straight, unverified", amqp.Delivery{RoutingKey: "n1.ledger.events", Headers: forged}, "", ""},
	} {
		c.d.Body, c.d.MessageId, c.d.Priority = []byte(`{"n":1}`), "01JEV", 3
		msg := queuemove.Copy(c.d, "mover")
		if msg.UserId != "mover" || string(msg.Body) != `{"n":1}` || msg.MessageId != "01JEV" || msg.Priority != 3 || msg.DeliveryMode != amqp.Persistent {
			t.Errorf("%s: properties %+v", c.name, msg)
		}
		if got, _ := msg.Headers[wire.HeaderRoutingKey].(string); got != c.wantType {
			t.Errorf("%s: type %q, want %q", c.name, got, c.wantType)
		}
		if got := msg.Headers[wire.HeaderUserID]; got != c.user {
			t.Errorf("%s: publisher %v, want %q", c.name, got, c.user)
		}
		if msg.Headers["x-tenant"] != "acme" {
			t.Errorf("%s: lost its own header: %v", c.name, msg.Headers)
		}
		if _, ok := msg.Headers["x-delivery-count"]; ok {
			t.Errorf("%s: kept the broker's x-delivery-count", c.name)
		}
	}
}
