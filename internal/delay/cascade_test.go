package delay

import (
	"fmt"
	"math/bits"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
)

// declare builds the cascade Levels describes on ch, with ExchangeDue
// bound to DueQueue("n1"), as the runtime does.
func declare(t *testing.T, ch *amqp.Channel) {
	t.Helper()
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("due exchange", ch.ExchangeDeclare(ExchangeDue, "topic", true, false, false, false, nil))
	_, err := ch.QueueDeclare(DueQueue("n1"), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must("due queue", err)
	must("due binding", ch.QueueBind(DueQueue("n1"), DueBinding("n1"), ExchangeDue, false, nil))
	for _, x := range Exchanges() {
		must(x.Name, ch.ExchangeDeclare(x.Name, "topic", true, false, false, false, nil))
	}
	for _, l := range AllLevels() {
		_, err := ch.QueueDeclare(l.Name, true, false, false, false, amqp.Table(l.QueueArg))
		must(l.Name+" queue", err)
	}
	for _, x := range Exchanges() {
		for _, b := range x.Bindings {
			if b.Queue != "" {
				must(x.Name+" to "+b.Queue, ch.QueueBind(b.Queue, b.Key, x.Name, false, nil))
			} else {
				must(x.Name+" to "+b.Exchange, ch.ExchangeBind(b.Exchange, b.Key, x.Name, false, nil))
			}
		}
	}
}

// TestCascadeOnTheBroker: on RabbitMQ itself, the 28 quorum levels
// accept their arguments (the top one's TTL is 2^27 s), and a message
// delayed s seconds arrives in its node's DueQueue no sooner than s seconds after its
// publish, persistent, with its id, headers and body, having waited in
// one level per set bit (one x-death entry each). Only a lower bound is
// asserted: how late is for the benchmark.
func TestCascadeOnTheBroker(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(brokertest.VHost(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	declare(t, ch)
	t.Logf("the cascade declared in %v", time.Since(start).Round(time.Millisecond))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 8))
	delays := []uint32{0, 1, 2, 3}
	sent := map[string]time.Time{}
	for _, s := range delays {
		id := fmt.Sprintf("delay-%d", s)
		sent[id] = time.Now()
		if err := ch.Publish(ExchangeIn, RoutingKey(s, "n1"), false, false, amqp.Publishing{
			MessageId: id, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{"x-mesh-routing-key": "module.a.x"}, Body: []byte(`{"s":1}`),
		}); err != nil {
			t.Fatal(err)
		}
		if c := <-confirms; !c.Ack {
			t.Fatalf("delay %d s nacked", s)
		}
	}
	deliveries, err := ch.Consume(DueQueue("n1"), "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(60 * time.Second)
	for range delays {
		select {
		case d := <-deliveries:
			waited := time.Since(sent[d.MessageId])
			s, node, err := ParseRoutingKey(d.RoutingKey)
			if err != nil || node != "n1" {
				t.Fatalf("due with key %q: %v", d.RoutingKey, err)
			}
			if waited < time.Duration(s)*time.Second {
				t.Errorf("delay %d s arrived after %v: early", s, waited)
			}
			deaths, _ := d.Headers["x-death"].([]any)
			if len(deaths) != bits.OnesCount32(s) {
				t.Errorf("delay %d s waited in %d levels, want %d", s, len(deaths), bits.OnesCount32(s))
			}
			if d.DeliveryMode != amqp.Persistent || string(d.Body) != `{"s":1}` || d.Headers["x-mesh-routing-key"] != "module.a.x" || d.ContentType != "application/json" {
				t.Errorf("delay %d s changed on the way: mode %d body %s headers %v", s, d.DeliveryMode, d.Body, d.Headers)
			}
			_ = d.Ack(false)
		case <-timeout:
			t.Fatal("not every delayed message came due within 60 s")
		}
	}
}
