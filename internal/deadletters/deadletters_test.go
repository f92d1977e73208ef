package deadletters_test

import (
	"errors"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

func ids(msgs []deadletters.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	sort.Strings(out)
	return out
}

func sorted(s ...string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// TestListFilters puts runtime-made and broker-made dead letters in the
// queue and lists them with each filter; listing leaves every one in place.
func TestListFilters(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	now := time.Now()
	a := newEvent("module.shop.order.created", "shop", `{"n":1}`)
	b := newEvent("module.shop.order.paid", "shop", `{"n":2}`)
	c := newEvent("mesh.ops.restarted", "meshctl", `{"n":3}`)
	d := newEvent("module.shop.order.created", "shop", `{"n":4}`)
	m.deadLetter(a, "n1.billing.events", 1, wire.DeadReasonPermanent, "card declined", now.Add(-2*time.Hour))
	m.deadLetter(b, "n1.mailer.events", 5, wire.DeadReasonDeliveryLimit, "smtp down", now.Add(-10*time.Minute))
	m.deadLetter(c, "n2.billing.events", 1, wire.DeadReasonMalformed, "bad body", now.Add(-time.Minute))
	// d was dead-lettered by the broker: no x-mesh-dead-* headers, only
	// x-death, from a classic retry copy (routing key = queue name, sent
	// by its node with a user-id, which is what makes x-mesh-routing-key
	// count).
	dm := d.publishing()
	dm.UserId = "guest"
	dm.Headers[wire.HeaderRoutingKey] = d.typ
	dm.Headers[wire.HeaderAttempt] = int64(2)
	dm.Headers["x-death"] = []any{amqp.Table{
		"queue": "n2.audit.events", "reason": "expired", "count": int64(1), "exchange": "",
		"routing-keys": []any{"n2.audit.events"}, "time": now.Add(-3 * time.Hour).Truncate(time.Second),
	}}
	dm.Headers["x-first-death-queue"] = "n2.audit.events"
	dm.Headers["x-first-death-reason"] = "expired"
	m.publish(wire.ExchangeDead, "n2.audit.events", dm)

	all, err := deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("listed %d dead letters, want 4", len(all))
	}
	got := all[0]
	if got.ID != a.id || got.Type != a.typ || got.Source != "shop" || got.SourceNode != "n0" || got.Queue != "n1.billing.events" ||
		got.Node != "n1" || got.Module != "billing" || got.Reason != "permanent" || got.Error != "card declined" ||
		got.Attempts != 1 || got.Size != len(a.body) || string(got.Body) != a.body || got.Exchange != wire.ExchangeDead ||
		!got.Time.Equal(now.Add(-2*time.Hour).UTC()) || got.Time.Location() != time.UTC {
		t.Errorf("first dead letter read as %+v", got)
	}
	got = all[3]
	if got.ID != d.id || got.Type != d.typ || got.RoutingKey != "n2.audit.events" || got.Queue != "n2.audit.events" ||
		got.Node != "n2" || got.Module != "audit" || got.Reason != "expired" || got.Attempts != 0 ||
		!got.Time.Equal(now.Add(-3*time.Hour).Truncate(time.Second)) {
		t.Errorf("broker-made dead letter read as %+v", got)
	}

	for _, tc := range []struct {
		name string
		f    deadletters.Filter
		want []string
	}{
		{"module", deadletters.Filter{Module: "billing"}, sorted(a.id, c.id)},
		{"node", deadletters.Filter{Node: "n2"}, sorted(c.id, d.id)},
		{"module and node", deadletters.Filter{Module: "billing", Node: "n2"}, sorted(c.id)},
		{"type", deadletters.Filter{Type: "module.shop.#"}, sorted(a.id, b.id, d.id)},
		{"type star", deadletters.Filter{Type: "*.*.order.created"}, sorted(a.id, d.id)},
		{"type exact", deadletters.Filter{Type: "mesh.ops.restarted"}, sorted(c.id)},
		{"older than", deadletters.Filter{OlderThan: time.Hour}, sorted(a.id, d.id)},
		{"newer than", deadletters.Filter{NewerThan: 30 * time.Minute}, sorted(b.id, c.id)},
		{"age window", deadletters.Filter{OlderThan: 5 * time.Minute, NewerThan: 150 * time.Minute}, sorted(a.id, b.id)},
		{"ids", deadletters.Filter{IDs: []string{b.id, d.id, "01NOTTHERE0000000000000000"}}, sorted(b.id, d.id)},
		{"nothing", deadletters.Filter{Module: "nobody"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := deadletters.List(ctx, m.conn, wire.QueueDead, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(msgs); !slices.Equal(g, tc.want) {
				t.Errorf("listed %v, want %v", g, tc.want)
			}
		})
	}
	if n := m.count(wire.QueueDead, 4); n != 4 {
		t.Errorf("after listing the queue holds %d, want 4", n)
	}
}

// TestShow shows messages by id and names the ids it did not find.
func TestShow(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	a := newEvent("module.shop.order.created", "shop", `{"n":1}`)
	b := newEvent("module.shop.order.paid", "shop", `{"n":2}`)
	m.deadLetter(a, "n1.billing.events", 3, wire.DeadReasonDeliveryLimit, "boom", time.Now())
	m.deadLetter(b, "n1.billing.events", 3, wire.DeadReasonDeliveryLimit, "boom", time.Now())
	msgs, err := deadletters.Show(ctx, m.conn, wire.QueueDead, []string{b.id})
	if err != nil || len(msgs) != 1 || msgs[0].ID != b.id || string(msgs[0].Body) != b.body ||
		msgs[0].Headers[wire.HeaderEventID] != b.id {
		t.Fatalf("show %s: %+v, %v", b.id, msgs, err)
	}
	msgs, err = deadletters.Show(ctx, m.conn, wire.QueueDead, []string{a.id, "01MISSING000000000000000000"})
	if !errors.Is(err, deadletters.ErrNotFound) || !strings.Contains(err.Error(), "01MISSING000000000000000000") ||
		len(msgs) != 1 || msgs[0].ID != a.id {
		t.Errorf("show with a missing id: %v, %v", ids(msgs), err)
	}
	if _, err := deadletters.Show(ctx, m.conn, wire.QueueDead, nil); err == nil {
		t.Error("show without ids succeeded")
	}
}

// TestReplayOnlyToQueueThatGaveUp replays a dead letter of one of two
// module queues bound for the same type: only the queue that gave up gets
// it, with its original id, body and headers, without the dead-letter and
// attempt headers, and with the event type in x-mesh-routing-key.
func TestReplayOnlyToQueueThatGaveUp(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	billing := m.moduleQueue("n1", "billing", true, "module.shop.#")
	mailer := m.moduleQueue("n1", "mailer", false, "module.shop.#")
	e := newEvent("module.shop.order.created", "shop", `{"order":42}`)
	e.headers = amqp.Table{wire.HeaderCausationID: "01CAUSE0000000000000000000", "x-tenant": "acme",
		wire.HeaderAttempt: int64(4), wire.HeaderRoutingKey: e.typ}
	m.deadLetter(e, billing, 5, wire.DeadReasonDeliveryLimit, "db down", time.Now())
	other := newEvent("module.shop.order.paid", "shop", `{}`)
	m.deadLetter(other, billing, 5, wire.DeadReasonDeliveryLimit, "db down", time.Now())

	var progress [][2]int
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{IDs: []string{e.id}},
		deadletters.WithProgress(func(done, total int) { progress = append(progress, [2]int{done, total}) }))
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 1 || res.Done != 1 || len(res.Left) != 0 || res.Queues[billing] != 1 || len(res.Queues) != 1 || res.DryRun {
		t.Errorf("result %+v", res)
	}
	if len(res.Sent) != 1 || res.Sent[0].ID != e.id || res.Sent[0].Destination != billing || res.Sent[0].Time.IsZero() {
		t.Errorf("sent %+v, want %s to %s", res.Sent, e.id, billing)
	}
	if !slices.Equal(progress, [][2]int{{0, 1}, {1, 1}}) {
		t.Errorf("progress %v", progress)
	}
	d, ok := m.get(billing, 5*time.Second)
	if !ok {
		t.Fatal("the queue that gave up got nothing")
	}
	if d.MessageId != e.id || string(d.Body) != e.body || d.ContentType != wire.ContentTypeJSON ||
		d.DeliveryMode != amqp.Persistent || d.Exchange != "" || d.RoutingKey != billing {
		t.Errorf("replayed message: %+v", d)
	}
	for _, k := range []string{wire.HeaderDeadQueue, wire.HeaderDeadAttempts, wire.HeaderDeadReason, wire.HeaderDeadError,
		wire.HeaderDeadTime, wire.HeaderAttempt, "x-death", "x-delivery-count"} {
		if _, ok := d.Headers[k]; ok {
			t.Errorf("replayed message still has %s", k)
		}
	}
	for k, v := range map[string]any{wire.HeaderEventID: e.id, wire.HeaderSource: "shop", wire.HeaderNode: "n0",
		wire.HeaderTime: e.time.Format(time.RFC3339Nano), wire.HeaderCausationID: "01CAUSE0000000000000000000",
		"x-tenant": "acme", wire.HeaderRoutingKey: e.typ} {
		if d.Headers[k] != v {
			t.Errorf("replayed header %s = %v, want %v", k, d.Headers[k], v)
		}
	}
	// The runtime reads it back as a conforming event of the original type.
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	if err != nil || meta.RoutingKey != e.typ || meta.Attempt != 0 || meta.ID != e.id {
		t.Errorf("runtime would read %+v, %v", meta, err)
	}
	if _, ok := m.get(mailer, 300*time.Millisecond); ok {
		t.Error("the other module's queue got the replay too")
	}
	left, err := deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || len(left) != 1 || left[0].ID != other.id {
		t.Errorf("dead letters after the replay: %v, %v", ids(left), err)
	}
}

// TestReplaySameEventOfTwoQueues: one event both modules gave up on is two
// dead letters with the same id; replaying the id sends each back to its
// own queue, once.
func TestReplaySameEventOfTwoQueues(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	billing := m.moduleQueue("n1", "billing", true, "module.shop.#")
	mailer := m.moduleQueue("n2", "mailer", false, "module.shop.#")
	e := newEvent("module.shop.order.created", "shop", `{"order":7}`)
	m.deadLetter(e, billing, 3, wire.DeadReasonDeliveryLimit, "a", time.Now())
	m.deadLetter(e, mailer, 3, wire.DeadReasonDeliveryLimit, "b", time.Now())
	msgs, err := deadletters.Show(ctx, m.conn, wire.QueueDead, []string{e.id})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("show: %d messages, %v", len(msgs), err)
	}
	// One queue's copy alone, as the console replays a group.
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{IDs: []string{e.id}, Queue: mailer})
	if err != nil || res.Done != 1 || res.Queues[mailer] != 1 || len(res.Queues) != 1 {
		t.Fatalf("replay of %s's copy: %+v, %v", mailer, res, err)
	}
	if d, ok := m.get(mailer, 5*time.Second); !ok || d.MessageId != e.id {
		t.Fatalf("%s got %v %v", mailer, d.MessageId, ok)
	}
	m.deadLetter(e, mailer, 3, wire.DeadReasonDeliveryLimit, "b", time.Now())
	res, err = deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{IDs: []string{e.id}})
	if err != nil || res.Done != 2 || res.Queues[billing] != 1 || res.Queues[mailer] != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	for _, q := range []string{billing, mailer} {
		if d, ok := m.get(q, 5*time.Second); !ok || d.MessageId != e.id {
			t.Errorf("%s got %v %v", q, d.MessageId, ok)
		}
		if _, ok := m.get(q, 200*time.Millisecond); ok {
			t.Errorf("%s got a second copy", q)
		}
	}
}

