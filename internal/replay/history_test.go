package replay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/replay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

const stream = "mesh.history"

// history is a virtual host of the test's own with the mesh's exchanges
// and a history stream, as a node with history.stream declares them, and
// a raw connection to it.
type history struct {
	ctx  context.Context
	conn *amqp.Connection
	pub  *amqp.Channel // confirms on: a confirmed message is in the stream
}

func newHistory(t *testing.T) *history {
	t.Helper()
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), History: runtime.HistoryConfig{Stream: stream}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(context.Background()) })
	h := &history{ctx: ctx}
	if h.conn, err = amqp.Dial(url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	if h.pub, err = h.conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := h.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return h
}

// publish sends msg and waits for the broker's confirm.
func (h *history) publish(t *testing.T, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	dc, err := h.pub.PublishWithDeferredConfirmWithContext(h.ctx, exchange, key, false, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(h.ctx); err != nil || !ok {
		t.Fatalf("publish to %q %s: confirmed %v, %v", exchange, key, ok, err)
	}
}

// event emits an event of type typ, emitted at at as its x-time says,
// through mesh.events (and so into the stream), with more headers.
func (h *history) event(t *testing.T, typ string, at time.Time, more amqp.Table) string {
	t.Helper()
	id := ulid.Make().String()
	headers := amqp.Table{"x-event-id": id, "x-source": "legacy", "x-node": "far", "x-time": at.UTC().Format(time.RFC3339Nano), "x-tenant": "acme"}
	for k, v := range more {
		headers[k] = v
	}
	h.publish(t, wire.ExchangeEvents, typ, amqp.Publishing{Headers: headers, ContentType: wire.ContentTypeJSON,
		DeliveryMode: amqp.Persistent, MessageId: id, UserId: "guest", Body: []byte(fmt.Sprintf(`{"id":%q}`, id))})
	return id
}

// tap is a queue of the test's own bound to mesh.events with pattern.
func (h *history) tap(t *testing.T, pattern string) (*amqp.Channel, string) {
	t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, pattern, wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	return ch, q.Name
}

// drain takes the n messages the tap holds, and fails if it holds
// another number: every send was confirmed, so all are there by now.
func (h *history) drain(t *testing.T, ch *amqp.Channel, queue string, n int) []amqp.Delivery {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	if err != nil || q.Messages != n {
		t.Fatalf("the tap holds %d messages (%v), want %d", q.Messages, err, n)
	}
	var out []amqp.Delivery
	for range n {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get from the tap: %v, %v", ok, err)
		}
		out = append(out, d)
	}
	return out
}

// pageHook runs before before the log's second page is read.
type pageHook struct {
	replay.Log
	pages  int
	before func()
}

func (p *pageHook) Page(ctx context.Context, after, upTo int64) ([]replay.Event, int64, error) {
	if p.pages++; p.pages == 2 {
		p.before()
	}
	return p.Log.Page(ctx, after, upTo)
}

func (h *history) log(t *testing.T, sel replay.HistorySelection, page int) *replay.HistoryLog {
	t.Helper()
	l, err := replay.NewHistoryLog(h.conn, replay.HistoryConfig{Stream: stream, Selection: sel, PageSize: page})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ids(evs []replay.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.ID)
	}
	return out
}

