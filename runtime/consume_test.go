package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestConsumeAnExistingQueue: a module consumes a queue another system
// declared and fills (classic and quorum), reading its messages as they
// are; a success is acked, a failure retried with the attempts counted,
// then dead-lettered naming the queue; the queue is never declared or
// deleted; a missing queue fails the module's start, naming it.
func TestConsumeAnExistingQueue(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	ch := rawConn(t, url)
	for _, q := range []struct {
		name string
		args amqp.Table
	}{{"legacy.orders", nil}, {"legacy.quorum", amqp.Table{"x-queue-type": "quorum"}}} {
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(ev sdk.Event) error {
		if strings.Contains(string(ev.Body), "bad") {
			return errors.New("cannot take it")
		}
		return nil
	}
	orders, quorum := newRecorder(fail), newRecorder(fail)
	load(t, n, sdk.Module{Name: "taker", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.Consume("legacy.orders", 2, orders), m.Consume("legacy.quorum", 1, quorum))
	}}, runtime.ModuleConfig{MaxAttempts: 3})

	for _, q := range []string{"legacy.orders", "legacy.quorum"} {
		for _, body := range []string{"plain text order", "bad order"} {
			if err := ch.Publish("", q, false, false, amqp.Publishing{MessageId: q + ":" + body, ContentType: "text/plain",
				Headers: amqp.Table{"x-tenant": "acme", "priority": int32(3)}, Body: []byte(body), DeliveryMode: amqp.Persistent}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		queue string
		rec   *recorder
	}{{"legacy.orders", orders}, {"legacy.quorum", quorum}} {
		seen := map[string][]int{}
		for range 4 { // the good one once, the bad one three times
			ev := c.rec.next(t)
			seen[string(ev.Body)] = append(seen[string(ev.Body)], ev.Attempt)
			if ev.Queue != c.queue || ev.Type != c.queue || ev.ID != c.queue+":"+string(ev.Body) ||
				ev.Headers["x-tenant"] != "acme" || ev.Headers["priority"] != "3" || ev.Headers["content-type"] != "text/plain" {
				t.Errorf("%s: handed %+v", c.queue, ev)
			}
		}
		if a := seen["bad order"]; len(a) != 3 || a[0] != 1 || a[2] != 3 || len(seen["plain text order"]) != 1 {
			t.Errorf("%s: attempts %v", c.queue, seen)
		}
	}
	for range 2 {
		d := nextDead(t, ch)
		if string(d.Body) != "bad order" || d.Headers["x-mesh-dead-reason"] != "delivery_limit" || d.Headers["x-mesh-dead-attempts"] != int64(3) ||
			!strings.HasPrefix(d.Headers["x-mesh-dead-queue"].(string), "legacy.") {
			t.Errorf("dead letter %+v", d)
		}
	}
	for _, q := range []string{"legacy.orders", "legacy.quorum"} {
		if got := queueDepth(t, ch, q); got != 0 {
			t.Errorf("%s holds %d", q, got)
		}
	}

	_, err := n.Load(emitCtx(t), sdk.Module{Name: "missing", Setup: func(m sdk.Mesh) error {
		return m.Consume("legacy.nothing", 1, newRecorder(nil))
	}}, runtime.ModuleConfig{})
	if err == nil || !strings.Contains(err.Error(), "legacy.nothing") || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("consuming a missing queue: %v", err)
	}
	ch = rawConn(t, url)
	if _, err := ch.QueueDeclarePassive("legacy.nothing", false, false, false, false, nil); err == nil {
		t.Error("the missing queue was declared")
	}
}

// consumers is the number of consumers the broker counts on queue.
func consumers(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Consumers
}

