package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// historyReader is a History handler that keeps what it got, in order,
// and the offset after its last batch, as the audit logger does.
type historyReader struct {
	mu      sync.Mutex
	events  []sdk.Event
	batches int
	next    int64
	fail    func(batch []sdk.Event) error
	got     chan struct{}
}

func newHistoryReader(from int64) *historyReader {
	return &historyReader{next: from, got: make(chan struct{}, 1000)}
}

func (h *historyReader) history() *sdk.History {
	return &sdk.History{
		From: func(context.Context) (int64, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.next, nil
		},
		Handle: func(_ context.Context, batch []sdk.Event) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.fail != nil {
				if err := h.fail(batch); err != nil {
					return err
				}
			}
			h.events = append(h.events, batch...)
			h.batches++
			h.next = batch[len(batch)-1].Offset + 1
			h.got <- struct{}{}
			return nil
		},
	}
}

func (h *historyReader) snapshot() []sdk.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sdk.Event(nil), h.events...)
}

// waitEvents waits until the reader holds n events.
func (h *historyReader) waitEvents(t *testing.T, n int) []sdk.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if evs := h.snapshot(); len(evs) >= n {
			return evs
		}
		select {
		case <-h.got:
		case <-deadline:
			t.Fatalf("the history reader holds %d events, want %d", len(h.snapshot()), n)
		}
	}
}

// historyNode is a node that keeps the mesh's history on a stream of its
// virtual host.
func historyNode(t *testing.T, url, name string) *runtime.Node {
	return testNode(t, url, name, func(c *runtime.Config) {
		c.History = runtime.HistoryConfig{Stream: "mesh.history", MaxAge: 24 * time.Hour, SegmentBytes: 1 << 20}
	})
}

