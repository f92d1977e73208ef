package runtime_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestSameIDOtherContentIsAConflict: a publisher outside the mesh (raw
// amqp091-go) sends an event id with {"amount":10}, the same copy again,
// a copy with only broker-style headers added, then the id with
// {"amount":99} and the id with another user header. The handler runs once,
// with amount 10; the copies are duplicates; the other bodies are not
// dropped as duplicates but dead-lettered with reason conflict naming both
// digests, with their own body, and counted; after a restart on the same
// state dir, the record still tells them apart. Quorum and classic queues
// alike.
func TestSameIDOtherContentIsAConflict(t *testing.T) {
	t.Parallel()
	for _, qt := range queueTypes {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			url := brokertest.VHost(t)
			state := t.TempDir()
			setState := func(c *runtime.Config) { c.StateDir = state }
			n := testNode(t, url, "anchor", setState)
			rec := newRecorder(nil)
			def := sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error { return m.On("mesh.orders.#", rec) }}
			mc := runtime.ModuleConfig{QueueType: qt, Concurrency: 1}
			load(t, n, def, mc)
			raw := rawConn(t, url)
			if err := raw.Confirm(false); err != nil {
				t.Fatal(err)
			}
			id := ulid.Make().String()
			publish := func(id, body string, extra amqp.Table) {
				t.Helper()
				h := amqp.Table{"x-event-id": id, "x-source": "shop", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano), "x-tenant": "acme"}
				for k, v := range extra {
					h[k] = v
				}
				publishConfirmed(t, raw, wire.ExchangeEvents, "mesh.orders.placed", amqp.Publishing{
					Headers: h, ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(body),
				})
			}
			publish(id, `{"amount":10}`, nil)
			if ev := rec.next(t); ev.ID != id || string(ev.Body) != `{"amount":10}` {
				t.Fatalf("handled %s %s, want %s with amount 10", ev.ID, ev.Body, id)
			}
			publish(id, `{"amount":10}`, nil)
			publish(id, `{"amount":10}`, amqp.Table{"x-delivery-count": int64(3), "x-first-death-queue": "elsewhere"})
			publish(id, `{"amount":99}`, nil)
			checkConflict(t, raw, id, `{"amount":99}`)
			publish(id, `{"amount":10}`, amqp.Table{"x-tenant": "other"})
			checkConflict(t, raw, id, `{"amount":10}`)
			marker := ulid.Make().String()
			publish(marker, `{"amount":1}`, nil)
			if ev := rec.next(t); ev.ID != marker {
				t.Fatalf("handled %s %s, want only the marker %s after the first", ev.ID, ev.Body, marker)
			}
			// The handler ran; its ack (and count) follows.
			waitFor(t, 10*time.Second, func() bool { return n.Stats().Handled == 2 })
			if st := n.Stats(); st.Duplicates != 2 || st.Conflicts != 2 || st.Handled != 2 {
				t.Errorf("duplicates %d, conflicts %d, handled %d; want 2, 2, 2", st.Duplicates, st.Conflicts, st.Handled)
			}

			// The digests are on disk: a restart still tells a conflict
			// from a duplicate.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.Close(ctx); err != nil {
				t.Fatal(err)
			}
			n2 := testNode(t, url, "anchor", setState)
			load(t, n2, def, mc)
			publish(id, `{"amount":10}`, nil)
			publish(id, `{"amount":99}`, nil)
			checkConflict(t, raw, id, `{"amount":99}`)
			marker = ulid.Make().String()
			publish(marker, `{"amount":2}`, nil)
			if ev := rec.next(t); ev.ID != marker {
				t.Fatalf("after a restart handled %s %s, want only the marker %s", ev.ID, ev.Body, marker)
			}
			if st := n2.Stats(); st.Duplicates != 1 || st.Conflicts != 1 {
				t.Errorf("after a restart: duplicates %d, conflicts %d; want 1, 1", st.Duplicates, st.Conflicts)
			}
		})
	}
}

// checkConflict takes the next dead letter off the wire and checks that
// it is id's copy with body, dead-lettered as a conflict that names two
// digests.
func checkConflict(t *testing.T, raw *amqp.Channel, id, body string) {
	t.Helper()
	d := nextDead(t, raw)
	if d.Headers["x-event-id"] != id || string(d.Body) != body || d.RoutingKey != "mesh.orders.placed" {
		t.Fatalf("dead letter %v %s (key %s), want id %s with %s", d.Headers["x-event-id"], d.Body, d.RoutingKey, id, body)
	}
	if d.Headers[wire.HeaderDeadReason] != wire.DeadReasonConflict || d.Headers[wire.HeaderDeadQueue] != "anchor.ledger.events" {
		t.Errorf("dead letter reason %v queue %v, want conflict from anchor.ledger.events", d.Headers[wire.HeaderDeadReason], d.Headers[wire.HeaderDeadQueue])
	}
	msg, _ := d.Headers[wire.HeaderDeadError].(string)
	if !strings.Contains(msg, "event id "+id+" was handled with content digest") || !strings.Contains(msg, "this copy's digest is") {
		t.Errorf("dead letter error %q does not name both digests", msg)
	}
}

// TestSameRequestIDOtherBodyIsAConflict: a request repeated with its id
// (one made inside a handling, whose answer is stored) is answered from
// the stored answer; the same id with another body is answered, without
// running the tool, with the permanent tool error "conflict" naming both
// digests, not with the other request's answer. Sent with raw amqp091-go,
// as a caller of another language would.
func TestSameRequestIDOtherBodyIsAConflict(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var runs atomic.Int64
	load(t, n, serveModule("echo", "echo.say", func(ctx context.Context, req sdk.Request) (any, error) {
		runs.Add(1)
		return req.Body, nil
	}), runtime.ModuleConfig{})
	raw := rawConn(t, url)
	replies, err := raw.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, cause := ulid.Make().String(), ulid.Make().String()
	call := func(correlation, body string) amqp.Delivery {
		t.Helper()
		h := requestHeaders(time.Now().Add(30 * time.Second))
		h["x-event-id"], h["x-causation-id"] = id, cause
		p := amqp.Publishing{Headers: h, ContentType: "application/json", Body: []byte(body), ReplyTo: replies.Name, CorrelationId: correlation, MessageId: id}
		if err := raw.PublishWithContext(emitCtx(t), "mesh.rpc", "echo.say", true, false, p); err != nil {
			t.Fatal(err)
		}
		d := nextFrom(t, raw, replies.Name)
		if d.CorrelationId != correlation {
			t.Fatalf("reply %s, want %s", d.CorrelationId, correlation)
		}
		return d
	}
	if d := call("first", `"a"`); d.Headers["x-status"] != "ok" || string(d.Body) != `"a"` {
		t.Fatalf("first answer %v %s", d.Headers, d.Body)
	}
	d := call("other", `"b"`)
	msg, _ := d.Headers["x-error-message"].(string)
	if d.Headers["x-status"] != "error" || d.Headers["x-error-code"] != "conflict" || d.Headers["x-error-permanent"] != true || !strings.Contains(msg, "this one's digest is") {
		t.Errorf("the same id with another body answered %v %s, want the permanent tool error conflict", d.Headers, d.Body)
	}
	if d := call("again", `"a"`); d.Headers["x-status"] != "ok" || string(d.Body) != `"a"` {
		t.Errorf("the same request again answered %v %s, want the stored answer", d.Headers, d.Body)
	}
	if runs.Load() != 1 {
		t.Errorf("the tool ran %d times, want once", runs.Load())
	}
}
