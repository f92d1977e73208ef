package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

func withDelays(c *runtime.Config) { c.Delays = true }

// receive waits for the next delivery on a tap.
func receive(t *testing.T, tap <-chan amqp.Delivery, what string) amqp.Delivery {
	t.Helper()
	select {
	case d := <-tap:
		return d
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return amqp.Delivery{}
	}
}

// TestDelayedEmitOnTheWire: a module's emit with sdk.After is scheduled,
// as raw amqp091-go sees it, persistent into mesh.delay with the delay's
// bits as its routing key and its type and due time in headers; it reaches
// mesh.events no earlier than its delay, with its id, type, headers and
// time to live, as the node's user, and goes to the queues bound to its
// type when it comes due, not to those bound when it was emitted.
func TestDelayedEmitOnTheWire(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "clock", withDelays)
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "reminders", Emits: []string{"due"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.reminders.due", rec)
	}}, runtime.ModuleConfig{})
	var mm sdk.Mesh
	load(t, n, sdk.Module{Name: "sender", Emits: []string{"note"}, Setup: func(m sdk.Mesh) error { mm = m; return nil }}, runtime.ModuleConfig{})

	scheduled := brokertest.Tap(t, url, delay.ExchangeIn, "#")
	ch := rawConn(t, url)
	before := watchQueue(t, ch, "module.sender.note") // bound at the emit, unbound before it is due
	start := time.Now()
	id, err := mm.Emit(emitCtx(t), "note", map[string]int{"n": 1}, sdk.After(1500*time.Millisecond), sdk.WithTTL(time.Minute), sdk.WithSchema("v2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueUnbind(before, "module.sender.note", wire.ExchangeEvents, nil); err != nil {
		t.Fatal(err)
	}
	after := brokertest.Tap(t, url, wire.ExchangeEvents, "module.sender.note") // bound after the emit

	s := receive(t, scheduled, "the scheduled copy")
	secs, node, err := delay.ParseRoutingKey(s.RoutingKey)
	switch {
	case err != nil:
		t.Errorf("scheduled with routing key %q: %v", s.RoutingKey, err)
	case secs != 2 || node != "clock":
		t.Errorf("scheduled for %d s in the due queue of %q, want 2 (1.5 s rounded up) in clock's", secs, node)
	}
	if s.Exchange != delay.ExchangeIn || s.DeliveryMode != amqp.Persistent || s.MessageId != id || s.UserId == "" {
		t.Errorf("scheduled copy: exchange %q, delivery mode %d, id %q (want %q), user-id %q", s.Exchange, s.DeliveryMode, s.MessageId, id, s.UserId)
	}
	if s.Headers[wire.HeaderRoutingKey] != "module.sender.note" || s.Headers[wire.HeaderDue] == nil || s.Expiration != "" {
		t.Errorf("scheduled copy: headers %v, expiration %q (the TTL must not run while it waits)", s.Headers, s.Expiration)
	}

	d := receive(t, after, "the due event on mesh.events")
	if waited := time.Since(start); waited < 1500*time.Millisecond {
		t.Errorf("delivered %v after the emit, before its delay of 1.5s", waited)
	}
	due, err := time.Parse(time.RFC3339Nano, d.Headers[wire.HeaderDue].(string))
	if err != nil || due.Before(start.Add(1500*time.Millisecond)) || due.After(time.Now()) {
		t.Errorf("x-due %v (%v): want the emit's time plus 1.5s", d.Headers[wire.HeaderDue], err)
	}
	if d.MessageId != id || d.RoutingKey != "module.sender.note" || d.Headers[wire.HeaderEventID] != id || d.Headers[wire.HeaderSchema] != "v2" ||
		d.Headers[wire.HeaderSource] != "sender" || d.DeliveryMode != amqp.Persistent || d.Expiration != "60000" || d.UserId != s.UserId {
		t.Errorf("due event: id %q key %q headers %v mode %d expiration %q user %q", d.MessageId, d.RoutingKey, d.Headers, d.DeliveryMode, d.Expiration, d.UserId)
	}
	for _, h := range []string{"x-death", wire.HeaderRoutingKey, "x-mesh-ttl"} {
		if _, ok := d.Headers[h]; ok {
			t.Errorf("due event carries %s: %v", h, d.Headers[h])
		}
	}
	if got := queueDepth(t, ch, before); got != 0 {
		t.Errorf("the queue unbound before it was due got %d copies", got)
	}
	waitFor(t, 10*time.Second, func() bool { return n.Stats().DelaysDelivered == 1 }) // counted after the mover's ack
	if st := n.Stats(); st.Scheduled != 1 || st.DelaysDelivered != 1 {
		t.Errorf("stats: scheduled %d, delivered %d; want 1, 1", st.Scheduled, st.DelaysDelivered)
	}

	// sdk.At, and a module's handler sees it as the same event.
	due2 := time.Now().Add(time.Second)
	id2, err := n.Emit(emitCtx(t), "reminders", "module.reminders.due", map[string]string{"to": "ada"}, sdk.At(due2))
	if err != nil {
		t.Fatal(err)
	}
	ev := rec.next(t)
	if ev.ID != id2 || time.Now().Before(due2) || ev.Headers[wire.HeaderDue] == "" || ev.Source != "reminders" {
		t.Errorf("handler got %+v; want id %s, no earlier than %v, with x-due", ev, id2, due2)
	}
}

