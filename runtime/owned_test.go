package runtime_test

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/replay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// The tests of this file play an attacker on the real broker, with raw
// amqp091-go: headers the runtime owns (x-mesh-*) are honoured only where
// the runtime put them (SPEC §6), and replays and retries keep who
// published what (runtime/owned.go).

// brokerUser makes a broker user on url's virtual host with the given
// permissions and, when topicWrite is not empty, a topic permission on
// mesh.events; it returns the URL that logs in as it.
func brokerUser(t *testing.T, url, configure, write, read, topicWrite string) (name, userURL string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	name, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", vhost, name, configure, write, read)
	if topicWrite != "" {
		brokertest.Ctl(t, "set_topic_permissions", "-p", vhost, name, wire.ExchangeEvents, topicWrite, "^$")
	}
	u.User = neturl.UserPassword(name, password)
	return name, u.String()
}

// dialAs dials url and returns a channel in confirm mode on it.
func dialAs(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// contractHeaders are the headers of a conforming event, plus more.
func contractHeaders(id, source string, more amqp.Table) amqp.Table {
	h := amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: source, wire.HeaderNode: "far",
		wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)}
	for k, v := range more {
		h[k] = v
	}
	return h
}

// publishConfirmed publishes and fails the test unless the broker confirms.
func publishConfirmed(t *testing.T, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirmWithContext(emitCtx(t), exchange, key, false, false, msg)
	if err != nil {
		t.Fatalf("publish to %q %q: %v", exchange, key, err)
	}
	if ok, err := dc.WaitContext(emitCtx(t)); !ok || err != nil {
		t.Fatalf("publish to %q %q: acked=%v, %v", exchange, key, ok, err)
	}
}

// TestForgedRoutingKeyHeaderThroughMeshEvents: a broker user whose topic
// permission allows only module.evil.* publishes module.evil.x to
// mesh.events claiming, in the runtime's own headers, the type
// node.berlin.drained, another user, and attempts already made. Every
// module subscribed to # takes it as module.evil.x from that user, on its
// first attempt, quorum and classic queue alike, and so does a classic
// queue's retry of it.
func TestForgedRoutingKeyHeaderThroughMeshEvents(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "berlin", nil)
	all := newRecorder(nil)
	load(t, n, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error { return m.On("#", all) }}, runtime.ModuleConfig{})
	var failed sync.Once
	classic := newRecorder(func(sdk.Event) error {
		var err error
		failed.Do(func() { err = errors.New("first attempt fails") })
		return err
	})
	load(t, n, sdk.Module{Name: "legacy", Setup: func(m sdk.Mesh) error { return m.On("#", classic) }},
		runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxAttempts: 5})

	evil, evilURL := brokerUser(t, url, "^$", "^mesh\\.events$", "^$", "^module\\.evil\\..*")
	_, ch := dialAs(t, evilURL)
	id := ulid.Make().String()
	publishConfirmed(t, ch, wire.ExchangeEvents, "module.evil.x", amqp.Publishing{
		Headers: contractHeaders(id, "billing", amqp.Table{wire.HeaderRoutingKey: "node.berlin.drained",
			wire.HeaderUserID: "billing-node", wire.HeaderAttempt: int64(3)}),
		ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, UserId: evil, Body: []byte(`{}`),
	})
	for name, ev := range map[string]sdk.Event{"quorum": all.next(t), "classic": classic.next(t), "classic retry": classic.next(t)} {
		if ev.ID != id || ev.Type != "module.evil.x" || ev.UserID != evil {
			t.Errorf("%s queue: %s handled as %s from user %q, want module.evil.x from %s", name, ev.ID, ev.Type, ev.UserID, evil)
		}
		if want := map[string]int{"quorum": 1, "classic": 1, "classic retry": 2}[name]; ev.Attempt != want {
			t.Errorf("%s queue: attempt %d, want %d (a forged x-mesh-attempt counts for nothing)", name, ev.Attempt, want)
		}
		for k := range ev.Headers {
			if strings.HasPrefix(k, "x-mesh-") {
				t.Errorf("%s queue: the handler got the runtime's header %s", name, k)
			}
		}
	}

	// The topic permission holds: the user cannot publish the type itself.
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_ = ch.PublishWithContext(emitCtx(t), wire.ExchangeEvents, "node.berlin.drained", false, false, amqp.Publishing{Body: []byte(`{}`)})
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.AccessRefused {
			t.Errorf("publishing node.berlin.drained closed the channel with %v, want 403", e)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the broker took node.berlin.drained from a user allowed only module.evil.*")
	}
}