// TestReplayBrokerDeadLetter replays a dead letter the broker made itself
// (rejected from a quorum module queue): the queue comes from x-death, and
// the copy goes back there without the broker's headers.
func TestReplayBrokerDeadLetter(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	audit := m.moduleQueue("n2", "audit", false, "mesh.ops.#")
	e := newEvent("mesh.ops.restarted", "meshctl", `{"svc":"db"}`)
	m.publish(wire.ExchangeEvents, e.typ, e.publishing())
	ch, err := m.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(audit, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-deliveries:
		if err := d.Reject(false); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	_ = ch.Close()
	if n := m.count(wire.QueueDead, 1); n != 1 {
		t.Fatalf("the broker dead-lettered %d messages", n)
	}
	msgs, err := deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{Module: "audit", Node: "n2"})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("list: %v, %v", msgs, err)
	}
	got := msgs[0]
	if got.ID != e.id || got.Queue != audit || got.Reason != "rejected" || got.Time.IsZero() || got.Type != e.typ {
		t.Errorf("broker dead letter read as %+v", got)
	}
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || res.Done != 1 || res.Queues[audit] != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	d, ok := m.get(audit, 5*time.Second)
	if !ok {
		t.Fatal("the queue got nothing back")
	}
	for k, v := range d.Headers {
		// basic.get on a 3.10 quorum queue says x-delivery-count=0 on a
		// first delivery; anything else would be the dead letter's count.
		if strings.HasPrefix(k, "x-death") || strings.HasPrefix(k, "x-first-death") || strings.HasPrefix(k, "x-last-death") ||
			(k == "x-delivery-count" && v != int64(0)) {
			t.Errorf("replayed copy has %s: %v", k, d.Headers)
		}
	}
	if d.MessageId != e.id || d.Headers[wire.HeaderRoutingKey] != e.typ {
		t.Errorf("replayed copy %+v", d)
	}
}

