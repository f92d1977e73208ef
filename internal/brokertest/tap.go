package brokertest

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Channel is a channel of plain amqp091-go on a connection of its own to
// url, to check the wire without the mesh's code (or to be a publisher
// outside the mesh); the connection closes when t ends.
func Channel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

// Tap is what a test sees of an exchange with raw amqp091-go, not through
// the mesh's own code: a server-named, exclusive queue of its own
// connection, bound to exchange with each of keys, consumed with
// auto-ack. The connection closes when t ends. The exchange must exist.
func Tap(t testing.TB, url, exchange string, keys ...string) <-chan amqp.Delivery {
	t.Helper()
	ch := Channel(t, url)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("tap: declare: %v", err)
	}
	for _, k := range keys {
		if err := ch.QueueBind(q.Name, k, exchange, false, nil); err != nil {
			t.Fatalf("tap: bind %s %q: %v", exchange, k, err)
		}
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("tap: consume: %v", err)
	}
	return deliveries
}