// TestHistoryStreamOnTheWire: a node with a history declares the stream
// with its arguments and binds it to # on mesh.events, so it holds every
// event routed, as it was published (read with raw amqp091-go).
func TestHistoryStreamOnTheWire(t *testing.T) {
	url := brokertest.VHost(t)
	n := historyNode(t, url, "alpha")
	ch := rawConn(t, url)
	// A redeclare with the node's own arguments succeeds only if they are
	// the stream's (a stream with other arguments is a 406).
	if _, err := ch.QueueDeclare("mesh.history", true, false, false, false,
		amqp.Table{"x-queue-type": "stream", "x-max-age": "86400s", "x-stream-max-segment-size-bytes": int64(1 << 20)}); err != nil {
		t.Fatalf("the stream is not declared as configured: %v", err)
	}
	m := load(t, n, sdk.Module{Name: "shop", Emits: []string{"order.placed"}}, runtime.ModuleConfig{})
	id, err := m.Mesh().Emit(emitCtx(t), "order.placed", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("mesh.history", "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	for d := range ds {
		if d.Headers[wire.HeaderEventID] != id {
			continue // the node's own events (joined, heartbeats)
		}
		if d.RoutingKey != "module.shop.order.placed" || d.Exchange != wire.ExchangeEvents || string(d.Body) != `{"n":1}` || d.DeliveryMode != amqp.Persistent {
			t.Fatalf("the stream holds %s via %q, body %s, mode %d", d.RoutingKey, d.Exchange, d.Body, d.DeliveryMode)
		}
		if _, ok := d.Headers[wire.HeaderStreamOffset].(int64); !ok {
			t.Fatalf("no offset on a stream delivery: %v", d.Headers)
		}
		return
	}
}

// TestHistoryReadsInOrderAndResumes: a History handler gets every event
// in the stream's order with its offset, a batch at a time; loaded again
// with the offset it stored, it resumes exactly there (no event twice, none
// missed); a failed batch comes again, whole, and nothing after it first.
func TestHistoryReadsInOrderAndResumes(t *testing.T) {
	url := brokertest.VHost(t)
	n := historyNode(t, url, "alpha")
	emitter := load(t, n, sdk.Module{Name: "shop", Emits: []string{"order.placed"}}, runtime.ModuleConfig{})
	var ids []string
	emit := func(k int) {
		for i := range k {
			id, err := emitter.Mesh().Emit(emitCtx(t), "order.placed", map[string]int{"i": len(ids) + i})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
	}
	emit(300)
	r := newHistoryReader(-1)
	failed := 0
	r.fail = func(batch []sdk.Event) error {
		if failed == 0 && len(r.events) > 0 {
			failed++
			return errors.New("the store is away")
		}
		return nil
	}
	reader := load(t, n, sdk.Module{Name: "reader", History: r.history()}, runtime.ModuleConfig{})
	mine := func(evs []sdk.Event) []sdk.Event {
		var out []sdk.Event
		for _, ev := range evs {
			if ev.Type == "module.shop.order.placed" {
				out = append(out, ev)
			}
		}
		return out
	}
	waitShop := func(k int) []sdk.Event {
		deadline := time.After(30 * time.Second)
		for {
			if evs := mine(r.snapshot()); len(evs) >= k {
				return evs
			}
			select {
			case <-r.got:
			case <-deadline:
				t.Fatalf("the reader holds %d of the shop's events, want %d", len(mine(r.snapshot())), k)
			}
		}
	}
	got := waitShop(300)
	checkOrder := func(all []sdk.Event) {
		t.Helper()
		for i := 1; i < len(all); i++ {
			if all[i].Offset != all[i-1].Offset+1 {
				t.Fatalf("offsets %d then %d: not in order, or one twice or missed", all[i-1].Offset, all[i].Offset)
			}
		}
	}
	checkOrder(r.snapshot())
	if failed != 1 {
		t.Fatalf("the failing batch failed %d times, want once", failed)
	}
	for i, ev := range got {
		if ev.ID != ids[i] {
			t.Fatalf("event %d is %s, want %s", i, ev.ID, ids[i])
		}
		if _, ok := ev.Headers[wire.HeaderStreamOffset]; ok {
			t.Fatal("the stream's offset header reached the handler")
		}
	}
	stop(t, reader)
	before := len(r.snapshot())
	emit(50)
	load(t, n, sdk.Module{Name: "reader", History: r.history()}, runtime.ModuleConfig{})
	got = waitShop(350)
	all := r.snapshot()
	checkOrder(all)
	if len(all) <= before {
		t.Fatal("nothing read after the reload")
	}
	for i, ev := range got {
		if ev.ID != ids[i] {
			t.Fatalf("after the reload, event %d is %s, want %s", i, ev.ID, ids[i])
		}
	}
}

// TestHistoryNeedsAStreamAndAGrant: a History handler on a node that
// keeps no history, or whose config does not grant it, fails the load.
func TestHistoryNeedsAStreamAndAGrant(t *testing.T) {
	url := brokertest.VHost(t)
	plain := testNode(t, url, "plain", nil)
	def := sdk.Module{Name: "reader", History: newHistoryReader(-1).history()}
	if _, err := plain.Load(context.Background(), def, runtime.ModuleConfig{}); !errors.Is(err, sdk.ErrInvalid) {
		t.Fatalf("a History handler on a node with no history loaded: %v", err)
	}
	n := historyNode(t, url, "alpha")
	if _, err := n.Load(context.Background(), def, runtime.ModuleConfig{DenyHistory: true}); !errors.Is(err, sdk.ErrForbidden) {
		t.Fatalf("a History handler not granted loaded: %v", err)
	}
}

// TestHistorySkipsMarkersAndFlagsMalformed: a replay's marker sent
// straight into the stream is not handed to the module (its offset is
// passed); a message on mesh.events that breaks the contract comes in its
// place, flagged malformed, with its headers as text.
func TestHistorySkipsMarkersAndFlagsMalformed(t *testing.T) {
	url := brokertest.VHost(t)
	n := historyNode(t, url, "alpha")
	ch := rawConn(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(exchange, key string, p amqp.Publishing) {
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(emitCtx(t)); !ok || err != nil {
			t.Fatalf("not confirmed: %v", err)
		}
	}
	publish("", "mesh.history", amqp.Publishing{UserId: "guest", Headers: amqp.Table{wire.HeaderHistoryMarker: "r1"}})
	// A forgery sent straight into the stream by a verified user, in the
	// shape of an event of billing's with the runtime's routing-key
	// header: it never went through mesh.events, no consumer saw it.
	publish("", "mesh.history", amqp.Publishing{UserId: "guest", ContentType: "application/json", Body: []byte(`{"forged":true}`), Headers: amqp.Table{
		wire.HeaderRoutingKey: "module.billing.invoice.paid", "x-event-id": "01J00000000000000000000009", "x-source": "billing", "x-node": "alpha",
		"x-time": time.Now().UTC().Format(time.RFC3339)}})
	publish(wire.ExchangeEvents, "module.x.y", amqp.Publishing{Headers: amqp.Table{"x-foo": int32(7)}, Body: []byte("not json")})
	r := newHistoryReader(-1)
	load(t, n, sdk.Module{Name: "reader", History: r.history()}, runtime.ModuleConfig{})
	deadline := time.After(30 * time.Second)
	for {
		for _, ev := range r.snapshot() {
			if _, ok := ev.Headers[wire.HeaderHistoryMarker]; ok {
				t.Fatalf("the marker reached the handler: %+v", ev)
			}
			if ev.ID == "01J00000000000000000000009" && (ev.DeadReason != wire.DeadReasonMalformed || !strings.Contains(ev.DeadError, "not through mesh.events")) {
				t.Fatalf("a message sent straight into the history's stream taken as an event: %+v", ev)
			}
			if ev.Type == "module.x.y" {
				if !slices.ContainsFunc(r.snapshot(), func(e sdk.Event) bool { return e.ID == "01J00000000000000000000009" }) {
					t.Fatalf("the forgery, before module.x.y on the stream, never reached the handler: %+v", r.snapshot())
				}
				if ev.DeadReason != wire.DeadReasonMalformed || ev.DeadError == "" || ev.Headers["x-foo"] != "7" || string(ev.Body) != "not json" {
					t.Fatalf("malformed message as %+v", ev)
				}
				if ev.Offset < 1 {
					t.Fatalf("its offset is %d, after the marker's", ev.Offset)
				}
				return
			}
		}
		select {
		case <-r.got:
		case <-deadline:
			t.Fatal(fmt.Sprintf("the malformed message never came: %+v", r.snapshot()))
		}
	}
}

// TestHistoryReaderThroughChecksAndAResume: a resume after the connection
// is cut reads on from the offset after the last batch: no offset comes
// twice, none is missed (the offset used to be read after the header was
// taken out: every resume read the stream again from 1). The node's
// consumer checks run meanwhile; they skip the stream, whose passive
// declare counts no consumer (once the broker's figures say messages wait,
// which this test does not wait for, a check took the reader for lost).
func TestHistoryReaderThroughChecksAndAResume(t *testing.T) {
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	checks := make(chan struct{}, 1000)
	resumed := make(chan struct{}, 10)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "alpha", func(c *runtime.Config) {
		c.History = runtime.HistoryConfig{Stream: "mesh.history", SegmentBytes: 1 << 20}
		c.ConsumerCheckInterval = 10 * time.Millisecond
		c.ReconnectMin, c.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	})
	n.SetTestHooks(runtime.TestHooks{
		Checked: func(module string) {
			if module == "reader" {
				checks <- struct{}{}
			}
		},
		Resumed: func() { resumed <- struct{}{} },
	})
	emitter := load(t, n, sdk.Module{Name: "shop", Emits: []string{"order.placed"}}, runtime.ModuleConfig{})
	emit := func(k int) {
		for i := range k {
			if _, err := emitter.Mesh().Emit(emitCtx(t), "order.placed", map[string]int{"i": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	emit(100)
	r := newHistoryReader(-1)
	load(t, n, sdk.Module{Name: "reader", History: r.history()}, runtime.ModuleConfig{})
	r.waitEvents(t, 100)
	for range 5 {
		select {
		case <-checks:
		case <-time.After(30 * time.Second):
			t.Fatal("no consumer check ran")
		}
	}
	proxy.Cut()
	select {
	case <-resumed:
	case <-time.After(30 * time.Second):
		t.Fatal("the node did not resume after the cut")
	}
	emit(100)
	all := r.waitEvents(t, 200)
	seen := map[int64]bool{}
	for i, ev := range all {
		if seen[ev.Offset] {
			t.Fatalf("offset %d came twice (event %d of %d)", ev.Offset, i, len(all))
		}
		seen[ev.Offset] = true
		if i > 0 && ev.Offset != all[i-1].Offset+1 {
			t.Fatalf("offset %d after %d: one missed", ev.Offset, all[i-1].Offset)
		}
	}
}