// TestReplayQueueGone leaves a dead letter whose queue no longer exists in
// place and reports it, while replaying the others.
func TestReplayQueueGone(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	billing := m.moduleQueue("n1", "billing", false, "module.shop.#")
	gone := newEvent("module.shop.order.created", "shop", `{"n":1}`)
	fine := newEvent("module.shop.order.created", "shop", `{"n":2}`)
	nowhere := newEvent("module.shop.order.created", "shop", `{"n":3}`)
	m.deadLetter(gone, "n1.retired.events", 3, wire.DeadReasonPermanent, "x", time.Now())
	m.deadLetter(fine, billing, 3, wire.DeadReasonPermanent, "x", time.Now())
	// A dead letter that names no queue at all.
	m.publish(wire.ExchangeDead, nowhere.typ, nowhere.publishing())

	dry, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{}, deadletters.DryRun())
	if err != nil || !dry.DryRun || dry.Matched != 3 || dry.Done != 1 || dry.Queues[billing] != 1 || len(dry.Left) != 2 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if n := m.count(wire.QueueDead, 3); n != 3 {
		t.Fatalf("the dry run changed the queue: %d dead letters", n)
	}
	if _, ok := m.get(billing, 300*time.Millisecond); ok {
		t.Fatal("the dry run replayed")
	}

	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 3 || res.Done != 1 || res.Queues[billing] != 1 || len(res.Left) != 2 {
		t.Fatalf("result %+v", res)
	}
	reasons := map[string]error{}
	for _, l := range res.Left {
		reasons[l.ID] = l.Err
	}
	if !errors.Is(reasons[gone.id], deadletters.ErrQueueGone) || !strings.Contains(reasons[gone.id].Error(), "n1.retired.events") {
		t.Errorf("gone queue reported as %v", reasons[gone.id])
	}
	if !errors.Is(reasons[nowhere.id], deadletters.ErrNoTarget) {
		t.Errorf("no queue reported as %v", reasons[nowhere.id])
	}
	msgs, err := deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || !slices.Equal(ids(msgs), sorted(gone.id, nowhere.id)) {
		t.Errorf("left in the queue: %v, %v", ids(msgs), err)
	}
	if d, ok := m.get(billing, 5*time.Second); !ok || d.MessageId != fine.id {
		t.Errorf("billing got %v %v", d.MessageId, ok)
	}
}