// TestDirectWithoutUserIDIsMalformed: a message sent straight to a module's
// queue through the default exchange, claiming a type in
// x-mesh-routing-key without a user-id (no broker-verified publisher), is
// dead-lettered as malformed with a reason that says so, and never reaches
// the handler; the same with a user-id is the type it claims.
func TestDirectWithoutUserIDIsMalformed(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "berlin", nil)
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", rec) }}, runtime.ModuleConfig{})

	raw := rawConn(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	forged := ulid.Make().String()
	publishConfirmed(t, raw, "", "berlin.billing.events", amqp.Publishing{
		Headers:     contractHeaders(forged, "shop", amqp.Table{wire.HeaderRoutingKey: "module.shop.order.created"}),
		ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: forged, Body: []byte(`{}`),
	})
	check := rawConn(t, url)
	d := nextDead(t, check)
	if d.MessageId != forged || d.Exchange != wire.ExchangeDead || d.RoutingKey != "berlin.billing.events" ||
		d.Headers[wire.HeaderDeadReason] != wire.DeadReasonMalformed || d.Headers[wire.HeaderDeadQueue] != "berlin.billing.events" {
		t.Fatalf("dead letter %s by key %q on %q with %v", d.MessageId, d.RoutingKey, d.Exchange, d.Headers)
	}
	if reason, _ := d.Headers[wire.HeaderDeadError].(string); !strings.Contains(reason, wire.HeaderRoutingKey) || !strings.Contains(reason, "without a user-id") {
		t.Errorf("dead-letter error %q does not say the header came without a user-id", reason)
	}
	if d.UserId != "guest" || d.Headers[wire.HeaderUserID] != "" || d.Headers[wire.HeaderRoutingKey] != nil {
		t.Errorf("dead letter user-id %q, %s=%v, %s=%v: want the node's user, no original user, no claimed type",
			d.UserId, wire.HeaderUserID, d.Headers[wire.HeaderUserID], wire.HeaderRoutingKey, d.Headers[wire.HeaderRoutingKey])
	}
	if m := deadletters.ReadDead(d); m.Type != "berlin.billing.events" || m.Reason != wire.DeadReasonMalformed {
		t.Errorf("dead letter read as type %q, reason %q", m.Type, m.Reason)
	}

	// With a user-id the broker checked, the same send is the type it
	// claims (a replay to one module's queue is one).
	fine := ulid.Make().String()
	publishConfirmed(t, raw, "", "berlin.billing.events", amqp.Publishing{
		Headers:     contractHeaders(fine, "shop", amqp.Table{wire.HeaderRoutingKey: "module.shop.order.created"}),
		ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: fine, UserId: "guest", Body: []byte(`{}`),
	})
	if ev := rec.next(t); ev.ID != fine || ev.Type != "module.shop.order.created" || ev.UserID != "guest" {
		t.Errorf("handled %s as %s from %q, want %s as module.shop.order.created from guest", ev.ID, ev.Type, ev.UserID, fine)
	}
	if n := rec.count(); n != 1 {
		t.Errorf("the handler ran %d times, want once (the forged message never reaches it)", n)
	}
}

