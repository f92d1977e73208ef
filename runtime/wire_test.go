package runtime_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestTopologyOnTheWire checks, with raw amqp091-go, the exchanges' types
// and durability and the module queue's name and arguments: a redeclare
// with the same settings succeeds and one with other settings is refused.
func TestTopologyOnTheWire(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	load(t, n, sdk.Module{Name: "umami", Setup: func(m sdk.Mesh) error {
		return m.On("module.umami.#", newRecorder(nil))
	}}, runtime.ModuleConfig{MaxAttempts: 4})
	load(t, n, sdk.Module{Name: "legacy", Setup: func(m sdk.Mesh) error {
		return m.On("node.*.joined", newRecorder(nil))
	}}, runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxPriority: 5})

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fresh := func() *amqp.Channel {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}

	exchanges := []struct {
		name, kind string
		args       amqp.Table
	}{
		{"mesh.events", "topic", amqp.Table{"alternate-exchange": "mesh.events.unrouted"}},
		{"mesh.rpc", "topic", nil},
		{"mesh.events.dead", "topic", nil},
		{"mesh.events.unrouted", "fanout", nil},
	}
	for _, x := range exchanges {
		ch := fresh()
		if err := ch.ExchangeDeclare(x.name, x.kind, true, false, false, false, x.args); err != nil {
			t.Errorf("exchange %s is not a durable %s exchange with %v: %v", x.name, x.kind, x.args, err)
		}
		ch.Close()
		ch = fresh()
		if err := ch.ExchangeDeclare(x.name, x.kind, false, false, false, false, x.args); !isAMQPCode(err, amqp.PreconditionFailed) {
			t.Errorf("exchange %s redeclared non-durable: got %v, want 406", x.name, err)
		}
		ch = fresh()
		other := "direct"
		if err := ch.ExchangeDeclare(x.name, other, true, false, false, false, x.args); !isAMQPCode(err, amqp.PreconditionFailed) {
			t.Errorf("exchange %s redeclared as %s: got %v, want 406", x.name, other, err)
		}
	}

	queues := []struct {
		name string
		args amqp.Table
	}{
		{"anchor.umami.events", amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "mesh.events.dead", "x-delivery-limit": int64(3)}},
		{"anchor.legacy.events", amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "mesh.events.dead", "x-max-priority": int64(5)}},
		{"mesh.dead-letters", amqp.Table{"x-queue-type": "quorum"}},
		{"mesh.unrouted", amqp.Table{"x-queue-type": "quorum"}},
	}
	for _, q := range queues {
		ch := fresh()
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			t.Errorf("queue %s is not durable with %v: %v", q.name, q.args, err)
		}
		ch.Close()
		ch = fresh()
		if _, err := ch.QueueDeclare(q.name, false, false, false, false, q.args); err == nil {
			t.Errorf("queue %s redeclared non-durable succeeded, want a refusal", q.name)
		}
		ch = fresh()
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, nil); !isAMQPCode(err, amqp.PreconditionFailed) {
			t.Errorf("queue %s redeclared without its arguments: got %v, want 406", q.name, err)
		}
	}
}

// TestEmitOnTheWire reads an emitted event with raw amqp091-go and checks
// every header and property of the contract.
func TestEmitOnTheWire(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	raw := rawConn(t, url)
	q, err := raw.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.QueueBind(q.Name, "#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	m := load(t, n, sdk.Module{Name: "umami", Emits: []string{"site.created"}}, runtime.ModuleConfig{})
	before := time.Now().UTC().Truncate(time.Second)
	id, err := m.Mesh().Emit(causation.With(emitCtx(t), "01JABCDEFGHJKMNPQRSTVWXYZ0"), "site.created", map[string]any{"site": 42},
		sdk.WithSchema("v2"), sdk.WithPriority(3))
	if err != nil {
		t.Fatalf("emit: %v", err)
	}
	d := nextFrom(t, raw, q.Name)

	if d.RoutingKey != "module.umami.site.created" {
		t.Errorf("routing key %q, want module.umami.site.created", d.RoutingKey)
	}
	if d.Exchange != "mesh.events" {
		t.Errorf("exchange %q", d.Exchange)
	}
	if d.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want 2", d.DeliveryMode)
	}
	if d.ContentType != "application/json" {
		t.Errorf("content type %q", d.ContentType)
	}
	if d.MessageId != id {
		t.Errorf("message-id %q, want the event id %q", d.MessageId, id)
	}
	if d.UserId != "guest" {
		t.Errorf("user-id %q, want guest, the user the node publishes as (the broker checked it)", d.UserId)
	}
	if d.Priority != 3 {
		t.Errorf("priority %d, want 3", d.Priority)
	}
	gotID, _ := d.Headers["x-event-id"].(string)
	if gotID != id {
		t.Errorf("x-event-id %v, want %s", d.Headers["x-event-id"], id)
	}
	if _, err := ulid.ParseStrict(gotID); err != nil {
		t.Errorf("x-event-id %q is not a ULID: %v", gotID, err)
	}
	for h, want := range map[string]string{"x-source": "umami", "x-node": "anchor", "x-schema": "v2", "x-causation-id": "01JABCDEFGHJKMNPQRSTVWXYZ0"} {
		if got, _ := d.Headers[h].(string); got != want {
			t.Errorf("%s = %#v, want %q", h, d.Headers[h], want)
		}
	}
	ts, _ := d.Headers["x-time"].(string)
	tm, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || !strings.HasSuffix(ts, "Z") {
		t.Errorf("x-time %q is not RFC 3339 UTC: %v", ts, err)
	}
	if tm.Before(before) || tm.After(time.Now().Add(time.Second)) {
		t.Errorf("x-time %v is not the emit time", tm)
	}
	if d.Timestamp.Unix() != tm.Unix() {
		t.Errorf("timestamp property %v, want the emit time %v", d.Timestamp, tm)
	}
	for k := range d.Headers {
		if k == "type" || k == "x-type" || k == "x-event-type" {
			t.Errorf("header %s repeats the type", k)
		}
	}
	var body map[string]any
	if err := json.Unmarshal(d.Body, &body); err != nil || body["site"] != float64(42) {
		t.Errorf("body %s is not the payload alone", d.Body)
	}
}

