package deadletters

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

func TestSplitModuleQueue(t *testing.T) {
	for _, tc := range []struct {
		queue, node, module string
		ok                  bool
	}{
		{"n1.billing.events", "n1", "billing", true},
		{"node-a.shop_2.events", "node-a", "shop_2", true},
		{"n1.billing", "", "", false},
		{"billing.events", "", "", false},
		{".billing.events", "", "", false},
		{"n1..events", "", "", false},
		{"n1.a.b.events", "", "", false},
		{"serve.greet.hello", "", "", false},
		{"mesh.dead-letters", "", "", false},
		{"", "", "", false},
		{".events", "", "", false},
	} {
		node, module, ok := splitModuleQueue(tc.queue)
		if node != tc.node || module != tc.module || ok != tc.ok {
			t.Errorf("splitModuleQueue(%q) = %q, %q, %v; want %q, %q, %v", tc.queue, node, module, ok, tc.node, tc.module, tc.ok)
		}
	}
}

func TestMessageOf(t *testing.T) {
	dead := time.Date(2026, 11, 30, 10, 0, 0, 123, time.UTC)
	died := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	emitted := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	base := func() amqp.Table {
		return amqp.Table{
			wire.HeaderEventID: "01ID", wire.HeaderSource: "shop", wire.HeaderNode: "n0",
			wire.HeaderTime: emitted.Format(time.RFC3339Nano),
		}
	}
	xdeath := []any{
		amqp.Table{"queue": "n2.audit.events", "reason": "delivery_limit", "time": died, "exchange": ""},
		amqp.Table{"queue": "n3.older.events", "reason": "expired", "time": emitted},
	}
	for _, tc := range []struct {
		name   string
		d      amqp.Delivery
		dead   bool
		want   Message
		ignore bool
	}{
		{
			name: "runtime dead letter",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.shop.order.created", Exchange: wire.ExchangeDead, Body: []byte(`{}`),
				Headers: with(base(), amqp.Table{wire.HeaderDeadQueue: "n1.billing.events", wire.HeaderDeadAttempts: int64(5),
					wire.HeaderDeadReason: "permanent", wire.HeaderDeadError: "boom", wire.HeaderDeadTime: dead.Format(time.RFC3339Nano)})},
			want: Message{ID: "01ID", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Queue: "n1.billing.events",
				Node: "n1", Module: "billing", Reason: "permanent", Error: "boom", Attempts: 5, Time: dead, Size: 2},
		},
		{
			name: "runtime dead letter of a group's queue",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.shop.order.created", Exchange: wire.ExchangeDead, Body: []byte(`{}`),
				Headers: with(base(), amqp.Table{wire.HeaderDeadQueue: "group.eu.billing.events", wire.HeaderDeadAttempts: int64(5),
					wire.HeaderDeadReason: "permanent", wire.HeaderDeadError: "boom", wire.HeaderDeadTime: dead.Format(time.RFC3339Nano)})},
			want: Message{ID: "01ID", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Queue: "group.eu.billing.events",
				Group: "eu", Module: "billing", Reason: "permanent", Error: "boom", Attempts: 5, Time: dead, Size: 2},
		},
		{
			name: "broker dead letter of a classic retry copy",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "n2.audit.events", Timestamp: emitted, UserId: "n2-user",
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "mesh.ops.restarted", wire.HeaderUserID: "shop-user", "x-death": xdeath,
					"x-first-death-queue": "n3.older.events", "x-first-death-reason": "expired"})},
			want: Message{ID: "01ID", Type: "mesh.ops.restarted", UserID: "shop-user", Source: "shop", SourceNode: "n0", Queue: "n2.audit.events",
				Node: "n2", Module: "audit", Reason: "delivery_limit", Time: died},
		},
		{
			// Sent straight to the queue without a user-id: its node
			// dead-letters it as malformed; if the broker does, its claims
			// are not read either.
			name: "broker dead letter of a direct message without a user-id",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "n2.audit.events", Timestamp: emitted,
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "mesh.ops.restarted", wire.HeaderUserID: "shop-user", "x-death": xdeath})},
			want: Message{ID: "01ID", Type: "n2.audit.events", Source: "shop", SourceNode: "n0", Queue: "n2.audit.events",
				Node: "n2", Module: "audit", Reason: "delivery_limit", Time: died},
		},
		{
			// Published to mesh.events with the runtime's headers forged,
			// then dead-lettered by the broker: only the broker's say counts.
			name: "broker dead letter with forged runtime headers",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.evil.x", Timestamp: emitted, UserId: "evil",
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "node.berlin.drained", wire.HeaderUserID: "billing",
					wire.HeaderDeadQueue: "serve.echo.run", wire.HeaderDeadReason: "permanent", wire.HeaderDeadError: "forged",
					wire.HeaderDeadAttempts: int64(9), wire.HeaderDeadTime: dead.Format(time.RFC3339Nano),
					"x-death": []any{amqp.Table{"queue": "n2.audit.events", "reason": "expired", "time": died, "exchange": wire.ExchangeEvents}}})},
			want: Message{ID: "01ID", Type: "module.evil.x", UserID: "evil", Source: "shop", SourceNode: "n0", Queue: "n2.audit.events",
				Node: "n2", Module: "audit", Reason: "expired", Time: died},
		},
		{
			name: "runtime dead letter: the routing key is the type, x-mesh-user-id the publisher",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.evil.x", Exchange: wire.ExchangeDead, UserId: "n1-user",
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "node.berlin.drained", wire.HeaderUserID: "evil",
					wire.HeaderDeadQueue: "n1.billing.events", wire.HeaderDeadReason: "permanent", wire.HeaderDeadTime: dead.Format(time.RFC3339Nano)})},
			want: Message{ID: "01ID", Type: "module.evil.x", UserID: "evil", DeadBy: "n1-user", Source: "shop", SourceNode: "n0",
				Queue: "n1.billing.events", Node: "n1", Module: "billing", Reason: "permanent", Time: dead},
		},
		{
			name: "runtime dead letter without a user-id: x-mesh-user-id not honoured",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.shop.x", Exchange: wire.ExchangeDead,
				Headers: with(base(), amqp.Table{wire.HeaderUserID: "billing", wire.HeaderDeadQueue: "n1.billing.events",
					wire.HeaderDeadReason: "permanent", wire.HeaderDeadTime: dead.Format(time.RFC3339Nano)})},
			want: Message{ID: "01ID", Type: "module.shop.x", Source: "shop", SourceNode: "n0",
				Queue: "n1.billing.events", Node: "n1", Module: "billing", Reason: "permanent", Time: dead},
		},
		{
			name: "unrouted event through mesh.events: the header is not the type",
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.evil.x", Exchange: wire.ExchangeEvents, UserId: "evil",
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "node.berlin.drained", wire.HeaderUserID: "billing"})},
			want: Message{ID: "01ID", Type: "module.evil.x", UserID: "evil", Source: "shop", SourceNode: "n0", Time: emitted},
		},
		{
			name: "unrouted event a node kept itself",
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: wire.QueueUnrouted, UserId: "n1-user",
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "module.shop.x"})},
			want: Message{ID: "01ID", Type: "module.shop.x", UserID: "n1-user", Source: "shop", SourceNode: "n0", Time: emitted},
		},
		{
			name: "broker dead letter with only x-first-death",
			dead: true,
			d: amqp.Delivery{RoutingKey: "mesh.ops.restarted", Timestamp: emitted,
				Headers: with(base(), amqp.Table{"x-first-death-queue": []byte("n3.older.events"), "x-first-death-reason": "expired"})},
			// No message id: x-event-id. No dead time: the emit time is
			// not one.
			want: Message{ID: "01ID", Type: "mesh.ops.restarted", Source: "shop", SourceNode: "n0", Queue: "n3.older.events",
				Node: "n3", Module: "older", Reason: "expired"},
		},
		{
			name: "headers of the wrong types",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "mesh.ops.restarted",
				Headers: amqp.Table{wire.HeaderSource: int64(4), wire.HeaderDeadAttempts: "five", wire.HeaderDeadTime: "yesterday",
					wire.HeaderDeadQueue: 7, "x-death": []any{"not a table", amqp.Table{"queue": 3, "time": "noon"}}}},
			want: Message{ID: "01ID", Type: "mesh.ops.restarted"},
		},
		{
			name: "negative attempts",
			dead: true,
			d:    amqp.Delivery{MessageId: "01ID", Headers: amqp.Table{wire.HeaderDeadAttempts: int32(-3)}},
			want: Message{ID: "01ID"},
		},
		{
			name: "unrouted event: time from the timestamp",
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "module.shop.order.created", Exchange: wire.ExchangeEvents,
				Timestamp: emitted.Add(time.Second), Headers: base()},
			want: Message{ID: "01ID", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Time: emitted.Add(time.Second)},
		},
		{
			name: "unrouted event: time from x-time",
			d:    amqp.Delivery{MessageId: "01ID", RoutingKey: "module.shop.order.created", Headers: base()},
			want: Message{ID: "01ID", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Time: emitted},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := messageOf(tc.d, tc.dead)
			got.Headers, got.Body, got.Exchange, got.RoutingKey, got.ContentType = nil, nil, "", "", ""
			if !got.Time.Equal(tc.want.Time) || got.Time.Location() != time.UTC {
				t.Errorf("time %v, want %v UTC", got.Time, tc.want.Time)
			}
			got.Time, tc.want.Time = time.Time{}, time.Time{}
			if got.ID != tc.want.ID || got.Type != tc.want.Type || got.Source != tc.want.Source || got.SourceNode != tc.want.SourceNode ||
				got.Queue != tc.want.Queue || got.Node != tc.want.Node || got.Module != tc.want.Module || got.Reason != tc.want.Reason ||
				got.Error != tc.want.Error || got.Attempts != tc.want.Attempts || got.Size != tc.want.Size ||
				got.UserID != tc.want.UserID || got.DeadBy != tc.want.DeadBy {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func with(h, more amqp.Table) amqp.Table {
	for k, v := range more {
		h[k] = v
	}
	return h
}

func TestFilterMatch(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	dl := Message{ID: "A", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Node: "n1", Module: "billing", Queue: "n1.billing.events",
		Time: now.Add(-time.Hour), Headers: amqp.Table{wire.HeaderEventID: "EV"}}
	for _, tc := range []struct {
		f          Filter
		dead, want bool
	}{
		{Filter{}, true, true},
		{Filter{Module: "billing"}, true, true},
		{Filter{Module: "billing"}, false, false}, // unrouted: the module is the source
		{Filter{Module: "shop"}, false, true},
		{Filter{Node: "n1"}, true, true},
		{Filter{Node: "n0"}, false, true},
		{Filter{Node: "n0"}, true, false},
		{Filter{Type: "module.#"}, true, true},
		{Filter{Type: "module.*.order"}, true, false},
		{Filter{Type: "#.created"}, true, true},
		{Filter{OlderThan: 30 * time.Minute}, true, true},
		{Filter{OlderThan: 2 * time.Hour}, true, false},
		{Filter{NewerThan: 2 * time.Hour}, true, true},
		{Filter{NewerThan: 30 * time.Minute}, true, false},
		{Filter{IDs: []string{"B", "A"}}, true, true},
		{Filter{IDs: []string{"EV"}}, true, true},
		{Filter{IDs: []string{"B"}}, true, false},
		{Filter{IDs: []string{"A"}, Queue: "n1.billing.events"}, true, true},
		{Filter{IDs: []string{"A"}, Queue: "n2.mailer.events"}, true, false}, // the same event dead-lettered by another queue
		{Filter{Queue: "n1.billing.events"}, false, false},                   // an unrouted event has no such queue
	} {
		if got := tc.f.match(dl, tc.dead, now); got != tc.want {
			t.Errorf("%+v (dead=%v) matched %v, want %v", tc.f, tc.dead, got, tc.want)
		}
	}
	unknownTime := dl
	unknownTime.Time = time.Time{}
	if (Filter{OlderThan: time.Second}).match(unknownTime, true, now) || (Filter{NewerThan: time.Hour}).match(unknownTime, true, now) {
		t.Error("a message of unknown time matched an age filter")
	}
}

func TestDroppedOnReplay(t *testing.T) {
	for _, k := range []string{"x-delivery-count", "x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange",
		"x-last-death-queue", wire.HeaderAttempt, wire.HeaderDeadQueue, wire.HeaderDeadAttempts, wire.HeaderDeadReason,
		wire.HeaderDeadError, wire.HeaderDeadTime, wire.HeaderRoutingKey, wire.HeaderUserID, "x-mesh-future"} {
		if !droppedOnReplay(k) {
			t.Errorf("%s is kept on replay", k)
		}
	}
	for _, k := range []string{wire.HeaderEventID, wire.HeaderSource, wire.HeaderNode, wire.HeaderTime, wire.HeaderCausationID,
		wire.HeaderSchema, wire.HeaderTraceParent, wire.HeaderReplayID, "x-tenant"} {
		if droppedOnReplay(k) {
			t.Errorf("%s is dropped on replay", k)
		}
	}
}

// TestCheckTarget: a dead letter goes back to a module's event queue or a
// queue a module consumes, never to one of the mesh's own, whatever the
// dead letter names.
func TestCheckTarget(t *testing.T) {
	for _, q := range []string{"n1.billing.events", "berlin.audit-logger.events", "shop.orders", "orders", "a.b.c.events",
		"mesh.shop.events", "serve.shop.events"} { // a node named mesh or serve has module queues too
		if err := checkTarget(q); err != nil {
			t.Errorf("checkTarget(%q) = %v, want it allowed", q, err)
		}
	}
	for q, why := range map[string]string{
		"serve.echo.run": "serve.*", "serve.x": "serve.*", "mesh.dead-letters": "mesh.*", "mesh.unrouted": "mesh.*",
		"mesh.node.n1.lock": "mesh.*", "amq.gen-abc": "amq.*", "n1.billing.dead": "*.dead", "orders.dead": "*.dead",
	} {
		err := checkTarget(q)
		if !errors.Is(err, ErrForbiddenTarget) || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), q) {
			t.Errorf("checkTarget(%q) = %v, want ErrForbiddenTarget naming %s", q, err, why)
		}
	}
	for _, q := range []string{"", "has space", strings.Repeat("q", 256)} {
		if err := checkTarget(q); !errors.Is(err, ErrNoTarget) {
			t.Errorf("checkTarget(%q) = %v, want ErrNoTarget", q, err)
		}
	}
}