// TestConsumedQueueHonoursOnlyVerifiedHeaders: on a queue a module
// consumes (Consume), the runtime's headers count by the same rules: a
// direct message claiming a type without a user-id is dead-lettered as
// malformed naming the queue; a retry keeps the type and the publisher.
func TestConsumedQueueHonoursOnlyVerifiedHeaders(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	raw := rawConn(t, url)
	if _, err := raw.QueueDeclare("shop.orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	n := testNode(t, url, "berlin", nil)
	var failed sync.Once
	rec := newRecorder(func(sdk.Event) error {
		var err error
		failed.Do(func() { err = errors.New("first attempt fails") })
		return err
	})
	load(t, n, sdk.Module{Name: "dispatch", Setup: func(m sdk.Mesh) error { return m.Consume("shop.orders", 1, rec) }}, runtime.ModuleConfig{})
	shop, shopURL := brokerUser(t, url, ".*", ".*", ".*", "")
	_, shopCh := dialAs(t, shopURL)

	forged := ulid.Make().String()
	publishConfirmed(t, raw, "", "shop.orders", amqp.Publishing{MessageId: forged, Body: []byte(`{}`),
		Headers: amqp.Table{wire.HeaderRoutingKey: "node.berlin.drained"}})
	check := rawConn(t, url)
	d := nextDead(t, check)
	if d.MessageId != forged || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonMalformed || d.Headers[wire.HeaderDeadQueue] != "shop.orders" {
		t.Errorf("dead letter %s with %v", d.MessageId, d.Headers)
	}

	order := ulid.Make().String()
	publishConfirmed(t, shopCh, "", "shop.orders", amqp.Publishing{MessageId: order, UserId: shop, Body: []byte(`{"order":1}`)})
	first, retry := rec.next(t), rec.next(t)
	for _, ev := range []sdk.Event{first, retry} {
		if ev.ID != order || ev.Type != "shop.orders" || ev.UserID != shop {
			t.Errorf("attempt %d: %s of type %q from %q, want %s of type shop.orders from %s", ev.Attempt, ev.ID, ev.Type, ev.UserID, order, shop)
		}
	}
	if first.Attempt != 1 || retry.Attempt != 2 {
		t.Errorf("attempts %d then %d", first.Attempt, retry.Attempt)
	}
	if n := rec.count(); n != 2 {
		t.Errorf("the handler ran %d times, want twice (the forged message never reaches it)", n)
	}
}

// TestRetryAndDeadLetterKeepTheUserID: a classic queue's retry is the
// node's copy, yet the handler sees the original publisher's user; a dead
// letter, published by the node as itself, carries the original user in
// x-mesh-user-id, read back by deadletters and by a DeadLetters handler.
func TestRetryAndDeadLetterKeepTheUserID(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "berlin", nil)
	rec := newRecorder(func(ev sdk.Event) error {
		if ev.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		var order struct{ Poison bool }
		if err := ev.Decode(&order); err != nil || order.Poison {
			return sdk.Permanent(errors.New("poison"))
		}
		return nil
	})
	load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", rec) }},
		runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxAttempts: 5})
	dead := newRecorder(nil)
	load(t, n, sdk.Module{Name: "undertaker", DeadLetters: dead}, runtime.ModuleConfig{})

	shop, shopURL := brokerUser(t, url, ".*", ".*", ".*", "")
	_, ch := dialAs(t, shopURL)
	publish := func(body string) string {
		id := ulid.Make().String()
		publishConfirmed(t, ch, wire.ExchangeEvents, "module.shop.order.created", amqp.Publishing{
			Headers: contractHeaders(id, "shop", nil), ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent,
			MessageId: id, UserId: shop, Body: []byte(body),
		})
		return id
	}

	// (d) A retry keeps the original user-id.
	ok := publish(`{}`)
	for attempt := 1; attempt <= 2; attempt++ {
		if ev := rec.next(t); ev.ID != ok || ev.Attempt != attempt || ev.UserID != shop || ev.Type != "module.shop.order.created" {
			t.Errorf("attempt %d: %s attempt %d of %s from %q, want from %s", attempt, ev.ID, ev.Attempt, ev.Type, ev.UserID, shop)
		}
	}

	// (e) A dead letter (after a retry, so of the node's own copy)
	// carries it too.
	poison := publish(`{"Poison":true}`)
	rec.next(t)
	rec.next(t)
	check := rawConn(t, url)
	d := nextDead(t, check)
	if d.MessageId != poison || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonPermanent {
		t.Fatalf("dead letter %s with %v", d.MessageId, d.Headers)
	}
	if d.UserId != "guest" || d.Headers[wire.HeaderUserID] != shop {
		t.Errorf("dead letter by user-id %q with %s=%v, want by the node's user guest, of %s", d.UserId, wire.HeaderUserID, d.Headers[wire.HeaderUserID], shop)
	}
	if d.RoutingKey != "module.shop.order.created" || d.Headers[wire.HeaderRoutingKey] != nil || d.Headers[wire.HeaderAttempt] != nil {
		t.Errorf("dead letter by key %q with %v: want the type as its key and no retry headers", d.RoutingKey, d.Headers)
	}
	if m := deadletters.ReadDead(d); m.UserID != shop || m.DeadBy != "guest" || m.Type != "module.shop.order.created" || m.Queue != "berlin.billing.events" {
		t.Errorf("dead letter read as user %q, dead by %q, type %q, queue %q", m.UserID, m.DeadBy, m.Type, m.Queue)
	}
	if ev := dead.next(t); ev.ID != poison || ev.UserID != shop || ev.DeadQueue != "berlin.billing.events" {
		t.Errorf("DeadLetters handler got %s from %q, dead in %q", ev.ID, ev.UserID, ev.DeadQueue)
	} else if _, ok := ev.Headers[wire.HeaderUserID]; ok {
		t.Errorf("DeadLetters handler got the runtime's header %s", wire.HeaderUserID)
	}
}