// TestDelayedEmitRefusals: what the delay cascade cannot carry is refused
// with ErrInvalid, naming the bound or the fix, and nothing is scheduled.
func TestDelayedEmitRefusals(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "bounds", withDelays)
	plain := testNode(t, url, "plain", nil)
	ctx := emitCtx(t)
	for _, c := range []struct {
		name string
		node *runtime.Node
		opts []sdk.EmitOption
		want string
	}{
		{"past the longest delay", n, []sdk.EmitOption{sdk.After(delay.Max + time.Second)}, "over the longest"},
		{"At past the longest delay", n, []sdk.EmitOption{sdk.At(time.Now().Add(delay.Max + time.Hour))}, "over the longest delay"},
		{"a negative delay", n, []sdk.EmitOption{sdk.After(-time.Second)}, "negative"},
		{"After and At", n, []sdk.EmitOption{sdk.After(time.Second), sdk.At(time.Now().Add(time.Hour))}, "give one"},
		{"delayed at most once", n, []sdk.EmitOption{sdk.After(time.Second), sdk.AtMostOnce()}, "drop AtMostOnce"},
		{"the zero time", n, []sdk.EmitOption{sdk.At(time.Time{})}, "needs a time"},
		{"a node without delays", plain, []sdk.EmitOption{sdk.After(time.Second)}, "delays: true"},
	} {
		_, err := c.node.Emit(ctx, "test", "mesh.bounds.x", 1, c.opts...)
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want ErrInvalid saying %q", c.name, err, c.want)
		}
	}
	if st := n.Stats(); st.Scheduled != 0 || st.Emitted != 0 {
		t.Errorf("refused emits were sent: %+v", st)
	}
	// An At already passed, and After(0), are plain emits.
	tap := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.bounds.x")
	for _, o := range []sdk.EmitOption{sdk.At(time.Now().Add(-time.Hour)), sdk.After(0)} {
		if _, err := plain.Emit(ctx, "test", "mesh.bounds.x", 1, o); err != nil {
			t.Fatal(err)
		}
		if d := receive(t, tap, "a plain emit"); d.Headers[wire.HeaderDue] != nil {
			t.Errorf("a plain emit carries x-due %v", d.Headers[wire.HeaderDue])
		}
	}
}

// TestAtMostOnceEmit: sdk.AtMostOnce publishes the event not persistent
// and unconfirmed (counted apart from the confirmed), and with the broker
// away fails at once with ErrTransient instead of spooling it.
func TestAtMostOnceEmit(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "lossy", nil)
	tap := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.lossy.#")
	id, err := n.Emit(emitCtx(t), "test", "mesh.lossy.tick", 1, sdk.AtMostOnce())
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, tap, "the event emitted at most once")
	if d.MessageId != id || d.DeliveryMode != amqp.Transient {
		t.Errorf("got id %q delivery mode %d; want %q, transient (%d)", d.MessageId, d.DeliveryMode, id, amqp.Transient)
	}
	if st := n.Stats(); st.AtMostOnce != 1 || st.Emitted != 0 {
		t.Errorf("stats: at most once %d, emitted (confirmed) %d; want 1, 0", st.AtMostOnce, st.Emitted)
	}
	proxy.Down()
	proxy.Cut()
	waitFor(t, 10*time.Second, func() bool { return !n.Connected() })
	if _, err := n.Emit(emitCtx(t), "test", "mesh.lossy.tick", 2, sdk.AtMostOnce()); !errors.Is(err, sdk.ErrTransient) {
		t.Errorf("at most once with the broker away: %v, want ErrTransient", err)
	}
	if st := n.Stats(); st.Spooled != 0 || st.SpoolEvents != 0 || st.AtMostOnce != 1 {
		t.Errorf("with the broker away: spooled %d, at most once %d; want 0, 1", st.Spooled, st.AtMostOnce)
	}
}