// TestRawPublishReachesHandler publishes with plain amqp091-go, the way a
// foreign emitter would, with an unknown x- header, and checks the handler
// gets every piece of metadata.
func TestRawPublishReachesHandler(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "audit", Setup: func(m sdk.Mesh) error { return m.On("mesh.#", rec) }}, runtime.ModuleConfig{})

	raw := rawConn(t, url)
	id := ulid.Make().String()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	err := raw.PublishWithContext(emitCtx(t), "mesh.events", "mesh.delivery.deployed", false, false, amqp.Publishing{
		Headers: amqp.Table{
			"x-event-id": id, "x-source": "delivery", "x-node": "far", "x-time": at.Format(time.RFC3339),
			"x-causation-id": "01JCAUSE00000000000000000", "x-schema": "3",
			"x-tenant": "acme", "x-weird-number": int32(7), "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Body:         []byte(`{"release":"1.2.3"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := rec.next(t)
	want := sdk.Event{ID: id, Type: "mesh.delivery.deployed", Source: "delivery", Node: "far", Time: at,
		CausationID: "01JCAUSE00000000000000000", Schema: "3", Attempt: 1}
	if ev.ID != want.ID || ev.Type != want.Type || ev.Source != want.Source || ev.Node != want.Node ||
		!ev.Time.Equal(want.Time) || ev.CausationID != want.CausationID || ev.Schema != want.Schema || ev.Attempt != 1 || ev.Redelivered {
		t.Errorf("event metadata %+v, want %+v", ev, want)
	}
	if ev.Headers["x-tenant"] != "acme" || ev.Headers["x-weird-number"] != "7" {
		t.Errorf("unknown x- headers %v, want x-tenant=acme and x-weird-number=7", ev.Headers)
	}
	if _, ok := ev.Headers["traceparent"]; ok {
		t.Errorf("non-x header in Headers: %v", ev.Headers)
	}
	var body struct{ Release string }
	if err := ev.Decode(&body); err != nil || body.Release != "1.2.3" {
		t.Errorf("decode: %v %+v", err, body)
	}
}

// TestEmitRefusesBadInput checks that bad names and bodies are refused with
// an error naming the rule, and nothing reaches the broker.
func TestEmitRefusesBadInput(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", func(c *runtime.Config) { c.MaxBodyBytes = 1024 })
	m := load(t, n, sdk.Module{Name: "umami", Emits: []string{"site.created"}}, runtime.ModuleConfig{})
	raw := rawConn(t, url)
	q, err := raw.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.QueueBind(q.Name, "#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body any
		is   error
		rule string
	}{
		{"site..created", 1, sdk.ErrInvalid, "empty"},
		{"site.*", 1, sdk.ErrInvalid, "pattern"},
		{"site.#", 1, sdk.ErrInvalid, "pattern"},
		{"site created", 1, sdk.ErrInvalid, "whitespace"},
		{"site.\x01", 1, sdk.ErrInvalid, "control"},
		{strings.Repeat("a", 250), 1, sdk.ErrInvalid, "255"},
		{"", 1, sdk.ErrInvalid, "empty"},
		{"site.created", json.RawMessage(`{"a":`), sdk.ErrInvalid, "JSON"},
		{"site.created", []byte("not json"), sdk.ErrInvalid, "JSON"},
		{"site.created", func() {}, sdk.ErrInvalid, "func"},
		{"site.created", strings.Repeat("x", 2000), sdk.ErrInvalid, "1024"},
		{"site.deleted", 1, sdk.ErrForbidden, `add "site.deleted" to its Emits`},
	}
	for _, c := range cases {
		_, err := m.Mesh().Emit(emitCtx(t), c.name, c.body)
		if !errors.Is(err, c.is) {
			t.Errorf("emit %q: got %v, want %v", c.name, err, c.is)
			continue
		}
		if !strings.Contains(err.Error(), c.rule) {
			t.Errorf("emit %q: error %q does not say %q", c.name, err, c.rule)
		}
	}
	if _, err := n.Emit(emitCtx(t), "meshctl", "umami.site.created", 1); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("emit with two words: %v", err)
	}
	if _, err := n.Emit(emitCtx(t), "meshctl", "other.x.y", 1); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("emit with unknown origin: %v", err)
	}
	// Headers out of bounds are refused up front, never spooled.
	if _, err := m.Mesh().Emit(emitCtx(t), "site.created", 1, sdk.WithSchema(strings.Repeat("v", 100000))); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "128") {
		t.Errorf("emit with a huge schema: %v", err)
	}
	huge := causation.With(emitCtx(t), strings.Repeat("c", 100000))
	if _, err := n.Emit(huge, "meshctl", "mesh.x.y", 1); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "255") {
		t.Errorf("emit with a huge causation id: %v", err)
	}
	if st := n.Stats(); st.Spooled != 0 {
		t.Errorf("%d refused events spooled", st.Spooled)
	}
	// A good event goes through, and it is the only one on the wire.
	if _, err := m.Mesh().Emit(emitCtx(t), "site.created", 1); err != nil {
		t.Fatal(err)
	}
	if got := nextFrom(t, raw, q.Name); got.RoutingKey != "module.umami.site.created" {
		t.Errorf("got %s", got.RoutingKey)
	}
	if depth := queueDepth(t, raw, q.Name); depth != 0 {
		t.Errorf("%d refused events reached the broker", depth)
	}
}