// TestHoldAConsumedQueue: a queue held from Setup is not consumed (the
// broker counts no consumer and its messages stay); released, its messages
// are handled; held again, the broker counts no consumer once Hold
// returned, and new messages stay in the queue.
func TestHoldAConsumedQueue(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	ch := rawConn(t, url)
	if _, err := ch.QueueDeclare("legacy.jobs", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	m := load(t, n, sdk.Module{Name: "jobs", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.Consume("legacy.jobs", 2, rec), m.Hold("legacy.jobs", true))
	}}, runtime.ModuleConfig{})
	publish := func(body string) {
		if err := ch.Publish("", "legacy.jobs", false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"a", "b", "c"} {
		publish(b)
	}
	if c := consumers(t, ch, "legacy.jobs"); c != 0 {
		t.Fatalf("a held queue has %d consumers", c)
	}
	if err := m.Mesh().Hold("legacy.jobs", false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rec.next(t)
	}
	if err := m.Mesh().Hold("legacy.jobs", true); err != nil {
		t.Fatal(err)
	}
	if c := consumers(t, ch, "legacy.jobs"); c != 0 {
		t.Errorf("held again, the queue has %d consumers", c)
	}
	publish("d")
	waitFor(t, 15e9, func() bool { return queueDepth(t, ch, "legacy.jobs") == 1 })
	if got := rec.count(); got != 3 {
		t.Errorf("%d messages handled, want 3", got)
	}
	if err := m.Mesh().Hold("legacy.other", true); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("hold of a queue not consumed: %v", err)
	}
}