// TestMoverIsNoConfusedDeputy: a node's mover publishes, as its own broker
// user, only what that user scheduled. Another user with write on
// mesh.delay who routes a message into the node's due queue, naming a type
// the node may emit, gets it dead-lettered as malformed, never published;
// so does a message of the node's own user that names no valid type. A
// message routed to a node without a due queue is kept in
// mesh.events.unrouted, not lost.
func TestMoverIsNoConfusedDeputy(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	testNode(t, url, "deputy", withDelays)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, "^$", "^mesh\\.delay$", "^$")
	forgedURL := strings.Replace(url, "guest:guest", user+":"+password, 1)
	published := brokertest.Tap(t, url, wire.ExchangeEvents, "#")
	ch := rawConn(t, url)

	conn, err := amqp.Dial(forgedURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	attacker, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	forge := func(ch *amqp.Channel, userID, id string, headers amqp.Table, node string, secs uint32) {
		t.Helper()
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirm(delay.ExchangeIn, delay.RoutingKey(secs, node), false, false, amqp.Publishing{
			MessageId: id, UserId: userID, Headers: headers, DeliveryMode: amqp.Persistent, Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(emitCtx(t)); err != nil || !ok {
			t.Fatalf("publish %s: acked %v, %v", id, ok, err)
		}
	}
	forge(attacker, user, "forged-by-another", amqp.Table{wire.HeaderRoutingKey: "node.deputy.left", wire.HeaderEventID: "forged-by-another"}, "deputy", 0)
	forge(attacker, "", "forged-without-user", amqp.Table{wire.HeaderRoutingKey: "node.deputy.left"}, "deputy", 0)
	forge(ch, "guest", "no-type", amqp.Table{wire.HeaderRoutingKey: "not a type"}, "deputy", 0)
	forge(ch, "guest", "no-such-node", amqp.Table{wire.HeaderRoutingKey: "node.deputy.left"}, "ghost", 0)
	forge(ch, "guest", "no-such-node-later", amqp.Table{wire.HeaderRoutingKey: "node.deputy.left"}, "ghost", 1) // dead-lettered by level 0

	dead := map[string]amqp.Delivery{}
	for range 3 {
		d := nextDead(t, ch)
		dead[d.MessageId] = d
	}
	for _, id := range []string{"forged-by-another", "forged-without-user", "no-type"} {
		d, ok := dead[id]
		if !ok || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonMalformed || d.Headers[wire.HeaderDeadQueue] != delay.DueQueue("deputy") {
			t.Errorf("%s: dead letter %v (%v); want malformed, from %s", id, d.Headers, ok, delay.DueQueue("deputy"))
		}
	}
	if why, _ := dead["forged-by-another"].Headers[wire.HeaderDeadError].(string); !strings.Contains(why, user) {
		t.Errorf("the dead letter of another user's schedule says %q, want its user named", why)
	}
	for _, want := range []string{"no-such-node", "no-such-node-later"} {
		if unrouted := nextFrom(t, ch, wire.QueueUnrouted); unrouted.MessageId != want {
			t.Errorf("mesh.events.unrouted holds %q, want %s, for a node without a due queue", unrouted.MessageId, want)
		}
	}
	// What the node's own user schedules is still delivered, after them.
	forge(ch, "guest", "fine", amqp.Table{wire.HeaderRoutingKey: "node.deputy.fine", wire.HeaderEventID: "fine"}, "deputy", 0)
	if d := receive(t, published, "the node's own schedule"); d.MessageId != "fine" || d.Headers[wire.HeaderScheduledBy] != "guest" {
		t.Errorf("published %q (%s) before the node's own schedule; the forged ones must never be", d.MessageId, d.RoutingKey)
	}
	// A node that trusts the other user (delay_publishers) delivers its
	// schedule, as its own user.
	testNode(t, url, "trusting", func(c *runtime.Config) { withDelays(c); c.DelayPublishers = []string{user} })
	forge(attacker, user, "trusted", amqp.Table{wire.HeaderRoutingKey: "node.trusting.ops", wire.HeaderEventID: "trusted"}, "trusting", 0)
	if d := receive(t, published, "the trusted user's schedule"); d.MessageId != "trusted" || d.UserId != "guest" || d.Headers[wire.HeaderScheduledBy] != user {
		t.Errorf("published %q as %q, scheduled by %v; want the trusted schedule, as the node's user, saying %s scheduled it", d.MessageId, d.UserId, d.Headers[wire.HeaderScheduledBy], user)
	}
	// Even a trusted user may not have the node put a "retry" into a queue.
	forge(attacker, user, "forged-retry", amqp.Table{wire.HeaderRoutingKey: "node.trusting.ops", "x-mesh-delay-queue": "mesh.dead-letters",
		wire.HeaderAttempt: int64(1)}, "trusting", 0)
	if d := nextDead(t, ch); d.MessageId != "forged-retry" || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonMalformed {
		t.Errorf("dead letter %s %v; want the forged retry, malformed", d.MessageId, d.Headers)
	}
}

// TestRetryWaitsInTheCascade: a module whose retry back-offs reach
// RetryScheduleFrom has each failed delivery acknowledged once a copy,
// carrying the attempts made, is scheduled back to its queue through the
// delay cascade (seen on the wire: x-mesh-delay-queue, x-mesh-attempt, the
// delay's bits), so the retry is a fresh delivery from the node's mover,
// not a held one; attempts count across copies, and at the limit the
// event is dead-lettered with the last error.
func TestRetryWaitsInTheCascade(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "clock", func(c *runtime.Config) { c.Delays, c.RetryScheduleFrom = true, time.Second })
	scheduled := brokertest.Tap(t, url, delay.ExchangeIn, "#")
	type try struct {
		attempt     int
		redelivered bool
		at          time.Time
	}
	tries := make(chan try, 10)
	load(t, n, sdk.Module{Name: "patient", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.pay.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			tries <- try{ev.Attempt, ev.Redelivered, time.Now()}
			if ev.Type == "mesh.pay.doomed" || ev.Attempt < 3 {
				return fmt.Errorf("declined on attempt %d", ev.Attempt)
			}
			return nil
		}))
	}}, runtime.ModuleConfig{Retry: []time.Duration{time.Second, 2 * time.Second}})
	id, err := n.Emit(emitCtx(t), "test", "mesh.pay.charge", 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []try
	for range 3 {
		select {
		case tr := <-tries:
			got = append(got, tr)
		case <-time.After(30 * time.Second):
			t.Fatalf("attempts so far %+v", got)
		}
	}
	for i, tr := range got {
		if tr.attempt != i+1 || tr.redelivered {
			t.Errorf("try %d: attempt %d, redelivered %v; want attempt %d, a fresh delivery", i+1, tr.attempt, tr.redelivered, i+1)
		}
	}
	if d := got[1].at.Sub(got[0].at); d < time.Second {
		t.Errorf("attempt 2 came %v after attempt 1, before its back-off of 1s", d)
	}
	if d := got[2].at.Sub(got[1].at); d < 2*time.Second {
		t.Errorf("attempt 3 came %v after attempt 2, before its back-off of 2s", d)
	}
	for want := 1; want <= 2; want++ {
		s := receive(t, scheduled, "a scheduled retry")
		secs, node, _ := delay.ParseRoutingKey(s.RoutingKey)
		if s.MessageId != id || s.Headers["x-mesh-delay-queue"] != "clock.patient.events" || s.Headers[wire.HeaderAttempt] != int64(want) ||
			secs != uint32(want) || node != "clock" || s.Headers[wire.HeaderRoutingKey] != "mesh.pay.charge" {
			t.Errorf("scheduled retry %d: id %s key %s headers %v", want, s.MessageId, s.RoutingKey, s.Headers)
		}
	}
	waitFor(t, 10*time.Second, func() bool { return n.Stats().Handled == 1 }) // the handler returns after it sent its try
	if st := n.Stats(); st.RetriesScheduled != 2 || st.Handled != 1 {
		t.Errorf("stats: retries scheduled %d, handled %d; want 2, 1", st.RetriesScheduled, st.Handled)
	}

	// At the limit (3 attempts: len(Retry)+1), dead-lettered with the last error.
	doomed, err := n.Emit(emitCtx(t), "test", "mesh.pay.doomed", 2)
	if err != nil {
		t.Fatal(err)
	}
	dead := nextFrom(t, rawConn(t, url), wire.QueueDead)
	if dead.MessageId != doomed || dead.Headers[wire.HeaderDeadReason] != wire.DeadReasonDeliveryLimit ||
		dead.Headers[wire.HeaderDeadAttempts] != int64(3) || dead.Headers[wire.HeaderDeadError] != "declined on attempt 3" {
		t.Errorf("dead letter %s: %v", dead.MessageId, dead.Headers)
	}
}