// TestUnroutedEventsAreKept checks an event no queue wants lands in the
// unrouted keeper queue instead of vanishing.
func TestUnroutedEventsAreKept(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	id, err := n.Emit(emitCtx(t), "meshctl", "mesh.nobody.listens", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	d := nextFrom(t, rawConn(t, url), wire.QueueUnrouted)
	if d.Headers["x-event-id"] != id || d.RoutingKey != "mesh.nobody.listens" {
		t.Errorf("unrouted keeper got %v %s, want %s", d.Headers["x-event-id"], d.RoutingKey, id)
	}
}

// TestNodesDeclareTheSameTopology: several nodes on one broker declare the
// topology without conflicting, and an event one emits reaches a module on
// the other.
func TestNodesDeclareTheSameTopology(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a := testNode(t, url, "anchor", nil)
	b := testNode(t, url, "beacon", nil)
	rec := newRecorder(nil)
	load(t, b, sdk.Module{Name: "watcher", Setup: func(m sdk.Mesh) error { return m.On("node.anchor.*", rec) }}, runtime.ModuleConfig{})
	if _, err := a.Emit(emitCtx(t), "anchor", "node.anchor.joined", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.Node != "anchor" || ev.Type != "node.anchor.joined" {
		t.Errorf("beacon's module got %+v", ev)
	}
}

// TestForgedUserIDRefusedByTheBroker: the user-id property events carry is
// checked by RabbitMQ itself. A publisher that claims another user than it
// authenticated as is refused (406, its channel closed) and nothing is
// routed; one that claims its own is accepted. So an event's user-id says
// whose credential published it, whatever its headers claim.
func TestForgedUserIDRefusedByTheBroker(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	testNode(t, url, "anchor", nil) // declares the topology
	check := rawConn(t, url)
	q, err := check.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := check.QueueBind(q.Name, "mesh.prov.#", wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	pub := rawConn(t, url)
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	closed := pub.NotifyClose(make(chan *amqp.Error, 1))
	publish := func(user string) error {
		dc, err := pub.PublishWithDeferredConfirmWithContext(emitCtx(t), wire.ExchangeEvents, "mesh.prov.x", false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderEventID: "01JPROV0000000000000000000", wire.HeaderSource: "admin", wire.HeaderNode: "n",
				wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: wire.ContentTypeJSON, MessageId: "01JPROV0000000000000000000", UserId: user, Body: []byte(`{}`),
		})
		if err != nil {
			return err
		}
		if _, err := dc.WaitContext(emitCtx(t)); err != nil {
			return err
		}
		return nil
	}
	if err := publish("guest"); err != nil {
		t.Fatalf("the user's own user-id: %v", err)
	}
	if d := nextFrom(t, check, q.Name); d.UserId != "guest" {
		t.Errorf("user-id %q arrived, want guest", d.UserId)
	}
	_ = publish("admin") // the broker answers with a channel close, not a nack
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.PreconditionFailed || !strings.Contains(e.Reason, "user_id") {
			t.Errorf("a forged user-id closed the channel with %v, want 406 naming user_id", e)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the broker took a forged user-id")
	}
	if n := queueDepth(t, check, q.Name); n != 0 {
		t.Errorf("%d forged events routed", n)
	}
}
