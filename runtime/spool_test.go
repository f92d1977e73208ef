package runtime_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// fullQueue declares, with raw amqp091-go, a classic queue bound to
// mesh.events for pattern that holds one message and refuses more
// (overflow reject-publish: a negative confirm to the publisher), and
// fills it.
func fullQueue(t *testing.T, ch *amqp.Channel, name, pattern string) {
	t.Helper()
	if _, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-max-length": int64(1), "x-overflow": "reject-publish",
	}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, pattern, wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", name, false, false, amqp.Publishing{Body: []byte("filler")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return queueDepth(t, ch, name) == 1 })
}

// spoolWhileDown starts a node behind a proxy with a sink module on
// mesh.spooled.#, takes the broker away and emits each of types while it
// is away (so they are spooled, in that order); it returns the node, the
// proxy, the sink and the ids.
func spoolWhileDown(t *testing.T, url string, emitTimeout time.Duration, types ...string) (*runtime.Node, *brokertest.Proxy, *recorder, []string) {
	t.Helper()
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "anchor", func(c *runtime.Config) {
		c.EmitTimeout = emitTimeout
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	})
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error { return m.On("mesh.spooled.#", rec) }}, runtime.ModuleConfig{})
	proxy.Down()
	waitFor(t, 10*time.Second, func() bool { return !n.Connected() })
	ids := make([]string, len(types))
	for i, typ := range types {
		id, err := n.Emit(emitCtx(t), "test", typ, map[string]int{"i": i})
		if err != nil {
			t.Fatalf("emit %s while the broker is away: %v", typ, err)
		}
		ids[i] = id
	}
	if st := n.Stats(); st.SpoolEvents != len(types) {
		t.Fatalf("the spool holds %d events, want %d", st.SpoolEvents, len(types))
	}
	return n, proxy, rec, ids
}

// TestSpoolRefusedEventIsDeadLettered: a spooled event the broker keeps
// refusing (its only queue is at its length limit, reject-publish) is
// tried again for EmitTimeout, as a direct emit would be, and no longer:
// it is then in mesh.dead-letters with reason refused, its id, type,
// headers and body. The events resent with it are delivered once each.
func TestSpoolRefusedEventIsDeadLettered(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	raw := rawConn(t, url)
	n, proxy, rec, ids := spoolWhileDown(t, url, time.Second, "mesh.spooled.a", "mesh.full.b", "mesh.spooled.c", "mesh.spooled.d")
	fullQueue(t, raw, "full", "mesh.full.#")
	proxy.Up()

	if ev := rec.next(t); ev.ID != ids[0] {
		t.Fatalf("first at the sink: %s, want %s", ev.ID, ids[0])
	}
	dead := nextDead(t, raw)
	if dead.MessageId != ids[1] || dead.RoutingKey != "mesh.full.b" {
		t.Fatalf("dead letter %s with key %s, want %s with key mesh.full.b", dead.MessageId, dead.RoutingKey, ids[1])
	}
	if got := dead.Headers[wire.HeaderDeadReason]; got != wire.DeadReasonRefused {
		t.Errorf("%s = %v, want %s", wire.HeaderDeadReason, got, wire.DeadReasonRefused)
	}
	if _, ok := dead.Headers[wire.HeaderDeadQueue]; ok {
		t.Errorf("a refused event names a queue that gave up: %v", dead.Headers[wire.HeaderDeadQueue])
	}
	if e, _ := dead.Headers[wire.HeaderDeadError].(string); !strings.Contains(e, "anchor") || !strings.Contains(e, "refused") {
		t.Errorf("%s = %q, want the node and the refusal", wire.HeaderDeadError, e)
	}
	if dead.Headers[wire.HeaderEventID] != ids[1] || dead.Headers[wire.HeaderSource] != "test" || string(dead.Body) != `{"i":1}` {
		t.Errorf("the dead letter lost the event: headers %v, body %s", dead.Headers, dead.Body)
	}
	if dead.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent", dead.DeliveryMode)
	}
	for _, want := range ids[2:] {
		if ev := rec.next(t); ev.ID != want {
			t.Fatalf("at the sink: %s, want %s (in emit order)", ev.ID, want)
		}
	}
	// The node counts the dead letter after the broker confirmed it and
	// the spool let it go, which can come after the broker delivered it.
	waitFor(t, 10*time.Second, func() bool { st := n.Stats(); return st.SpoolEvents == 0 && st.SpoolDeadLettered > 0 })
	if st := n.Stats(); st.SpoolDeadLettered != 1 || st.Refused == 0 || st.Resent != 3 {
		t.Errorf("stats: spool dead-lettered %d, refused %d, resent %d; want 1, > 0, 3", st.SpoolDeadLettered, st.Refused, st.Resent)
	}
	if got := queueDepth(t, raw, "full"); got != 1 {
		t.Errorf("the full queue holds %d, want its filler alone", got)
	}
}