// TestExclusiveConsumer: two nodes consume one queue exclusively: the
// first has it alone (the broker counts one consumer) and handles every
// message; the second stands by and takes over once the first stops.
func TestExclusiveConsumer(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	ch := rawConn(t, url)
	if _, err := ch.QueueDeclare("legacy.ordered", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	taker := func(rec *recorder) sdk.Module {
		return sdk.Module{Name: "taker", Setup: func(m sdk.Mesh) error {
			return errors.Join(m.Consume("legacy.ordered", 1, rec), m.Exclusive("legacy.ordered"))
		}}
	}
	first, second := newRecorder(nil), newRecorder(nil)
	a := load(t, testNode(t, url, "anchor", nil), taker(first), runtime.ModuleConfig{})
	waitFor(t, 15e9, func() bool { return consumers(t, ch, "legacy.ordered") == 1 })
	load(t, testNode(t, url, "harbor", nil), taker(second), runtime.ModuleConfig{})
	publish := func(body string) {
		if err := ch.Publish("", "legacy.ordered", false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"1", "2", "3"} {
		publish(b)
		if ev := first.next(t); string(ev.Body) != b {
			t.Errorf("the first consumer got %q, want %q", ev.Body, b)
		}
	}
	if c := consumers(t, ch, "legacy.ordered"); c != 1 || second.count() != 0 {
		t.Errorf("%d consumers, the second handled %d: want 1 and 0", c, second.count())
	}
	stop(t, a)
	publish("4")
	if ev := second.next(t); string(ev.Body) != "4" {
		t.Errorf("after the first stopped, the second got %q", ev.Body)
	}
}

// TestDeletedConsumedQueueStopsOnlyItsConsumer: a queue a module consumes
// is deleted while the module's own queue has deliveries in flight, some
// in handlers and some delivered and waiting for one (a classic queue,
// where a redelivery counts as an attempt): only that queue's consumer
// stops, reported by Ready; every event is handled once, on its first
// attempt, none dead-lettered; the queue is consumed again once it
// exists.
func TestDeletedConsumedQueueStopsOnlyItsConsumer(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	ch := rawConn(t, url)
	if _, err := ch.QueueDeclare("legacy.gone", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	tries := make(chan int, 16)
	n.SetTestHooks(runtime.TestHooks{Reconsume: func(queue string, attempt int) {
		if queue != "legacy.gone" {
			return
		}
		if attempt == 2 { // the queue is back before the second try
			if _, err := ch.QueueDeclare("legacy.gone", true, false, false, false, nil); err != nil {
				t.Error(err)
			}
		}
		tries <- attempt
	}})
	const inFlight, waiting = 3, 5
	gate, entered := make(chan struct{}), make(chan sdk.Event, inFlight+waiting)
	var mu sync.Mutex
	handled := map[string][]sdk.Event{}
	own := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		mu.Lock()
		handled[ev.ID] = append(handled[ev.ID], ev)
		mu.Unlock()
		if string(ev.Body) != `"marker"` {
			entered <- ev
			<-gate
		}
		return nil
	})
	legacy := newRecorder(nil)
	load(t, n, sdk.Module{Name: "taker", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.On("mesh.work.#", own), m.Consume("legacy.gone", 1, legacy))
	}}, runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxAttempts: 2, Concurrency: inFlight, Prefetch: inFlight + waiting + 1})

	var ids []string
	for i := range inFlight + waiting {
		id, err := n.Emit(emitCtx(t), "test", "mesh.work.item", i)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for range inFlight {
		select {
		case <-entered:
		case <-time.After(15 * time.Second):
			t.Fatal("the module's handlers never took the events")
		}
	}
	if _, err := ch.QueueDelete("legacy.gone", false, false, false); err != nil {
		t.Fatal(err)
	}
	waitTry := func(want int) {
		t.Helper()
		select {
		case got := <-tries:
			if got != want {
				t.Fatalf("reconsume try %d, want %d", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the node never tried to consume the deleted queue again (try %d)", want)
		}
	}
	waitTry(1) // the node noticed the cancel and tried the queue alone
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "legacy.gone") {
		t.Errorf("Ready with a consumed queue gone: %v, want it named", err)
	}
	close(gate)
	marker, err := n.Emit(emitCtx(t), "test", "mesh.work.marker", "marker")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range append(ids, marker) {
			if len(handled[id]) == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for _, id := range ids {
		if evs := handled[id]; len(evs) != 1 || evs[0].Attempt != 1 || evs[0].Redelivered {
			t.Errorf("event %s was handled %d times (%+v): want once, on its first attempt", id, len(evs), evs)
		}
	}
	mu.Unlock()
	if depth := queueDepth(t, ch, wire.QueueDead); depth != 0 {
		t.Errorf("%d dead letters, want none", depth)
	}

	waitTry(2) // the queue is declared again in the hook
	if err := ch.Publish("", "legacy.gone", false, false, amqp.Publishing{MessageId: "back", Body: []byte("back")}); err != nil {
		t.Fatal(err)
	}
	if ev := legacy.next(t); ev.ID != "back" {
		t.Errorf("the queue consumed again handed %+v", ev)
	}
	waitFor(t, 15*time.Second, func() bool { return n.Ready() == nil })
}

// TestConsumeCloudEvents: a CloudEvents producer's messages, in each
// binary binding's headers and in structured mode, reach a Consume handler
// with the event's id, source, type, time, dataschema and data; a message
// that says it is a CloudEvent and is not a valid one is dead-lettered as
// malformed, saying why; a mesh event keeps mesh's reading.
func TestConsumeCloudEvents(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	ch := rawConn(t, url)
	if _, err := ch.QueueDeclare("ce.orders", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(func(ev sdk.Event) error {
		if strings.Contains(string(ev.Body), "refuse") {
			return sdk.Permanent(errors.New("refused"))
		}
		return nil
	})
	load(t, n, sdk.Module{Name: "taker", Setup: func(m sdk.Mesh) error { return m.Consume("ce.orders", 1, rec) }}, runtime.ModuleConfig{})
	undertaker := newRecorder(nil)
	load(t, n, sdk.Module{Name: "undertaker", DeadLetters: undertaker}, runtime.ModuleConfig{})
	when := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	publish := func(p amqp.Publishing) {
		t.Helper()
		p.DeliveryMode = amqp.Persistent
		if err := ch.Publish("", "ce.orders", false, false, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"cloudEvents_", "cloudEvents:", "ce-"} {
		publish(amqp.Publishing{ContentType: "application/json", Body: []byte(`{"order":7}`), Headers: amqp.Table{
			prefix + "specversion": "1.0", prefix + "id": "order-" + prefix, prefix + "source": "/shop", prefix + "type": "com.example.order.created",
			prefix + "time": when.Format(time.RFC3339), prefix + "dataschema": "2"}})
		ev := rec.next(t)
		if ev.ID != "order-"+prefix || ev.Source != "/shop" || ev.Type != "com.example.order.created" || !ev.Time.Equal(when) ||
			ev.Schema != "2" || string(ev.Body) != `{"order":7}` || ev.Headers["content-type"] != "application/json" || ev.Queue != "ce.orders" {
			t.Errorf("binary, %s: %+v", prefix, ev)
		}
	}
	publish(amqp.Publishing{ContentType: "application/cloudevents+json", Body: []byte(
		`{"specversion":"1.0","id":"order-s","source":"/shop","type":"com.example.order.paid","datacontenttype":"application/json","data":{"paid":true}}`)})
	if ev := rec.next(t); ev.ID != "order-s" || ev.Type != "com.example.order.paid" || string(ev.Body) != `{"paid":true}` || ev.Headers["content-type"] != "application/json" {
		t.Errorf("structured: %+v", ev)
	}
	// Mixed bindings: dead-lettered as malformed, never handed over.
	publish(amqp.Publishing{Body: []byte(`{}`), Headers: amqp.Table{"ce-specversion": "1.0", "ce-id": "m", "ce-source": "s", "ce-type": "t", "cloudEvents_subject": "x"}})
	d := nextDead(t, ch)
	if d.Headers["x-mesh-dead-reason"] != wire.DeadReasonMalformed || !strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), "mixes") {
		t.Errorf("a mixed CloudEvent's dead letter: %v", d.Headers)
	}
	// A CloudEvent the handler refuses is a dead letter a DeadLetters
	// handler reads as the same CloudEvent.
	publish(amqp.Publishing{ContentType: "application/cloudevents+json", Body: []byte(
		`{"specversion":"1.0","id":"order-r","source":"/shop","type":"com.example.order.bad","data":{"refuse":1}}`)})
	if ev := rec.next(t); ev.ID != "order-r" {
		t.Fatalf("the refused one: %+v", ev)
	}
	for {
		dl := undertaker.next(t)
		if dl.DeadReason == wire.DeadReasonMalformed {
			continue // the mixed one, before it
		}
		if dl.ID != "order-r" || dl.Source != "/shop" || dl.Type != "com.example.order.bad" || string(dl.Body) != `{"refuse":1}` || dl.DeadQueue != "ce.orders" {
			t.Errorf("the dead letter of a refused CloudEvent: %+v", dl)
		}
		break
	}
	// A type longer than a routing key may be is refused as malformed:
	// it could not be dead-lettered or retried by it.
	publish(amqp.Publishing{Body: []byte(`{}`), Headers: amqp.Table{"ce-specversion": "1.0", "ce-id": "long", "ce-source": "s", "ce-type": strings.Repeat("t", 300)}})
	for {
		d := nextDead(t, ch)
		if d.Headers["x-mesh-dead-reason"] == wire.DeadReasonMalformed && strings.Contains(fmt.Sprint(d.Headers["x-mesh-dead-error"]), "longest routing key") {
			break
		}
	}
	// A message with mesh's identity is mesh's, CloudEvents headers or not.
	publish(amqp.Publishing{MessageId: "mesh-1", Body: []byte(`{}`), Headers: amqp.Table{wire.HeaderEventID: "mesh-1",
		"ce-specversion": "1.0", "ce-id": "other", "ce-source": "s", "ce-type": "t"}})
	if ev := rec.next(t); ev.ID != "mesh-1" || ev.Type != "ce.orders" {
		t.Errorf("a mesh message with ce- headers: %+v", ev)
	}
	// A plain message after it is still read as it is: the handler's next
	// event is that one, so the malformed one was not handed over.
	publish(amqp.Publishing{MessageId: "plain-1", Body: []byte("plain")})
	if ev := rec.next(t); ev.ID != "plain-1" || string(ev.Body) != "plain" {
		t.Errorf("after the malformed one, the handler got %+v", ev)
	}
}