// TestDLQReplayRefusesAForgedQueue: a dead letter claiming, in
// x-mesh-dead-queue, that a tool's request queue gave up on it is left in
// mesh.dead-letters by the replay, which says why, and the tool never runs;
// the dead letters of a module's queue and of a queue a module consumes go
// back, under the replaying user. The replay is over when the module has
// handled its copy, and a call to the tool afterwards is the first request
// it serves.
func TestDLQReplayRefusesAForgedQueue(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "berlin", nil)
	var mu sync.Mutex
	var served []string
	load(t, n, serveModule("echo", "echo.run", func(ctx context.Context, req sdk.Request) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		served = append(served, string(req.Body)+" from "+req.Caller)
		return "ok", nil
	}), runtime.ModuleConfig{})
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", rec) }}, runtime.ModuleConfig{})
	raw := rawConn(t, url)
	if _, err := raw.QueueDeclare("shop.orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}

	deadLetter := func(queue, body string) string {
		id := ulid.Make().String()
		publishConfirmed(t, raw, wire.ExchangeDead, "module.shop.order.created", amqp.Publishing{
			Headers: contractHeaders(id, "mallory", amqp.Table{wire.HeaderDeadQueue: queue, wire.HeaderDeadReason: wire.DeadReasonPermanent,
				wire.HeaderDeadAttempts: int64(1), wire.HeaderDeadError: "x", wire.HeaderUserID: "shop",
				wire.HeaderDeadTime: time.Now().UTC().Format(time.RFC3339Nano)}),
			ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, UserId: "guest", Body: []byte(body),
		})
		return id
	}
	forged := map[string]string{}
	for _, q := range []string{"serve.echo.run", "mesh.node.berlin.lock", "berlin.billing.dead"} {
		forged[deadLetter(q, `"forged"`)] = q
	}
	toBilling := deadLetter("berlin.billing.events", `{"n":1}`)
	toOrders := deadLetter("shop.orders", `{"n":2}`)

	operator, operatorURL := brokerUser(t, url, ".*", ".*", ".*", "")
	conn, _ := dialAs(t, operatorURL)
	res, err := deadletters.Replay(emitCtx(t), conn, wire.QueueDead, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 2 || res.Queues["berlin.billing.events"] != 1 || res.Queues["shop.orders"] != 1 || len(res.Left) != 3 {
		t.Errorf("replay: %+v", res)
	}
	for _, l := range res.Left {
		q := forged[l.ID]
		if q == "" || l.Queue != q || !errors.Is(l.Err, deadletters.ErrForbiddenTarget) || !strings.Contains(l.Err.Error(), q) {
			t.Errorf("left %s (queue %q): %v", l.ID, l.Queue, l.Err)
		}
	}
	if ev := rec.next(t); ev.ID != toBilling || ev.Type != "module.shop.order.created" || ev.UserID != operator {
		t.Errorf("billing handled %s as %s from %q, want %s from the replaying user %s", ev.ID, ev.Type, ev.UserID, toBilling, operator)
	}
	// The tool's queue got nothing: a call now is the first request it serves.
	var answer string
	if err := n.Call(callCtx(t, 15*time.Second), "probe", "echo.run", "probe", &answer); err != nil || answer != "ok" {
		t.Fatalf("call: %q, %v", answer, err)
	}
	mu.Lock()
	if len(served) != 1 || served[0] != `"probe" from probe` {
		t.Errorf("the tool served %q, want only the probe", served)
	}
	mu.Unlock()
	// The replay to a consumed queue, on the wire: by the replaying user,
	// the original's in x-mesh-user-id, the type in x-mesh-routing-key.
	d := nextFrom(t, raw, "shop.orders")
	if d.MessageId != toOrders || d.UserId != operator || d.Headers[wire.HeaderUserID] != "shop" ||
		d.Headers[wire.HeaderRoutingKey] != "module.shop.order.created" || d.Headers[wire.HeaderDeadQueue] != nil {
		t.Errorf("replayed to shop.orders: %s by %q with %v", d.MessageId, d.UserId, d.Headers)
	}
	left, err := deadletters.List(emitCtx(t), conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || len(left) != 3 {
		t.Errorf("left in %s: %d, %v", wire.QueueDead, len(left), err)
	}
}

// oneEventLog is a replay.Log holding the given events.
type oneEventLog struct{ events []replay.Event }

func (l *oneEventLog) Cutoff(context.Context) (int64, error) { return 1, nil }
func (l *oneEventLog) Count(context.Context, int64) (int64, error) {
	return int64(len(l.events)), nil
}
func (l *oneEventLog) Page(_ context.Context, after, _ int64) ([]replay.Event, int64, error) {
	if after > 0 {
		return nil, 0, nil
	}
	return l.events, 0, nil
}
func (l *oneEventLog) Record(context.Context, string, string, []replay.Sent) error { return nil }

// TestAuditReplayCarriesTheReplayingUser: an audit replay, to mesh.events or
// to one module's queue, publishes as the replaying connection's user
// (checked by the broker), so a handler sees who replayed the event, with
// the original publisher's user in x-mesh-user-id on the wire.
func TestAuditReplayCarriesTheReplayingUser(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "berlin", nil)
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", rec) }},
		runtime.ModuleConfig{AllowDuplicates: true})
	raw := rawConn(t, url)
	tap := watchQueue(t, raw, "module.shop.#")

	operator, operatorURL := brokerUser(t, url, ".*", ".*", ".*", "")
	conn, _ := dialAs(t, operatorURL)
	id := ulid.Make().String()
	at := time.Now().UTC().Add(-time.Hour)
	log := &oneEventLog{events: []replay.Event{{ID: id, Type: "module.shop.order.created", UserID: "shop", Time: at, Body: []byte(`{}`),
		Headers: map[string]string{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "far", wire.HeaderTime: at.Format(time.RFC3339Nano),
			wire.HeaderUserID: "forged", wire.HeaderRoutingKey: "node.berlin.drained"}}}}
	for i, queue := range []string{"", "berlin.billing.events"} {
		replayID := fmt.Sprintf("01REPLAY%018d", i)
		if _, err := replay.Run(emitCtx(t), conn, log, replay.Options{ID: replayID, Queue: queue}); err != nil {
			t.Fatalf("replay to %q: %v", queue, err)
		}
		if ev := rec.next(t); ev.ID != id || ev.Type != "module.shop.order.created" || ev.UserID != operator || ev.Headers[wire.HeaderReplayID] != replayID {
			t.Errorf("replay to %q handled as %s from %q (replay %q), want from the replaying user %s", queue, ev.Type, ev.UserID, ev.Headers[wire.HeaderReplayID], operator)
		}
	}
	d := nextFrom(t, raw, tap)
	if d.MessageId != id || d.UserId != operator || d.Headers[wire.HeaderUserID] != "shop" || d.Headers[wire.HeaderRoutingKey] != nil {
		t.Errorf("replayed to mesh.events: %s by %q with %v", d.MessageId, d.UserId, d.Headers)
	}
}
