package amqpmsg_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
)

func TestRepublishing(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	d := amqp.Delivery{
		Headers: amqp.Table{"x-event-id": "01J", "x-tenant": "acme", "x-delivery-count": int64(2),
			"x-death": []any{}, "x-first-death-queue": "q", "x-last-death-reason": "rejected"},
		ContentType: "application/json", DeliveryMode: amqp.Transient, Priority: 3, MessageId: "01J",
		Timestamp: at, Body: []byte(`{"a":1}`), Redelivered: true, RoutingKey: "mesh.x",
	}
	msg := amqpmsg.Republishing(d, amqpmsg.BrokerAdded)
	if len(msg.Headers) != 2 || msg.Headers["x-event-id"] != "01J" || msg.Headers["x-tenant"] != "acme" {
		t.Errorf("headers %v, want only x-event-id and x-tenant", msg.Headers)
	}
	if msg.DeliveryMode != amqp.Persistent || msg.MessageId != "01J" || msg.Priority != 3 || !msg.Timestamp.Equal(at) ||
		string(msg.Body) != `{"a":1}` || msg.ContentType != "application/json" {
		t.Errorf("copy %+v", msg)
	}
	msg.Headers["x-new"] = "y"
	if _, ok := d.Headers["x-new"]; ok {
		t.Error("the copy shares its headers with the delivery")
	}
}