// TestPurge deletes only the matching messages, among many, and a dry run
// deletes nothing.
func TestPurge(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	var keep, drop []string
	for i := range 120 {
		typ, list := "module.shop.order.created", &keep
		if i%3 == 0 {
			typ, list = "module.shop.order.cancelled", &drop
		}
		e := newEvent(typ, "shop", `{}`)
		m.deadLetter(e, "n1.billing.events", 1, wire.DeadReasonPermanent, "x", time.Now())
		*list = append(*list, e.id)
	}
	f := deadletters.Filter{Type: "*.*.*.cancelled"}
	dry, err := deadletters.Purge(ctx, m.conn, wire.QueueDead, f, deadletters.DryRun())
	if err != nil || !dry.DryRun || dry.Matched != 40 || dry.Done != 40 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if n := m.count(wire.QueueDead, 120); n != 120 {
		t.Fatalf("the dry run purged: %d left", n)
	}
	calls := 0
	res, err := deadletters.Purge(ctx, m.conn, wire.QueueDead, f, deadletters.WithProgress(func(done, total int) {
		if done != calls || total != 120 { // messages read of those in the queue
			t.Errorf("progress(%d, %d) at call %d", done, total, calls)
		}
		calls++
	}))
	if err != nil || res.Matched != 40 || res.Done != 40 || res.DryRun {
		t.Fatalf("purge: %+v, %v", res, err)
	}
	if calls != 121 {
		t.Errorf("progress called %d times", calls)
	}
	if n := m.count(wire.QueueDead, 80); n != 80 {
		t.Fatalf("%d left after the purge, want 80", n)
	}
	msgs, err := deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || !slices.Equal(ids(msgs), sorted(keep...)) {
		t.Errorf("after the purge: %d messages, %v", len(msgs), err)
	}
}