// FuzzSplitModuleQueue checks that whatever splitModuleQueue accepts is the
// queue wire.ModuleQueue makes of the node and module it returns, each a
// non-empty word without dots.
func FuzzSplitModuleQueue(f *testing.F) {
	for _, s := range []string{"n1.billing.events", "a.b.c.events", ".events", "x..events", "n.m.events.events", "", "events"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, queue string) {
		node, module, ok := splitModuleQueue(queue)
		if !ok {
			if node != "" || module != "" {
				t.Fatalf("refused %q but returned %q, %q", queue, node, module)
			}
			return
		}
		if node == "" || module == "" || strings.Contains(node, ".") || strings.Contains(module, ".") {
			t.Fatalf("%q split into %q, %q", queue, node, module)
		}
		if wire.ModuleQueue(node, module) != queue {
			t.Fatalf("%q split into %q, %q, which make %q", queue, node, module, wire.ModuleQueue(node, module))
		}
	})
}

// FuzzMessageOf reads deliveries whose headers carry fuzzed values of
// fuzzed types, as another client or a broker version might send them: it
// never panics, attempts are never negative, a time is UTC, and node and
// module come from the queue that gave up. And the runtime's headers are
// honoured only where the runtime put them: without a user-id neither the
// type nor the user is taken from a header; a runtime dead letter, and an
// unrouted event that came through an exchange, are of their routing key's
// type; a broker-made dead letter names the queue the broker says.
func FuzzMessageOf(f *testing.F) {
	f.Add("n1.billing.events", "permanent", "2026-11-30T10:00:00Z", int64(3), byte(0), "n2.audit.events", int64(1700000000), true,
		"", "guest", "module.a.b", "node.x.y", "other")
	f.Add("", "", "", int64(-1), byte(1), "", int64(0), false, "mesh.events", "", "module.a.b", "node.x.y", "")
	f.Add("a.b.c.events", "x", "not a time", int64(1<<40), byte(2), "q", int64(-62135596800), true, "", "", "q", "mesh.a.b", "u")
	f.Add("serve.echo.run", "permanent", "", int64(1), byte(16), "n1.shop.events", int64(0), true, "", "n1", "n1.shop.events", "module.s.x", "me")
	f.Fuzz(func(t *testing.T, queue, reason, when string, attempts int64, kind byte, deathQueue string, deathUnix int64, dead bool,
		exchange, userID, routingKey, forgedType, forgedUser string) {
		h := amqp.Table{}
		// kind picks the types the headers come in.
		switch kind % 4 {
		case 0:
			h[wire.HeaderDeadQueue] = queue
			h[wire.HeaderDeadReason] = reason
			h[wire.HeaderDeadTime] = when
			h[wire.HeaderDeadAttempts] = attempts
		case 1:
			h[wire.HeaderDeadQueue] = []byte(queue)
			h[wire.HeaderDeadAttempts] = int32(attempts)
			h[wire.HeaderDeadTime] = []byte(when)
		case 2:
			h[wire.HeaderDeadAttempts] = when
			h[wire.HeaderDeadTime] = attempts
		case 3:
			h[wire.HeaderDeadAttempts] = uint8(attempts)
		}
		entry := amqp.Table{"queue": deathQueue, "reason": reason, "time": time.Unix(deathUnix, 0), "exchange": exchange}
		byBroker := deathQueue != "" // the broker always names the queue
		switch kind / 4 % 5 {
		case 0:
			h["x-death"] = []any{entry}
		case 1:
			h["x-death"] = []any{map[string]any(entry), nil}
		case 2:
			h["x-death"] = entry // not a list: junk, no broker's
			byBroker = false
		case 3:
			h["x-first-death-queue"] = deathQueue
			h["x-first-death-reason"] = []byte(reason)
			h["x-first-death-exchange"] = exchange
		case 4:
			byBroker = false // a dead letter the runtime made, or an unrouted event
		}
		switch kind / 20 % 3 {
		case 0:
			h[wire.HeaderRoutingKey] = forgedType
			h[wire.HeaderUserID] = forgedUser
		case 1:
			h[wire.HeaderRoutingKey] = []byte(forgedType)
			h[wire.HeaderUserID] = int64(len(forgedUser))
		}
		h[wire.HeaderTime] = when
		d := amqp.Delivery{Headers: h, Timestamp: time.Unix(deathUnix, 0), Exchange: exchange, UserId: userID, RoutingKey: routingKey}
		m := messageOf(d, dead)
		if userID == "" && (m.UserID != "" || m.Type != routingKey) {
			t.Fatalf("no user-id, yet read as type %q (key %q) from user %q", m.Type, routingKey, m.UserID)
		}
		if ((dead && !byBroker) || (!dead && exchange != "")) && m.Type != routingKey {
			t.Fatalf("type %q, want the routing key %q (dead %v, by the broker %v, exchange %q)", m.Type, routingKey, dead, byBroker, exchange)
		}
		if m.DeadBy != "" && (m.DeadBy != userID || !dead || byBroker) {
			t.Fatalf("dead by %q (user-id %q, dead %v, by the broker %v)", m.DeadBy, userID, dead, byBroker)
		}
		if dead && byBroker && m.Queue != "" && m.Queue != deathQueue {
			t.Fatalf("a dead letter the broker made names queue %q, the broker said %q", m.Queue, deathQueue)
		}
		if m.Attempts < 0 {
			t.Fatalf("attempts %d", m.Attempts)
		}
		if !m.Time.IsZero() && m.Time.Location() != time.UTC {
			t.Fatalf("time %v not UTC", m.Time)
		}
		if node, module, _ := splitModuleQueue(m.Queue); node != m.Node || module != m.Module {
			t.Fatalf("queue %q read as node %q module %q", m.Queue, m.Node, m.Module)
		}
	})
}