// TestRetriesInTheCascadeAreNotHeld: the load-time check against the
// broker's consumer_timeout counts only the back-offs that are held: a
// retry of an hour passes on a node with delays on, and is refused, naming
// the way out, on one without.
func TestRetriesInTheCascadeAreNotHeld(t *testing.T) {
	long := runtime.ModuleConfig{Retry: []time.Duration{10 * time.Second, time.Hour, 6 * time.Hour}}
	if err := (runtime.Config{Delays: true}).CheckConsumerTimeout(long, true); err != nil {
		t.Errorf("retries of hours in the cascade: %v", err)
	}
	err := (runtime.Config{}).CheckConsumerTimeout(long, true)
	if err == nil || !strings.Contains(err.Error(), "delays: true") {
		t.Errorf("retries of hours held: %v, want a refusal naming delays: true", err)
	}
	short := runtime.ModuleConfig{Retry: []time.Duration{5 * time.Second, 29 * time.Minute}, HandlerTimeout: time.Minute, Prefetch: 1}
	if err := (runtime.Config{Delays: true}).CheckConsumerTimeout(short, true); err != nil {
		t.Errorf("a held 5s and a scheduled 29m: %v", err)
	}
}

// TestDelayedListAndCancel: a node lists what it scheduled and has not
// delivered, soonest due first, by type and source, over its delays
// module's tool (meshctl alone may call it); an event cancelled before it
// is due is dropped by the mover, never published, while the others are
// delivered and leave the list; a cancellation of a delivered event says
// it is not there.
func TestDelayedListAndCancel(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "clock", withDelays)
	published := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.shop.#")
	records := brokertest.Tap(t, url, wire.ExchangeEvents, "node.clock.delay.#")
	ctx := emitCtx(t)
	doomed, err := n.Emit(ctx, "shop", "mesh.shop.reminder", 1, sdk.After(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := n.Emit(ctx, "shop", "mesh.shop.reminder", 2, sdk.After(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	invoice, err := n.Emit(ctx, "billing", "mesh.shop.invoice", 3, sdk.After(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var all runtime.DelayedList
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "ls"), runtime.DelayedListRequest{}, &all); err != nil {
		t.Fatal(err)
	}
	if got := n.Stats().DelaysWaiting; got != 3 {
		t.Errorf("stats: %d waiting, want 3", got)
	}
	// The mesh (the audit log) hears of each schedule: a record caused by
	// the event, its entry as the body.
	recorded := map[string]bool{}
	for range 3 {
		r := receive(t, records, "the record of a schedule")
		var e struct{ ID, Type string }
		if err := json.Unmarshal(r.Body, &e); err != nil || r.RoutingKey != "node.clock.delay.scheduled" || r.Headers[wire.HeaderCausationID] != e.ID {
			t.Errorf("record %s %v %s (%v)", r.RoutingKey, r.Headers, r.Body, err)
		}
		recorded[e.ID] = true
	}
	if !recorded[doomed] || !recorded[kept] || !recorded[invoice] {
		t.Errorf("records of %v; want %s, %s and %s", recorded, doomed, kept, invoice)
	}
	if all.Total != 3 || len(all.Entries) != 3 || all.Entries[0].ID != doomed || all.Entries[1].ID != kept || all.Entries[2].Type != "mesh.shop.invoice" {
		t.Fatalf("ls: %+v", all)
	}
	var reminders runtime.DelayedList
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "ls"), runtime.DelayedListRequest{Type: "mesh.shop.reminder", Source: "shop", Limit: 1}, &reminders); err != nil {
		t.Fatal(err)
	}
	if reminders.Total != 2 || len(reminders.Entries) != 1 || reminders.Entries[0].ID != doomed {
		t.Errorf("ls of shop's reminders, limit 1: %+v", reminders)
	}
	var te *sdk.ToolError
	if err := n.Call(ctx, "intruder", runtime.DelayedTool("clock", "cancel"), runtime.DelayedCancelRequest{ID: doomed}, nil); !errors.As(err, &te) || te.Code != "forbidden" {
		t.Errorf("a cancel by another caller: %v, want forbidden", err)
	}
	fake := schedbook.Entry{ID: "01FAKE", Type: "mesh.shop.refund", Due: time.Now().Add(time.Hour)}
	if err := n.Call(ctx, "intruder", runtime.DelayedTool("clock", "note"), fake, nil); !errors.As(err, &te) || te.Code != "forbidden" {
		t.Errorf("a note by another caller: %v, want forbidden", err)
	}
	fake.Type = "not a type"
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "note"), fake, nil); !errors.As(err, &te) || !te.Permanent {
		t.Errorf("a note of no event type: %v, want a permanent refusal", err)
	}
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "cancel"), runtime.DelayedCancelRequest{ID: doomed}, nil); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if r := receive(t, records, "the record of the cancellation"); r.RoutingKey != "node.clock.delay.cancelled" || r.Headers[wire.HeaderCausationID] != doomed {
		t.Errorf("the cancellation's record: %s %v", r.RoutingKey, r.Headers)
	}
	// The kept one, due after the cancelled one, is published first.
	if d := receive(t, published, "the event not cancelled"); d.MessageId != kept {
		t.Errorf("published %s first; want %s, the cancelled %s never", d.MessageId, kept, doomed)
	}
	waitFor(t, 10*time.Second, func() bool { st := n.Stats(); return st.DelaysCancelled == 1 && st.DelaysDelivered == 1 })
	var left runtime.DelayedList
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "ls"), runtime.DelayedListRequest{}, &left); err != nil {
		t.Fatal(err)
	}
	if left.Total != 1 || left.Entries[0].Type != "mesh.shop.invoice" {
		t.Errorf("ls after the two came due: %+v", left)
	}
	if err := n.Call(ctx, "meshctl", runtime.DelayedTool("clock", "cancel"), runtime.DelayedCancelRequest{ID: kept}, nil); !errors.As(err, &te) || te.Code != "not_found" {
		t.Errorf("a cancel after delivery: %v, want not_found", err)
	}
}

