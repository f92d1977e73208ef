package runtime_test

import (
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestDeadLettersHandlerOnTheWire: a message that breaks the contract,
// published with raw amqp091-go, is dead-lettered by the module whose
// queue got it and reaches another module's DeadLetters handler read as
// far as it can be: every header as text, the body byte for byte. The
// dead-letter queue has no dead-letter exchange, so a dead letter is
// never dead-lettered again.
func TestDeadLettersHandlerOnTheWire(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	strict := newRecorder(nil)
	load(t, n, sdk.Module{Name: "strict", Setup: func(m sdk.Mesh) error { return m.On("mesh.raw.#", strict) }}, runtime.ModuleConfig{})
	dead := newRecorder(nil)
	load(t, n, sdk.Module{Name: "undertaker", DeadLetters: dead}, runtime.ModuleConfig{MaxAttempts: 3})

	ch := rawConn(t, url)
	body := []byte("not json\x00\xff")
	if err := ch.Publish("mesh.events", "mesh.raw.bad", false, false, amqp.Publishing{
		ContentType: "text/plain", DeliveryMode: amqp.Persistent, Body: body,
		Headers: amqp.Table{"x-time": int64(5), "x-source": "forged", "x-custom": []byte("bytes")},
	}); err != nil {
		t.Fatal(err)
	}
	ev := dead.next(t)
	if ev.DeadReason != "malformed" || ev.DeadQueue != "anchor.strict.events" || ev.DeadError == "" || ev.DeadTime.IsZero() ||
		ev.Type != "mesh.raw.bad" || string(ev.Body) != string(body) || ev.ID != "" || ev.Source != "forged" || ev.Attempt != 1 {
		t.Errorf("malformed dead letter as handled: %+v", ev)
	}
	for k, want := range map[string]string{"x-time": "5", "x-source": "forged", "x-custom": "bytes", "content-type": "text/plain"} {
		if got := ev.Headers[k]; got != want {
			t.Errorf("header %s = %q, want %q (headers %v)", k, got, want, ev.Headers)
		}
	}
	for k := range ev.Headers {
		if k == "x-mesh-dead-reason" || k == "x-delivery-count" {
			t.Errorf("bookkeeping header %s handed to the handler", k)
		}
	}
	if strict.count() != 0 {
		t.Errorf("the malformed message reached a handler")
	}

	// The module's dead-letter queue: quorum, its attempt limit, and no
	// dead-letter exchange.
	args := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(2)}
	if _, err := ch.QueueDeclare("anchor.undertaker.dead", true, false, false, false, args); err != nil {
		t.Errorf("anchor.undertaker.dead is not a durable quorum queue with %v: %v", args, err)
	}
	ch = rawConn(t, url)
	args["x-dead-letter-exchange"] = "mesh.events.dead"
	if _, err := ch.QueueDeclare("anchor.undertaker.dead", true, false, false, false, args); !isAMQPCode(err, amqp.PreconditionFailed) {
		t.Errorf("anchor.undertaker.dead redeclared with a dead-letter exchange: got %v, want 406", err)
	}
}

// TestDeadLettersHandlerDropsPastTheLimit: a DeadLetters handler that
// always fails is tried up to the attempt limit, then the dead letter is
// dropped: the module's dead-letter queue ends empty, and the operator's
// mesh.dead-letters holds the one copy.
func TestDeadLettersHandlerDropsPastTheLimit(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	load(t, n, sdk.Module{Name: "worker", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.work.#", newRecorder(func(sdk.Event) error { return sdk.Permanent(errors.New("no")) }))
	}}, runtime.ModuleConfig{})
	dead := newRecorder(func(sdk.Event) error { return errors.New("store down") })
	undertaker := load(t, n, sdk.Module{Name: "undertaker", DeadLetters: dead}, runtime.ModuleConfig{MaxAttempts: 3})
	id, err := n.Emit(emitCtx(t), "test", "mesh.work.x", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		if ev := dead.next(t); ev.ID != id || ev.Attempt != attempt || ev.DeadReason != "permanent" {
			t.Fatalf("attempt %d: %+v", attempt, ev)
		}
	}
	// Stopped, the module returns what it has not settled to its queue:
	// an empty queue then says the third failure dropped the dead letter
	// (and anything dead-lettered again was published before that).
	stop(t, undertaker)
	ch := rawConn(t, url)
	if got := queueDepth(t, ch, "anchor.undertaker.dead"); got != 0 {
		t.Errorf("anchor.undertaker.dead holds %d after the last attempt, want 0", got)
	}
	if d := nextDead(t, ch); d.MessageId != id {
		t.Errorf("mesh.dead-letters holds %q, want %s", d.MessageId, id)
	}
	if got := queueDepth(t, ch, "mesh.dead-letters"); got != 0 {
		t.Errorf("mesh.dead-letters holds %d more: the dead letter was dead-lettered again", got)
	}
}
