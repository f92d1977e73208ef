package runtime_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
)

// TestDeliveryLimitByPolicy pins what the next step of issue 44 (queue
// settings that change without loss, docs/adr/0043-queue-settings-by-policy.md)
// builds on, on this broker, with raw amqp091-go and rabbitmqctl:
//   - a quorum queue declared without x-delivery-limit takes the
//     delivery-limit of a policy, and a changed policy applies to the live
//     queue, its messages in place;
//   - a queue declared with x-delivery-limit (as v0.1.0 declares every
//     module queue) takes the lower of the argument and the policy: a
//     policy can lower its limit, never raise it;
//   - such a queue cannot be declared again without the argument (406).
func TestDeliveryLimitByPolicy(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// What the broker drops past the limit goes to dlx's queue, where the
	// test sees it arrive.
	if err := ch.ExchangeDeclare("dlx", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("dead", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("dead", "", "dlx", false, nil); err != nil {
		t.Fatal(err)
	}
	dead, err := ch.Consume("dead", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("by-policy", true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("by-argument", true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx", "x-delivery-limit": int64(4)}); err != nil {
		t.Fatal(err)
	}
	// deliveries publishes one message to queue and rejects it (requeue)
	// until the broker drops it: the limit + 1.
	deliveries := func(queue string) int {
		t.Helper()
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Confirm(false); err != nil {
			t.Fatal(err)
		}
		conf, err := c.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, amqp.Publishing{Body: []byte("x")})
		if err != nil || !conf.Wait() {
			t.Fatalf("publish to %s: %v", queue, err)
		}
		if err := c.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := c.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			select {
			case d := <-ds:
				n++
				if err := d.Reject(true); err != nil {
					t.Fatal(err)
				}
			case <-dead: // past the limit, dead-lettered
				return n
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: neither redelivered nor dead-lettered within 30 s, after %d deliveries", queue, n)
			}
		}
	}
	policy := func(name, queue, limit string) {
		brokertest.Ctl(t, "set_policy", "-p", vhost, "--apply-to", "queues", name, "^"+queue+"$", `{"delivery-limit":`+limit+`,"dead-letter-exchange":"dlx"}`)
	}
	policy("p1", "by-policy", "2")
	if n := deliveries("by-policy"); n != 3 {
		t.Errorf("delivery-limit 2 by policy: %d deliveries, want 3", n)
	}
	policy("p1", "by-policy", "5")
	if n := deliveries("by-policy"); n != 6 {
		t.Errorf("delivery-limit 5 by the changed policy: %d deliveries, want 6", n)
	}
	policy("p2", "by-argument", "8")
	if n := deliveries("by-argument"); n != 5 {
		t.Errorf("argument 4, policy 8: %d deliveries, want 5 (the lower)", n)
	}
	policy("p2", "by-argument", "1")
	if n := deliveries("by-argument"); n != 2 {
		t.Errorf("argument 4, policy 1: %d deliveries, want 2 (the lower)", n)
	}
	c, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.QueueDeclare("by-argument", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if !isAMQPCode(err, amqp.PreconditionFailed) {
		t.Errorf("declaring the queue again without its x-delivery-limit: %v, want 406", err)
	}
}