// TestConsumedQueueRetryWaitsInTheCascade: a message of a queue a module
// consumes (a dispatcher's trigger) follows the module's retry policy too:
// a long back-off is a copy scheduled back into that queue, the failed
// delivery acknowledged, the attempts counted across copies, on a quorum
// queue and a classic one.
func TestConsumedQueueRetryWaitsInTheCascade(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	ch := rawConn(t, url)
	queues := map[string]amqp.Table{"jobs.quorum": {"x-queue-type": "quorum"}, "jobs.classic": nil}
	for q, args := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			t.Fatal(err)
		}
	}
	n := testNode(t, url, "clock", func(c *runtime.Config) { c.Delays, c.RetryScheduleFrom = true, time.Second })
	scheduled := brokertest.Tap(t, url, delay.ExchangeIn, "#")
	type try struct {
		queue       string
		attempt     int
		redelivered bool
	}
	tries := make(chan try, 10)
	load(t, n, sdk.Module{Name: "dispatch", Setup: func(m sdk.Mesh) error {
		h := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			tries <- try{ev.Queue, ev.Attempt, ev.Redelivered}
			if ev.Attempt == 1 {
				return errors.New("the tool is overloaded")
			}
			return nil
		})
		return errors.Join(m.Consume("jobs.quorum", 4, h), m.Consume("jobs.classic", 4, h))
	}}, runtime.ModuleConfig{Retry: []time.Duration{time.Second}, ConsumeGrants: []string{"jobs.*"}})
	for q := range queues {
		if err := ch.Publish("", q, false, false, amqp.Publishing{MessageId: "job-" + q, DeliveryMode: amqp.Persistent, Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string][]try{}
	for range 4 {
		select {
		case tr := <-tries:
			got[tr.queue] = append(got[tr.queue], tr)
		case <-time.After(30 * time.Second):
			t.Fatalf("tries so far %+v", got)
		}
	}
	for q := range queues {
		if tr := got[q]; len(tr) != 2 || tr[0].attempt != 1 || tr[1].attempt != 2 || tr[1].redelivered {
			t.Errorf("%s: tries %+v; want attempts 1 and 2, the second a fresh delivery", q, tr)
		}
	}
	seen := map[string]bool{}
	for range 2 {
		s := receive(t, scheduled, "a scheduled retry of a consumed queue's message")
		q, _ := s.Headers["x-mesh-delay-queue"].(string)
		seen[q] = s.MessageId == "job-"+q && s.Headers[wire.HeaderAttempt] == int64(1)
	}
	if !seen["jobs.quorum"] || !seen["jobs.classic"] {
		t.Errorf("scheduled retries: %v", seen)
	}
	waitFor(t, 10*time.Second, func() bool { return queueDepth(t, ch, "jobs.quorum") == 0 && queueDepth(t, ch, "jobs.classic") == 0 })
}

// TestModuleSchedulesAreBounded: a module may schedule no further ahead
// than its entry's max_delay, and no more at once than max_scheduled and
// max_scheduled_bytes; the refusals are ErrForbidden naming the key, and
// a schedule that comes due gives its room back.
func TestModuleSchedulesAreBounded(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "bounded", withDelays)
	ctx := emitCtx(t)
	m := load(t, n, sdk.Module{Name: "reminder", Emits: []string{"nudge"}}, runtime.ModuleConfig{MaxDelay: time.Hour, MaxScheduled: 2, MaxScheduledBytes: 64})
	mesh := m.Mesh()
	if _, err := mesh.Emit(ctx, "nudge", 1, sdk.After(2*time.Hour)); !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "max_delay: 1h0m0s") {
		t.Errorf("a delay past max_delay: %v", err)
	}
	if _, err := mesh.Emit(ctx, "nudge", strings.Repeat("x", 100), sdk.After(time.Second)); !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "max_scheduled_bytes: 64") {
		t.Errorf("a schedule past max_scheduled_bytes: %v", err)
	}
	tap := brokertest.Tap(t, url, wire.ExchangeEvents, "module.reminder.nudge")
	for range 2 {
		if _, err := mesh.Emit(ctx, "nudge", 1, sdk.After(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mesh.Emit(ctx, "nudge", 1, sdk.After(time.Second)); !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "max_scheduled: 2") {
		t.Errorf("a third schedule past max_scheduled 2: %v", err)
	}
	// Each delivered schedule gives its room back (the mover crosses it
	// out after its publish is confirmed: the stats count it then).
	for range 2 {
		receive(t, tap, "a due nudge")
	}
	waitFor(t, 30*time.Second, func() bool { return n.Stats().DelaysDelivered >= 2 })
	if _, err := mesh.Emit(ctx, "nudge", 1, sdk.After(time.Second)); err != nil {
		t.Errorf("a schedule after the others came due: %v", err)
	}
	if st := n.Stats(); st.Scheduled != 3 {
		t.Errorf("refused schedules were sent: %+v", st)
	}
}

// TestDueScheduleOfAGoneModuleIsDeadLettered: a schedule that comes due
// after its module left the node's configuration, or lost the grant of its
// type, is not delivered but not lost either: it is dead-lettered with
// reason revoked and why (as raw amqp091-go reads it on mesh.events.dead),
// counted, and recorded as node.NODE.delay.dropped, and the operator's
// replay delivers it. A schedule of a module still configured and granted
// is delivered, and so is the operator's (source meshctl, which is no
// module of the configuration: the issue 60 loss).
func TestDueScheduleOfAGoneModuleIsDeadLettered(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "dropper", withDelays)
	ctx := emitCtx(t)
	n.SetModules([]string{"gone", "granted", "kept"})
	gone := load(t, n, sdk.Module{Name: "gone", Emits: []string{"nudge"}}, runtime.ModuleConfig{})
	granted := load(t, n, sdk.Module{Name: "granted"}, runtime.ModuleConfig{EmitGrants: []string{"mesh.reminders.#"}})
	kept := load(t, n, sdk.Module{Name: "kept", Emits: []string{"nudge"}}, runtime.ModuleConfig{})
	events := brokertest.Tap(t, url, wire.ExchangeEvents, "#.nudge")
	reminders := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.reminders.#")
	operator := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.ops.#")
	dropped := brokertest.Tap(t, url, wire.ExchangeEvents, "node.dropper.delay.dropped")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	goneID, err := gone.Mesh().Emit(ctx, "nudge", 1, sdk.After(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	grantedID, err := granted.Mesh().Emit(ctx, "mesh.reminders.due", 1, sdk.After(2*time.Second), sdk.AsFullType())
	if err != nil {
		t.Fatal(err)
	}
	// Before they come due, gone leaves the configuration, and granted
	// is loaded again without its grant (as meshd does on a reload).
	n.SetModules([]string{"granted", "kept"})
	if err := granted.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	load(t, n, sdk.Module{Name: "granted"}, runtime.ModuleConfig{EmitGrants: []string{}})
	waitFor(t, 30*time.Second, func() bool { return n.Stats().DelaysDropped >= 2 })
	for range 2 {
		d := receive(t, dropped, "the record of a dropped schedule")
		var e schedbook.Entry
		if err := json.Unmarshal(d.Body, &e); err != nil || (e.Source != "gone" && e.Source != "granted") {
			t.Errorf("the record of a dropped schedule: %s (%v)", d.Body, err)
		}
	}
	want := map[string]struct{ key, why string }{
		goneID:    {"module.gone.nudge", "module gone is no longer in node dropper's configuration"},
		grantedID: {"mesh.reminders.due", "module granted may no longer emit mesh.reminders.due"},
	}
	for range 2 {
		d := receive(t, dead, "a revoked schedule's dead letter")
		w, ok := want[d.MessageId]
		errText, _ := d.Headers[wire.HeaderDeadError].(string)
		switch {
		case !ok:
			t.Errorf("dead letter %q (%s): not one of the revoked schedules %v", d.MessageId, d.RoutingKey, want)
		case d.RoutingKey != w.key || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonRevoked || !strings.Contains(errText, w.why) ||
			d.Headers[wire.HeaderDeadQueue] != nil || d.Headers[wire.HeaderEventID] != d.MessageId || d.DeliveryMode != amqp.Persistent:
			t.Errorf("dead letter %s: key %s, headers %v, mode %d; want key %s, reason %s, error saying %q, no dead queue, persistent",
				d.MessageId, d.RoutingKey, d.Headers, d.DeliveryMode, w.key, wire.DeadReasonRevoked, w.why)
		}
		delete(want, d.MessageId)
	}
	// A schedule of a module still configured and granted comes due after
	// them, and is delivered: the first event on the taps is its. So is
	// the operator's.
	if _, err := kept.Mesh().Emit(ctx, "nudge", 1, sdk.After(time.Second)); err != nil {
		t.Fatal(err)
	}
	opID, err := n.Emit(ctx, runtime.OperatorSource, "mesh.ops.later", map[string]int{"n": 1}, sdk.After(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := receive(t, events, "kept's nudge"); d.RoutingKey != "module.kept.nudge" {
		t.Errorf("a dropped schedule was delivered: %s from %v", d.RoutingKey, d.Headers[wire.HeaderSource])
	}
	if d := receive(t, operator, "the operator's schedule"); d.MessageId != opID {
		t.Errorf("the operator's schedule: got %s, want %s", d.MessageId, opID)
	}
	select {
	case d := <-reminders:
		t.Errorf("the schedule of a revoked grant was delivered: %s", d.RoutingKey)
	default:
	}
	// The operator replays what was set aside: it reaches mesh.events with
	// its id.
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, 30*time.Second, func() bool {
		l, err := deadletters.List(ctx, conn, wire.QueueDead, deadletters.Filter{Type: "mesh.reminders.#"})
		return err == nil && len(l) == 1
	})
	res, err := deadletters.Replay(ctx, conn, wire.QueueDead, deadletters.Filter{Type: "mesh.reminders.#"})
	if err != nil || res.Done != 1 {
		t.Fatalf("replay the revoked schedule: %+v, %v", res, err)
	}
	if d := receive(t, reminders, "the replayed schedule"); d.MessageId != grantedID {
		t.Errorf("replayed: got %s, want %s", d.MessageId, grantedID)
	}
}