// TestMessageOfACloudEvent: a CloudEvent a module consumed and gave up on
// is listed by its CloudEvents id and source, as Consume read them.
func TestMessageOfACloudEvent(t *testing.T) {
	d := amqp.Delivery{RoutingKey: "com.example.order", Headers: amqp.Table{wire.HeaderDeadQueue: "n1.taker.events", wire.HeaderDeadReason: "permanent",
		"ce-specversion": "1.0", "ce-id": "order-9", "ce-source": "/shop", "ce-type": "com.example.order"}, Body: []byte(`{}`)}
	m := messageOf(d, true)
	if m.ID != "order-9" || m.Source != "/shop" || m.Queue != "n1.taker.events" || !(Filter{IDs: []string{"order-9"}}).match(m, true, time.Now()) {
		t.Errorf("%+v", m)
	}
	d = amqp.Delivery{ContentType: "application/cloudevents+json", Body: []byte(`{"specversion":"1.0","id":"s-1","source":"/s","type":"t"}`)}
	if m := messageOf(d, false); m.ID != "s-1" || m.Source != "/s" {
		t.Errorf("structured: %+v", m)
	}
}

// TestKeepSummariesAndPreviews: a summary keeps the fields, cut to their
// bounds, in copies of their own, and neither headers nor body; a body
// limit keeps a copy of the body's first bytes and the whole size.
func TestKeepSummariesAndPreviews(t *testing.T) {
	long := strings.Repeat("é", SummaryError) // 2 bytes a rune: cut on a rune
	body := []byte(strings.Repeat("b", 1000))
	m := Message{ID: "id-1", Type: long, Error: long, Queue: "n1.billing.events", Node: "n1", Module: "billing",
		Headers: amqp.Table{"x": long}, Body: body, Size: len(body)}

	s := collectOptions([]Option{Summaries()}).keep(m)
	if s.Headers != nil || s.Body != nil || s.Size != 1000 || s.ID != "id-1" || s.Queue != "n1.billing.events" || s.Module != "billing" {
		t.Errorf("summary: %+v", s)
	}
	if len(s.Type) > SummaryText+len("…") || !strings.HasSuffix(s.Type, "…") || !utf8.ValidString(s.Type) {
		t.Errorf("summary type: %d bytes %q", len(s.Type), s.Type[max(0, len(s.Type)-8):])
	}
	if len(s.Error) > SummaryError+len("…") || len(s.Error) < SummaryError-1 || !utf8.ValidString(s.Error) {
		t.Errorf("summary error: %d bytes", len(s.Error))
	}
	if unsafe.StringData(s.ID) == unsafe.StringData(m.ID) {
		t.Error("a summary's field shares the memory it was read from")
	}

	p := collectOptions([]Option{WithBodyLimit(10)}).keep(m)
	if string(p.Body) != "bbbbbbbbbb" || p.Size != 1000 || cap(p.Body) >= 1000 || p.Headers == nil || p.Type != long {
		t.Errorf("body limit 10: body %q (cap %d), size %d", p.Body, cap(p.Body), p.Size)
	}
	if w := collectOptions(nil).keep(m); len(w.Body) != 1000 {
		t.Errorf("no option: %d bytes of body, want all 1000", len(w.Body))
	}
	for largest, want := range map[int]int{0: browseWindow, 100: browseWindow, 64 << 10: 128, 1 << 20: 8, 100 << 20: 1} {
		if got := nextWindowSize(largest); got != want {
			t.Errorf("the window after bodies of %d bytes: %d, want %d", largest, got, want)
		}
	}
}