// TestSpoolUnroutableEventIsKept: a spooled event the broker returns as
// unroutable (mesh.unrouted was unbound from the alternate exchange while
// the node was connected) is put in mesh.unrouted with its routing key in
// x-mesh-routing-key, not deleted. Order is forced: a refused event holds
// the spool while the test unbinds mesh.unrouted and emits behind it, and
// goes once its queue has room.
func TestSpoolUnroutableEventIsKept(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	raw := rawConn(t, url)
	n, proxy, rec, ids := spoolWhileDown(t, url, time.Minute, "mesh.spooled.a", "mesh.full.b")
	fullQueue(t, raw, "full", "mesh.full.#")
	proxy.Up()

	if ev := rec.next(t); ev.ID != ids[0] {
		t.Fatalf("first at the sink: %s, want %s", ev.ID, ids[0])
	}
	waitFor(t, 15*time.Second, func() bool { return n.Stats().Refused > 0 }) // mesh.full.b holds the spool
	if err := raw.QueueUnbind(wire.QueueUnrouted, "", wire.ExchangeUnrouted, nil); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"mesh.nowhere.c", "mesh.spooled.d"} {
		id, err := n.Emit(emitCtx(t), "test", typ, map[string]int{"i": len(ids)})
		if err != nil {
			t.Fatalf("emit %s behind a refused spooled event: %v", typ, err)
		}
		ids = append(ids, id)
	}
	if st := n.Stats(); st.SpoolEvents != 3 {
		t.Fatalf("the spool holds %d events, want 3 (the refused one and two behind it)", st.SpoolEvents)
	}
	if _, err := raw.QueuePurge("full", false); err != nil { // mesh.full.b goes now
		t.Fatal(err)
	}
	if ev := rec.next(t); ev.ID != ids[3] {
		t.Fatalf("at the sink: %s, want %s", ev.ID, ids[3])
	}
	kept := nextFrom(t, raw, wire.QueueUnrouted)
	if kept.MessageId != ids[2] || kept.Headers[wire.HeaderRoutingKey] != "mesh.nowhere.c" {
		t.Errorf("kept %s with %s=%v, want %s with mesh.nowhere.c", kept.MessageId, wire.HeaderRoutingKey, kept.Headers[wire.HeaderRoutingKey], ids[2])
	}
	if kept.DeliveryMode != amqp.Persistent || string(kept.Body) != `{"i":2}` || kept.Headers[wire.HeaderEventID] != ids[2] {
		t.Errorf("the kept event lost something: mode %d, headers %v, body %s", kept.DeliveryMode, kept.Headers, kept.Body)
	}
	if d := nextFrom(t, raw, "full"); d.MessageId != ids[1] {
		t.Errorf("the full queue got %q, want %s once it had room", d.MessageId, ids[1])
	}
	if got := queueDepth(t, raw, wire.QueueUnrouted); got != 0 {
		t.Errorf("mesh.unrouted holds %d more", got)
	}
	// Counted once the broker confirmed it, which can come after it
	// delivered it.
	waitFor(t, 10*time.Second, func() bool { st := n.Stats(); return st.SpoolEvents == 0 && st.SpoolUnrouted > 0 })
	if st := n.Stats(); st.SpoolUnrouted != 1 || st.SpoolDeadLettered != 0 {
		t.Errorf("stats: spool unrouted %d, dead-lettered %d; want 1, 0", st.SpoolUnrouted, st.SpoolDeadLettered)
	}
}

// TestOversizedHeadersAreNeverSpooled: with the broker away, an emit whose
// schema or causation id is over its bound is refused at once with
// ErrInvalid, and nothing reaches the spool (where it would be resent, and
// refused by the broker's frame, on every reconnect).
func TestOversizedHeadersAreNeverSpooled(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "bounds", nil)
	proxy.Down()
	waitFor(t, 10*time.Second, func() bool { return !n.Connected() })
	if _, err := n.Emit(emitCtx(t), "test", "mesh.bounds.x", 1, sdk.WithSchema(strings.Repeat("v", wire.MaxSchemaBytes+1))); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("an oversized schema: %v, want ErrInvalid", err)
	}
	long := causation.With(emitCtx(t), strings.Repeat("c", wire.MaxCausationBytes+1))
	if _, err := n.Emit(long, "test", "mesh.bounds.x", 1); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("an oversized causation id: %v, want ErrInvalid", err)
	}
	if st := n.Stats(); st.SpoolEvents != 0 || st.Spooled != 0 {
		t.Errorf("the spool took %d events", st.Spooled)
	}
	if _, err := n.Emit(emitCtx(t), "test", "mesh.bounds.x", 1); err != nil { // a fine one is spooled
		t.Errorf("a fine emit with the broker away: %v", err)
	}
}