// TestUnroutedReplay replays an unrouted event: while no queue is bound for
// it, it comes back to mesh.unrouted; once a queue is bound, it goes there.
func TestUnroutedReplay(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	e := newEvent("module.shop.order.created", "shop", `{"late":true}`)
	other := newEvent("module.blog.post.published", "blog", `{}`)
	m.publish(wire.ExchangeEvents, e.typ, e.publishing())
	m.publish(wire.ExchangeEvents, other.typ, other.publishing())
	if n := m.count(wire.QueueUnrouted, 2); n != 2 {
		t.Fatalf("mesh.unrouted holds %d", n)
	}
	msgs, err := deadletters.List(ctx, m.conn, wire.QueueUnrouted, deadletters.Filter{Module: "shop", Node: "n0"})
	if err != nil || len(msgs) != 1 || msgs[0].ID != e.id || msgs[0].Exchange != wire.ExchangeEvents ||
		msgs[0].Type != e.typ || !msgs[0].Time.Equal(e.time.Truncate(time.Second)) {
		t.Fatalf("list unrouted: %+v, %v", msgs, err)
	}
	f := deadletters.Filter{Module: "shop"}
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueUnrouted, f)
	if err != nil || res.Done != 1 || res.CameBack != 1 || res.Queues != nil {
		t.Fatalf("replay with no binding: %+v, %v", res, err)
	}
	if n := m.count(wire.QueueUnrouted, 2); n != 2 {
		t.Fatalf("mesh.unrouted holds %d after a replay that came back", n)
	}

	billing := m.moduleQueue("n1", "billing", false, "module.shop.#")
	res, err = deadletters.Replay(ctx, m.conn, wire.QueueUnrouted, f)
	if err != nil || res.Done != 1 || res.CameBack != 0 {
		t.Fatalf("replay with a binding: %+v, %v", res, err)
	}
	d, ok := m.get(billing, 5*time.Second)
	if !ok || d.MessageId != e.id || string(d.Body) != e.body || d.RoutingKey != e.typ || d.Exchange != wire.ExchangeEvents ||
		d.Headers[wire.HeaderEventID] != e.id {
		t.Fatalf("bound queue got %+v, %v", d, ok)
	}
	msgs, err = deadletters.List(ctx, m.conn, wire.QueueUnrouted, deadletters.Filter{})
	if err != nil || !slices.Equal(ids(msgs), []string{other.id}) {
		t.Errorf("left unrouted: %v, %v", ids(msgs), err)
	}
}