// TestHistoryReplaysTheWindow: a replay from the history sends exactly
// the events the stream held at its start whose x-time is in the window
// and whose type matches, with their ids, headers and bodies plus
// x-replay-id (read on the wire with raw amqp091-go); what comes into the
// stream after the marker (an event emitted during the replay, the
// replay's own sends) is not sent, nor are earlier replays' copies,
// markers, or messages that break the contract.
func TestHistoryReplaysTheWindow(t *testing.T) {
	h := newHistory(t)
	t0 := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Second)
	from, to := t0.Add(time.Hour), t0.Add(2*time.Hour)
	h.event(t, "mesh.order.placed", from.Add(-time.Second), nil)
	want := []string{
		h.event(t, "mesh.order.placed", from, nil), // the window includes its start
		h.event(t, "mesh.order.placed", from.Add(30*time.Minute), nil),
		h.event(t, "mesh.order.paid", from.Add(20*time.Minute), nil), // out of emit order
	}
	h.event(t, "mesh.stock.moved", from.Add(10*time.Minute), nil) // another type
	h.event(t, "mesh.order.placed", to, nil)                      // the window excludes its end
	h.event(t, "mesh.order.placed", to.Add(time.Hour), nil)
	h.event(t, "mesh.order.placed", from.Add(time.Minute), amqp.Table{"x-replay-id": "an-earlier-replay"})
	// Another replay's marker, straight to the stream.
	h.publish(t, "", stream, amqp.Publishing{Headers: amqp.Table{wire.HeaderHistoryMarker: "another"}, UserId: "guest", MessageId: "another"})
	want = append(want, h.event(t, "mesh.order.shipped", from.Add(40*time.Minute), nil))

	sel := replay.HistorySelection{From: from, To: to, Types: []string{"mesh.order.#"}}
	var listed []replay.Event
	res, err := replay.Run(h.ctx, h.conn, h.log(t, sel, 1000), replay.Options{DryRun: true, Listed: func(ev replay.Event) { listed = append(listed, ev) }})
	if err != nil || res.Selected != 4 || res.Sent != 0 {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	if got := ids(listed); !slices.Equal(got, []string{want[0], want[1], want[2], want[3]}) {
		t.Errorf("dry run listed %v, want %v in stream order", got, want)
	}
	ev := listed[0]
	if ev.Type != "mesh.order.placed" || !ev.Time.Equal(from) || ev.UserID != "guest" || ev.Headers["x-tenant"] != "acme" ||
		ev.Headers["x-source"] != "legacy" || string(ev.Body) != fmt.Sprintf(`{"id":%q}`, want[0]) {
		t.Errorf("listed %+v", ev)
	}
	if _, ok := ev.Headers[wire.HeaderStreamOffset]; ok {
		t.Errorf("the stream's offset is among the event's headers: %v", ev.Headers)
	}

	tap, q := h.tap(t, "mesh.order.#")
	var during string
	log := &pageHook{Log: h.log(t, sel, 2), before: func() {
		during = h.event(t, "mesh.order.placed", from.Add(5*time.Minute), nil) // in the window, after the cutoff
	}}
	res, err = replay.Run(h.ctx, h.conn, log, replay.Options{ID: ulid.Make().String()})
	if err != nil || res.Selected != 4 || res.Sent != 4 || during == "" || log.pages < 2 {
		t.Fatalf("replay: %+v after %d pages, %v", res, log.pages, err)
	}
	got := map[string]amqp.Delivery{}
	for _, d := range h.drain(t, tap, q, 5) { // the event emitted during it, and the 4 replayed
		if d.Headers["x-event-id"] == during {
			if _, replayed := d.Headers["x-replay-id"]; replayed {
				t.Errorf("%s, emitted after the cutoff, was replayed", during)
			}
			continue
		}
		got[d.MessageId] = d
	}
	for _, id := range want {
		d, ok := got[id]
		switch {
		case !ok:
			t.Errorf("%s was not replayed (got %v)", id, got)
		case d.Headers["x-event-id"] != id || d.Headers["x-replay-id"] != res.ID || d.Headers["x-tenant"] != "acme" ||
			string(d.Body) != fmt.Sprintf(`{"id":%q}`, id) || d.DeliveryMode != amqp.Persistent || d.UserId != "guest":
			t.Errorf("replay of %s on the wire: %+v", id, d)
		}
	}

	// Now the stream holds, before a new cutoff, the event emitted during
	// the replay and the replay's 4 copies: only the first is an event
	// of its own.
	listed = nil
	if res, err := replay.Run(h.ctx, h.conn, h.log(t, sel, 1000), replay.Options{DryRun: true, Listed: func(ev replay.Event) { listed = append(listed, ev) }}); err != nil || res.Selected != 5 {
		t.Fatalf("dry run after the replay: %+v, %v", res, err)
	}
	if got := ids(listed); !slices.Equal(got, append(slices.Clone(want), during)) {
		t.Errorf("dry run after the replay listed %v", got)
	}
	sel.Replays = true
	withCopies := h.log(t, sel, 1000)
	cutoff, err := withCopies.Cutoff(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := withCopies.Count(h.ctx, cutoff); err != nil || n != 10 { // 5, the earlier replay's copy, and this one's 4
		t.Errorf("with the replays' copies: %d, %v", n, err)
	}
}

// TestHistorySkipsWhatBreaksTheContract: messages in the stream that
// break the wire contract are neither counted nor replayed.
func TestHistorySkipsWhatBreaksTheContract(t *testing.T) {
	h := newHistory(t)
	at := time.Now().UTC().Add(-time.Hour)
	good := h.event(t, "mesh.order.placed", at, nil)
	stamp := at.Format(time.RFC3339Nano)
	for _, m := range []struct {
		what     string
		exchange string
		key      string
		msg      amqp.Publishing
	}{
		{"no event id", wire.ExchangeEvents, "mesh.order.placed", amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`),
			Headers: amqp.Table{"x-source": "legacy", "x-node": "far", "x-time": stamp}}},
		{"a body that is not JSON", wire.ExchangeEvents, "mesh.order.placed", amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{`),
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": stamp}}},
		{"another content type", wire.ExchangeEvents, "mesh.order.placed", amqp.Publishing{ContentType: "text/plain", Body: []byte(`{}`),
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": stamp}}},
		{"a time that is not one", wire.ExchangeEvents, "mesh.order.placed", amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`),
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": int64(5)}}},
		{"a type of two words", wire.ExchangeEvents, "mesh.order", amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`),
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": stamp}}},
		{"straight to the stream, with no type", "", stream, amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`), UserId: "guest",
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": stamp}}},
		{"straight to the stream, its type from no verified publisher", "", stream, amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`),
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "legacy", "x-node": "far", "x-time": stamp, wire.HeaderRoutingKey: "mesh.order.placed"}}},
	} {
		t.Log(m.what)
		h.publish(t, m.exchange, m.key, m.msg)
	}
	// Straight to the stream by a publisher the broker verified: the
	// runtime takes its type from x-mesh-routing-key, and so does a replay.
	direct := ulid.Make().String()
	h.publish(t, "", stream, amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`), UserId: "guest", MessageId: direct,
		Headers: amqp.Table{"x-event-id": direct, "x-source": "legacy", "x-node": "far", "x-time": stamp, wire.HeaderRoutingKey: "mesh.order.placed"}})

	tap, q := h.tap(t, "mesh.order.#")
	sel := replay.HistorySelection{From: at.Add(-time.Minute), To: at.Add(time.Minute)}
	res, err := replay.Run(h.ctx, h.conn, h.log(t, sel, 3), replay.Options{ID: ulid.Make().String()})
	if err != nil || res.Selected != 2 || res.Sent != 2 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	var got []string
	for _, d := range h.drain(t, tap, q, 2) {
		if d.Headers["x-replay-id"] != res.ID || d.RoutingKey != "mesh.order.placed" {
			t.Errorf("on the wire: %+v", d)
		}
		got = append(got, d.MessageId)
	}
	if want := []string{good, direct}; !slices.Equal(got, want) {
		t.Errorf("replayed %v, want %v", got, want)
	}
}

// TestHistorySelection: each field of the selection selects, the window
// on x-time whatever the arrival; a window in the future (an emitter's
// clock ahead) still ends at the cutoff.
func TestHistorySelection(t *testing.T) {
	h := newHistory(t)
	now := time.Now().UTC()
	a := h.event(t, "mesh.order.placed", now.Add(-time.Hour), nil)
	b := h.event(t, "module.shop.order.paid", now.Add(-time.Hour), nil)
	ahead := h.event(t, "mesh.order.placed", now.Add(30*time.Minute), nil)
	other := ulid.Make().String()
	h.publish(t, wire.ExchangeEvents, "mesh.order.placed", amqp.Publishing{ContentType: wire.ContentTypeJSON, Body: []byte(`{}`), MessageId: other,
		Headers: amqp.Table{"x-event-id": other, "x-source": "web", "x-node": "near", "x-time": now.Add(-time.Hour).Format(time.RFC3339Nano)}})
	for _, c := range []struct {
		name string
		sel  replay.HistorySelection
		want []string
	}{
		{"a type pattern", replay.HistorySelection{Types: []string{"module.*.order.*"}}, []string{b}},
		{"types", replay.HistorySelection{Types: []string{"mesh.order.placed", "module.#"}, To: now}, []string{a, b, other}},
		{"a source", replay.HistorySelection{Sources: []string{"web"}, Types: []string{"mesh.#"}}, []string{other}},
		{"nodes", replay.HistorySelection{Nodes: []string{"far"}, To: now}, []string{a, b}},
		{"a user", replay.HistorySelection{UserIDs: []string{"guest"}, IDs: []string{a, ahead}}, []string{a, ahead}},
		{"another user", replay.HistorySelection{UserIDs: []string{"nobody"}}, nil},
		{"ids", replay.HistorySelection{IDs: []string{b, other}}, []string{b, other}},
		{"a window in the future", replay.HistorySelection{From: now.Add(20 * time.Minute), To: now.Add(time.Hour)}, []string{ahead}},
	} {
		var listed []replay.Event
		res, err := replay.Run(h.ctx, h.conn, h.log(t, c.sel, 1), replay.Options{DryRun: true, Listed: func(ev replay.Event) { listed = append(listed, ev) }})
		if err != nil || res.Selected != len(c.want) {
			t.Errorf("%s: %+v, %v", c.name, res, err)
		}
		if got := ids(listed); !slices.Equal(got, c.want) {
			t.Errorf("%s: listed %v, want %v", c.name, got, c.want)
		}
	}
}

// TestHistoryPages: a page holds at most the page size; its cursor is
// the offset to read next, 0 only at the cutoff.
func TestHistoryPages(t *testing.T) {
	h := newHistory(t)
	at := time.Now().UTC().Add(-time.Hour)
	var want []string
	for range 5 {
		want = append(want, h.event(t, "mesh.order.placed", at, nil))
	}
	l := h.log(t, replay.HistorySelection{Types: []string{"mesh.order.#"}}, 2)
	cutoff, err := l.Cutoff(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.event(t, "mesh.order.placed", at, nil) // after the cutoff
	if n, err := l.Count(h.ctx, cutoff); err != nil || n != 5 {
		t.Fatalf("count %d, %v", n, err)
	}
	var got []string
	var sizes []int
	for after := int64(0); ; {
		page, next, err := l.Page(h.ctx, after, cutoff)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		got = append(got, ids(page)...)
		if next == 0 {
			break
		}
		if next <= after || next > cutoff {
			t.Fatalf("cursor %d after %d (cutoff %d)", next, after, cutoff)
		}
		after = next
	}
	if !slices.Equal(got, want) || !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Errorf("pages of %v: %v, want %v", sizes, got, want)
	}
}

func TestHistoryConfigValidate(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		cfg  replay.HistoryConfig
		want string
	}{
		{replay.HistoryConfig{}, "stream"},
		{replay.HistoryConfig{Stream: "mesh.history", Selection: replay.HistorySelection{Types: []string{"mesh..x"}}}, "type"},
		{replay.HistoryConfig{Stream: "mesh.history", Selection: replay.HistorySelection{From: now, To: now}}, "not after"},
		{replay.HistoryConfig{Stream: "mesh.history", PageSize: -1}, "page size"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want one about %s", c.cfg, err, c.want)
		}
	}
	if err := (replay.HistoryConfig{Stream: "mesh.history", Selection: replay.HistorySelection{From: now, To: now.Add(time.Second), Types: []string{"mesh.#"}}}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestHistoryStreamMissing: a replay from a stream that is not there
// fails before it writes or sends anything.
func TestHistoryStreamMissing(t *testing.T) {
	h := newHistory(t)
	l, err := replay.NewHistoryLog(h.conn, replay.HistoryConfig{Stream: "mesh.nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replay.Run(h.ctx, h.conn, l, replay.Options{ID: ulid.Make().String()}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("replay from a missing stream: %v", err)
	}
}
