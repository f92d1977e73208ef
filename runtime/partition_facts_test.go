package runtime_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
)

// TestSingleActiveConsumerHandover pins what issue 61 (module groups and
// per-key ordered partitions, docs/adr/0048-groups-and-ordered-partitions.md)
// builds on, on this broker, with raw amqp091-go: how a queue with
// x-single-active-consumer hands over from its active consumer A, holding
// messages 1-3 unacknowledged, to the waiting consumer B.
//   - A's channel closes: on a quorum and a classic queue alike, B gets
//     1-10 in order, 1-3 redelivered first.
//   - A cancels, still holding 1-3: a quorum queue makes B active at once,
//     and B gets 4-10 while A still holds 1-3 (a handover that reorders).
//     (Seen, not pinned, for its order varies: a classic queue gives B
//     nothing until A settles 1-3, nacked with requeue, and then 1, 4-10,
//     2, 3.)
//
// So a partition cannot be handed over by cancelling its consumer: its
// owner must settle (acknowledge) what it took before it lets go.
func TestSingleActiveConsumerHandover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		queueType string
		cancel    bool
		want      []string // what B gets, "N" or "N*" redelivered
	}{
		{"quorum", false, []string{"1*", "2*", "3*", "4", "5", "6", "7", "8", "9", "10"}},
		{"classic", false, []string{"1*", "2*", "3*", "4", "5", "6", "7", "8", "9", "10"}},
		{"quorum", true, []string{"4", "5", "6", "7", "8", "9", "10", "1*", "2*", "3*"}},
	} {
		t.Run(fmt.Sprintf("%s cancel=%v", c.queueType, c.cancel), func(t *testing.T) {
			t.Parallel()
			conn, err := amqp.Dial(brokertest.VHost(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			pub, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pub.QueueDeclare("partition", true, false, false, false, amqp.Table{"x-queue-type": c.queueType, "x-single-active-consumer": true}); err != nil {
				t.Fatal(err)
			}
			if err := pub.Confirm(false); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 10; i++ {
				dc, err := pub.PublishWithDeferredConfirmWithContext(context.Background(), "", "partition", false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
				if err != nil || !dc.Wait() {
					t.Fatalf("publish %d: %v", i, err)
				}
			}
			consume := func(name string, prefetch int) (*amqp.Channel, <-chan amqp.Delivery) {
				t.Helper()
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				if err := ch.Qos(prefetch, 0, false); err != nil {
					t.Fatal(err)
				}
				ds, err := ch.Consume("partition", name, false, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				return ch, ds
			}
			a, da := consume("A", 3)
			var held []amqp.Delivery
			for len(held) < 3 {
				held = append(held, nextDelivery(t, da, "A's deliveries"))
			}
			_, db := consume("B", 20)
			var got []string
			take := func(n int) {
				t.Helper()
				for range n {
					d := nextDelivery(t, db, "B's deliveries")
					s := string(d.Body)
					if d.Redelivered {
						s += "*"
					}
					got = append(got, s)
					if err := d.Ack(false); err != nil {
						t.Fatal(err)
					}
				}
			}
			switch {
			case !c.cancel:
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				take(10)
			default:
				if err := a.Cancel("A", false); err != nil {
					t.Fatal(err)
				}
				take(7) // while A still holds 1-3
				for _, d := range held {
					if err := d.Nack(false, true); err != nil {
						t.Fatal(err)
					}
				}
				take(3)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("B got %v, want %v", got, c.want)
			}
		})
	}
}

// TestHeadersExchangeMatch pins how a headers exchange, bound to a topic
// exchange (exchange-to-exchange), routes by a header (issue 61: a
// partition's queue bound by its number, the routing key staying the
// event type): a binding matches on a header whose name does not begin
// with x- (the broker leaves x- arguments out of the match, so a binding
// on x-... matches every message), and on an integer of the same value
// whatever its width, not on the same digits as a string.
func TestHeadersExchangeMatch(t *testing.T) {
	t.Parallel()
	ch := rawConn(t, brokertest.VHost(t))
	if err := ch.ExchangeDeclare("events", "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("group", "headers", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeBind("group", "module.shop.#", "events", false, nil); err != nil {
		t.Fatal(err)
	}
	for q, args := range map[string]amqp.Table{
		"by-x-header": {"x-match": "all", "x-partition": int64(1)},
		"by-header":   {"x-match": "all", "partition": int64(1)},
	} {
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "", "group", false, args); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i, h := range []amqp.Table{
		{"partition": int64(1), "x-partition": int64(1)},
		{"partition": int32(1), "x-partition": int32(1)},
		{"partition": "1", "x-partition": "1"},
		{"partition": int64(2), "x-partition": int64(2)},
	} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "events", "module.shop.order", false, false, amqp.Publishing{Headers: h, Body: []byte(strconv.Itoa(i))})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for q, want := range map[string][]string{"by-x-header": {"0", "1", "2", "3"}, "by-header": {"0", "1"}} {
		var got []string
		for {
			d, ok, err := ch.Get(q, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			got = append(got, string(d.Body))
		}
		if !slices.Equal(got, want) {
			t.Errorf("queue %s got %v, want %v", q, got, want)
		}
	}
}

// nextDelivery is the next delivery of ds, or the test fails after 30 s.
func nextDelivery(t *testing.T, ds <-chan amqp.Delivery, what string) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatalf("%s: the consumer ended", what)
		}
		return d
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing within 30 s", what)
	}
	return amqp.Delivery{}
}