// TestReplaySpoolRefusal: a dead letter no queue gave up on (a node's
// spool gave up on it, reason refused) goes back to mesh.events with its
// type; a node-kept unrouted event (published straight to mesh.unrouted
// with x-mesh-routing-key) is listed and replayed under its type, not
// under the queue's name.
func TestReplaySpoolRefusal(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	billing := m.moduleQueue("n1", "billing", false, "module.shop.#")
	refused := newEvent("module.shop.order.created", "shop", `{"refused":true}`)
	msg := refused.publishing()
	msg.Headers[wire.HeaderDeadReason] = wire.DeadReasonRefused
	msg.Headers[wire.HeaderDeadError] = "node n0 gave up"
	m.publish(wire.ExchangeDead, refused.typ, msg)

	dry, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{}, deadletters.DryRun())
	if err != nil || dry.Done != 1 || dry.Queues[wire.ExchangeEvents] != 1 || len(dry.Left) != 0 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || res.Done != 1 || res.Queues[wire.ExchangeEvents] != 1 || len(res.Left) != 0 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	d, ok := m.get(billing, 5*time.Second)
	if !ok || d.MessageId != refused.id || d.RoutingKey != refused.typ || d.Exchange != wire.ExchangeEvents || d.Headers[wire.HeaderDeadReason] != nil {
		t.Fatalf("billing got %+v, %v", d, ok)
	}

	kept := newEvent("module.shop.order.paid", "shop", `{}`)
	msg = kept.publishing()
	msg.UserId = "guest" // a node resends as its broker user
	msg.Headers[wire.HeaderRoutingKey] = kept.typ
	m.publish("", wire.QueueUnrouted, msg)
	msgs, err := deadletters.List(ctx, m.conn, wire.QueueUnrouted, deadletters.Filter{Type: "module.shop.#"})
	if err != nil || len(msgs) != 1 || msgs[0].Type != kept.typ {
		t.Fatalf("list unrouted: %+v, %v", msgs, err)
	}
	if res, err = deadletters.Replay(ctx, m.conn, wire.QueueUnrouted, deadletters.Filter{}); err != nil || res.Done != 1 {
		t.Fatalf("replay unrouted: %+v, %v", res, err)
	}
	d, ok = m.get(billing, 5*time.Second)
	if !ok || d.MessageId != kept.id || d.RoutingKey != kept.typ || d.Headers[wire.HeaderRoutingKey] != nil {
		t.Fatalf("billing got %+v, %v", d, ok)
	}
}

// TestRefusals: bad filters, a queue that is not a keeper queue, and a
// virtual host without the topology give clear errors.
func TestRefusals(t *testing.T) {
	m := newMesh(t)
	ctx := ctxT(t)
	for _, f := range []deadletters.Filter{
		{Type: "module..x"},
		{Type: "module.a b"},
		{Module: "a.b"},
		{Node: "has space"},
		{OlderThan: -time.Second},
		{OlderThan: time.Hour, NewerThan: time.Minute},
		{IDs: []string{""}},
	} {
		if _, err := deadletters.List(ctx, m.conn, wire.QueueDead, f); !errors.Is(err, deadletters.ErrBadFilter) {
			t.Errorf("list %+v: %v, want ErrBadFilter", f, err)
		}
		if _, err := deadletters.Purge(ctx, m.conn, wire.QueueDead, f); !errors.Is(err, deadletters.ErrBadFilter) {
			t.Errorf("purge %+v: %v, want ErrBadFilter", f, err)
		}
	}
	if _, err := deadletters.Replay(ctx, m.conn, "n1.billing.events", deadletters.Filter{}); !errors.Is(err, deadletters.ErrNotKeeper) {
		t.Errorf("replay from a module queue: %v", err)
	}

	empty, err := amqp.Dial(newMeshURLWithoutTopology(t))
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	_, err = deadletters.List(ctx, empty, wire.QueueDead, deadletters.Filter{})
	if !errors.Is(err, deadletters.ErrNoQueue) || !strings.Contains(err.Error(), wire.QueueDead) {
		t.Errorf("list without topology: %v", err)
	}
	// The connection is still usable after the 404.
	if _, err := deadletters.Purge(ctx, empty, wire.QueueUnrouted, deadletters.Filter{}); !errors.Is(err, deadletters.ErrNoQueue) {
		t.Errorf("purge without topology: %v", err)
	}
}

// TestCancelGivesEverythingBack: a cancelled context stops a replay and
// every message not replayed stays.
func TestCancelGivesEverythingBack(t *testing.T) {
	m := newMesh(t)
	billing := m.moduleQueue("n1", "billing", false, "module.shop.#")
	for range 20 {
		m.deadLetter(newEvent("module.shop.order.created", "shop", `{}`), billing, 1, wire.DeadReasonPermanent, "x", time.Now())
	}
	ctx, cancel := contextWithCancel(t)
	res, err := deadletters.Replay(ctx, m.conn, wire.QueueDead, deadletters.Filter{}, deadletters.WithProgress(func(done, total int) {
		if done == 5 {
			cancel()
		}
	}))
	if err == nil || res.Done != 5 {
		t.Fatalf("cancelled replay: %+v, %v", res, err)
	}
	if n := m.count(wire.QueueDead, 15); n != 15 {
		t.Errorf("%d dead letters left, want 15", n)
	}
	if n := m.count(billing, 5); n != 5 {
		t.Errorf("%d replayed, want 5", n)
	}
}
