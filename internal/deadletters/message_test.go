package deadletters

import (
	"strings"
	"testing"
	"time"

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
		amqp.Table{"queue": "n2.audit.events", "reason": "delivery_limit", "time": died},
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
			name: "broker dead letter of a classic retry copy",
			dead: true,
			d: amqp.Delivery{MessageId: "01ID", RoutingKey: "n2.audit.events", Timestamp: emitted,
				Headers: with(base(), amqp.Table{wire.HeaderRoutingKey: "mesh.ops.restarted", "x-death": xdeath,
					"x-first-death-queue": "n3.older.events", "x-first-death-reason": "expired"})},
			want: Message{ID: "01ID", Type: "mesh.ops.restarted", Source: "shop", SourceNode: "n0", Queue: "n2.audit.events",
				Node: "n2", Module: "audit", Reason: "delivery_limit", Time: died},
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
				got.Error != tc.want.Error || got.Attempts != tc.want.Attempts || got.Size != tc.want.Size {
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
	dl := Message{ID: "A", Type: "module.shop.order.created", Source: "shop", SourceNode: "n0", Node: "n1", Module: "billing",
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
		wire.HeaderDeadError, wire.HeaderDeadTime} {
		if !droppedOnReplay(k) {
			t.Errorf("%s is kept on replay", k)
		}
	}
	for _, k := range []string{wire.HeaderEventID, wire.HeaderSource, wire.HeaderNode, wire.HeaderTime, wire.HeaderCausationID,
		wire.HeaderSchema, wire.HeaderRoutingKey, wire.HeaderTraceParent, "x-tenant"} {
		if droppedOnReplay(k) {
			t.Errorf("%s is dropped on replay", k)
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
// module come from the queue that gave up.
func FuzzMessageOf(f *testing.F) {
	f.Add("n1.billing.events", "permanent", "2026-11-30T10:00:00Z", int64(3), byte(0), "n2.audit.events", int64(1700000000), true)
	f.Add("", "", "", int64(-1), byte(1), "", int64(0), false)
	f.Add("a.b.c.events", "x", "not a time", int64(1<<40), byte(2), "q", int64(-62135596800), true)
	f.Fuzz(func(t *testing.T, queue, reason, when string, attempts int64, kind byte, deathQueue string, deathUnix int64, dead bool) {
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
		entry := amqp.Table{"queue": deathQueue, "reason": reason, "time": time.Unix(deathUnix, 0)}
		switch kind / 4 % 4 {
		case 0:
			h["x-death"] = []any{entry}
		case 1:
			h["x-death"] = []any{map[string]any(entry), nil}
		case 2:
			h["x-death"] = entry
		case 3:
			h["x-first-death-queue"] = deathQueue
			h["x-first-death-reason"] = []byte(reason)
		}
		h[wire.HeaderTime] = when
		m := messageOf(amqp.Delivery{Headers: h, Timestamp: time.Unix(deathUnix, 0)}, dead)
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
