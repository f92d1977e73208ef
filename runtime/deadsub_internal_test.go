package runtime

import (
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// FuzzDeadEventOf: any dead letter, however broken its headers, is read
// without a panic into an event that keeps its type and body byte for
// byte and never hands the dead-letter bookkeeping to the handler; one
// whose contract headers hold is read exactly, and one that breaks the
// contract says so.
func FuzzDeadEventOf(f *testing.F) {
	good := ulid.Make().String()
	f.Add("mesh.a.b", good, "umami", "2026-12-01T00:00:00Z", "permanent", int64(3), []byte(`{"n":1}`), false)
	f.Add("mesh.a.b", "", "", "", "", int64(0), []byte("\x00"), true)
	f.Add("x", "not-a-ulid", "a", "yesterday", "malformed", int64(-1), []byte(nil), true)
	f.Fuzz(func(t *testing.T, key, id, source, tm, reason string, attempts int64, body []byte, bytesHeaders bool) {
		h := amqp.Table{wire.HeaderNode: "anchor", wire.HeaderDeadQueue: "anchor.m.events", wire.HeaderDeadAttempts: attempts, "x-death": []any{"junk"}}
		put := func(k, v string) {
			if bytesHeaders {
				h[k] = []byte(v)
			} else {
				h[k] = v
			}
		}
		put(wire.HeaderEventID, id)
		put(wire.HeaderSource, source)
		put(wire.HeaderTime, tm)
		put(wire.HeaderDeadReason, reason)
		d := amqp.Delivery{RoutingKey: key, Headers: h, ContentType: "application/json", Body: body, MessageId: id}
		ev := deadEventOf(d)
		if ev.Type != key || string(ev.Body) != string(body) || ev.DeadQueue != "anchor.m.events" {
			t.Fatalf("type %q body %q queue %q, want %q %q", ev.Type, ev.Body, ev.DeadQueue, key, body)
		}
		for k := range ev.Headers {
			if strings.HasPrefix(k, "x-mesh-dead-") || k == "x-death" {
				t.Fatalf("bookkeeping header %s handed to the handler", k)
			}
		}
		_, decodeErr := wire.DecodeMeta(h, d.ContentType, body)
		switch {
		case decodeErr == nil:
			want, _ := time.Parse(time.RFC3339Nano, tm)
			if ev.ID != id || ev.Source != source || !ev.Time.Equal(want) || ev.DeadReason != reason {
				t.Fatalf("well-formed dead letter read as %+v", ev)
			}
		case reason == "" && ev.DeadReason != wire.DeadReasonMalformed:
			t.Fatalf("a dead letter that breaks the contract, with no reason, read with reason %q", ev.DeadReason)
		}
	})
}
