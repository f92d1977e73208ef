package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// mesh is a virtual host with the mesh's topology, declared as
// runtime/topology.go declares it, and a connection to it.
type mesh struct {
	t    *testing.T
	url  string
	conn *amqp.Connection
	ch   *amqp.Channel // confirm mode; used by the test goroutine only
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	url := brokertest.VHost(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	m := &mesh{t: t, url: url, conn: conn, ch: ch}
	for _, x := range []struct {
		name, kind string
		args       amqp.Table
	}{
		{wire.ExchangeUnrouted, amqp.ExchangeFanout, nil},
		{wire.ExchangeEvents, amqp.ExchangeTopic, amqp.Table{"alternate-exchange": wire.ExchangeUnrouted}},
		{wire.ExchangeRPC, amqp.ExchangeTopic, nil},
		{wire.ExchangeDead, amqp.ExchangeTopic, nil},
	} {
		if err := ch.ExchangeDeclare(x.name, x.kind, true, false, false, false, x.args); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []struct{ queue, exchange, key string }{
		{wire.QueueUnrouted, wire.ExchangeUnrouted, ""},
		{wire.QueueDead, wire.ExchangeDead, "#"},
	} {
		if _, err := ch.QueueDeclare(k.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(k.queue, k.key, k.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// moduleQueue declares a module's queue as the runtime does (quorum, or
// classic when classic) and binds it to mesh.events with the patterns.
func (m *mesh) moduleQueue(node, module string, classic bool, patterns ...string) string {
	m.t.Helper()
	name := wire.ModuleQueue(node, module)
	args := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": wire.ExchangeDead, "x-delivery-limit": int64(4)}
	if classic {
		args = amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": wire.ExchangeDead}
	}
	if _, err := m.ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		m.t.Fatal(err)
	}
	for _, p := range patterns {
		if err := m.ch.QueueBind(name, p, wire.ExchangeEvents, false, nil); err != nil {
			m.t.Fatal(err)
		}
	}
	return name
}

// event is an event as the runtime's Emit publishes it.
type event struct {
	id, typ, source, node string
	time                  time.Time
	body                  string
	headers               amqp.Table // more headers
}

func newEvent(typ, source string, body string) event {
	now := time.Now().UTC()
	return event{id: ulid.Make().String(), typ: typ, source: source, node: "n0", time: now, body: body}
}

func (e event) publishing() amqp.Publishing {
	h := amqp.Table{
		wire.HeaderEventID: e.id,
		wire.HeaderSource:  e.source,
		wire.HeaderNode:    e.node,
		wire.HeaderTime:    e.time.Format(time.RFC3339Nano),
	}
	for k, v := range e.headers {
		h[k] = v
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  wire.ContentTypeJSON,
		DeliveryMode: amqp.Persistent,
		MessageId:    e.id,
		Timestamp:    e.time,
		Body:         []byte(e.body),
	}
}

// publish publishes and waits for a positive confirm.
func (m *mesh) publish(exchange, key string, msg amqp.Publishing) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := m.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		m.t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		m.t.Fatalf("publish to %q %q: acked=%v err=%v", exchange, key, ok, err)
	}
}

// deadLetter puts e in the dead letters as the runtime does: queue gave up
// after attempts, for reason, at when.
func (m *mesh) deadLetter(e event, queue string, attempts int, reason, errText string, when time.Time) {
	m.t.Helper()
	msg := e.publishing()
	msg.Headers[wire.HeaderDeadQueue] = queue
	msg.Headers[wire.HeaderDeadAttempts] = int64(attempts)
	msg.Headers[wire.HeaderDeadReason] = reason
	msg.Headers[wire.HeaderDeadError] = errText
	msg.Headers[wire.HeaderDeadTime] = when.UTC().Format(time.RFC3339Nano)
	m.publish(wire.ExchangeDead, e.typ, msg)
}

// count is the number of ready messages in queue, waiting up to 5 s for it
// to settle at want (a quorum queue applies returns asynchronously).
func (m *mesh) count(queue string, want int) int {
	m.t.Helper()
	ch, err := m.conn.Channel()
	if err != nil {
		m.t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			m.t.Fatal(err)
		}
		if q.Messages == want || time.Now().After(deadline) {
			return q.Messages
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get takes one message from queue, waiting up to wait for it.
func (m *mesh) get(queue string, wait time.Duration) (amqp.Delivery, bool) {
	m.t.Helper()
	ch, err := m.conn.Channel()
	if err != nil {
		m.t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(wait)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			m.t.Fatal(err)
		}
		if ok || time.Now().After(deadline) {
			return d, ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newMeshURLWithoutTopology is a fresh virtual host where nothing is
// declared.
func newMeshURLWithoutTopology(t *testing.T) string {
	return brokertest.VHost(t)
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, cancel
}
