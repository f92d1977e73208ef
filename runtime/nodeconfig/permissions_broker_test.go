package nodeconfig_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
	"github.com/meshkit/mesh/sdk"
)

// TestLeastPrivilegeOnTheBroker: a node whose broker user has exactly the
// permissions nodeconfig computes for it runs its modules: it declares the
// topology and its queues, consumes, emits, serves and calls a tool,
// retries on a classic queue and dead-letters, emits a delayed event that
// its mover delivers, and tails (a server-named
// queue it binds, as its membership queue). The same user is refused by
// RabbitMQ (403) when it publishes another module's or node's events,
// declares another node's queue, binds another tool's serve queue, or
// consumes another node's queue or the mesh's keeper queues. (The test
// of what meshctl prints, for nodes and the operator, with membership
// between two nodes, is cmd/meshctl's TestPrintedPermissionsOnTheBroker.)
func TestLeastPrivilegeOnTheBroker(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, password := brokertest.User(t)
	nodeURL := fmt.Sprintf("amqp://%s:%s@%s/%s", user, password, brokertest.Host(), vhost)
	f := nodeconfig.File{Node: "n1", AMQPURL: nodeURL, DelayPublishers: []string{"guest"}, Modules: []nodeconfig.Module{
		{Name: "shop", Tools: []string{"shop.*"}, QueueType: "classic", MaxAttempts: 2, Group: "eu"}, // its events through its group's queue, its retries through its own
		{Name: "mail", DeadLetters: []string{"#"}, Calls: []string{"shop.*"}},
		{Name: "ledger", Group: "books", Partitions: 2}, // its group's exchanges, intake and partitions
	}}
	p := f.Permissions("", nil)
	if p.User != user || p.VHost != vhost {
		t.Fatalf("permissions for %s on %s, want %s on %s", p.User, p.VHost, user, vhost)
	}
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
	for _, tp := range p.Topics {
		brokertest.Ctl(t, "set_topic_permissions", "-p", vhost, user, tp.Exchange, tp.Write, tp.Read)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := f.Runtime()
	cfg.StateDir, cfg.Logger = t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("a node with its computed permissions: %v", err)
	}
	defer n.Close(context.Background())
	got := make(chan sdk.Event, 10)
	dead := make(chan sdk.Event, 10)
	shop, err := n.Load(ctx, sdk.Module{Name: "shop", Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("module.mail.sent", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { got <- ev; return nil })),
			m.On("module.mail.bounced", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { return errors.New("no") })),
			m.Serve("shop.price", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return 42, nil })),
		)
	}}, f.Modules[0].ModuleConfig())
	if err != nil {
		t.Fatalf("load shop: %v", err)
	}
	mail, err := n.Load(ctx, sdk.Module{Name: "mail", Emits: []string{"sent", "bounced"}, DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { dead <- ev; return nil })},
		f.Modules[1].ModuleConfig())
	if err != nil {
		t.Fatalf("load mail: %v", err)
	}
	booked := make(chan sdk.Event, 10)
	if _, err := n.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("module.mail.sent", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { booked <- ev; return nil }))
	}}, f.Modules[2].ModuleConfig()); err != nil {
		t.Fatalf("load ledger, an ordered group's member: %v", err)
	}
	id, err := mail.Mesh().Emit(ctx, "sent", map[string]int{"n": 1}, sdk.WithKey("acct-1"))
	if err != nil {
		t.Fatalf("emit module.mail.sent: %v", err)
	}
	select {
	case ev := <-booked:
		if ev.ID != id || ev.Headers[wire.HeaderPartitionKey] != "acct-1" {
			t.Errorf("ledger got %s (key %q), want %s of key acct-1", ev.ID, ev.Headers[wire.HeaderPartitionKey], id)
		}
	case <-ctx.Done():
		t.Fatal("ledger, through its ordered group's partition, never got module.mail.sent")
	}
	// The operator changes ledger's partition count (2 -> 4): n1, the
	// intake's member, makes the change under its own permissions
	// (the epoch's exchange, partitions and catch-up queues; bindings;
	// the retired queues' deletes), and the group goes on.
	opConn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer opConn.Close()
	opUser, _ := nodeconfig.BrokerAccount(url)
	if _, err := runtime.StartRepartition(ctx, opConn, opUser, "books", "ledger", 4); err != nil {
		t.Fatalf("repartition ledger: %v", err)
	}
	for {
		e, err := runtime.ReadGroupEpoch(opConn, "books", "ledger", 0, 2)
		if err != nil {
			t.Fatal(err)
		}
		if e.Number == 1 && e.Partitions == 4 && len(e.Pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the change of ledger's partition count is not over under n1's permissions: %+v", e)
		case <-time.After(100 * time.Millisecond):
		}
	}
	again, err := mail.Mesh().Emit(ctx, "sent", map[string]int{"n": 2}, sdk.WithKey("acct-1"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-booked:
		if ev.ID != again {
			t.Errorf("ledger got %s after the change, want %s", ev.ID, again)
		}
	case <-ctx.Done():
		t.Fatal("ledger never got module.mail.sent after its partition count changed")
	}
	select {
	case ev := <-got:
		if ev.ID != id {
			t.Errorf("shop got %s, want %s", ev.ID, id)
		}
	case <-ctx.Done():
		t.Fatal("shop never got module.mail.sent")
	}
	select {
	case ev := <-got:
		if ev.ID != again {
			t.Errorf("shop got %s, want %s", ev.ID, again)
		}
	case <-ctx.Done():
		t.Fatal("shop never got the second module.mail.sent")
	}
	var price int
	if err := mail.Mesh().Call(ctx, "shop.price", nil, &price); err != nil || price != 42 {
		t.Errorf("call shop.price: %d, %v", price, err)
	}
	// A classic queue's retry (through the default exchange), then the
	// dead letter (mesh.events.dead), which mail's DeadLetters receives.
	bounced, err := mail.Mesh().Emit(ctx, "bounced", 1)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-dead:
		if ev.ID != bounced || ev.DeadAttempts != 2 {
			t.Errorf("dead letter %s after %d attempts, want %s after 2", ev.ID, ev.DeadAttempts, bounced)
		}
	case <-ctx.Done():
		t.Fatal("the failing event was never dead-lettered")
	}
	if _, err := n.Emit(ctx, "n1", "node.n1.joined", 1); err != nil {
		t.Errorf("emit node.n1.joined: %v", err)
	}
	// A delayed emit: into the cascade, out of the node's due queue by its
	// mover, to shop.
	later, err := mail.Mesh().Emit(ctx, "sent", 3, sdk.After(time.Second))
	if err != nil {
		t.Fatalf("a delayed emit: %v", err)
	}
	select {
	case ev := <-got:
		if ev.ID != later {
			t.Errorf("shop got %s, want the delayed %s", ev.ID, later)
		}
	case <-ctx.Done():
		t.Fatal("shop never got the delayed module.mail.sent")
	}
	// A schedule of the operator's user (delay_publishers) for a type n1's
	// user may not publish: n1's mover dead-letters it, and its session
	// goes on (the broker closed only the channel it tried on).
	op, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	opCh, err := op.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := opCh.Publish(delay.ExchangeIn, delay.RoutingKey(0, "n1"), false, false, amqp.Publishing{MessageId: "ops-deploy", UserId: "guest",
		Headers: amqp.Table{wire.HeaderRoutingKey: "mesh.ops.deploy"}, DeliveryMode: amqp.Persistent, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	kept, err := opCh.Consume(wire.QueueDead, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for waiting := true; waiting; {
		select {
		case d := <-kept:
			if d.MessageId != "ops-deploy" {
				continue
			}
			if why, _ := d.Headers[wire.HeaderDeadError].(string); !strings.Contains(why, "may not publish") {
				t.Errorf("the refused schedule's dead letter says %q", why)
			}
			waiting = false
		case <-ctx.Done():
			t.Fatal("the schedule n1 may not publish was never dead-lettered")
		}
	}
	if st := n.Stats(); st.Disconnects != 0 {
		t.Errorf("the node lost its session %d times over a schedule it may not publish", st.Disconnects)
	}
	// Tail: a server-named queue, declared, bound (write on it) and
	// consumed.
	tailed, tailErr := make(chan string, 1), make(chan error, 1)
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	go func() {
		tailErr <- n.Tail(tailCtx, "module.mail.#", func() {
			if _, err := mail.Mesh().Emit(tailCtx, "sent", 2); err != nil {
				t.Errorf("emit module.mail.sent: %v", err)
			}
		}, func(ev runtime.TailedEvent) error {
			tailed <- ev.Event.Type
			return errors.New("seen")
		})
	}()
	select {
	case typ := <-tailed:
		if typ != "module.mail.sent" {
			t.Errorf("tail saw %s", typ)
		}
		<-tailErr
	case err := <-tailErr:
		t.Errorf("tail: %v", err)
	case <-ctx.Done():
		t.Fatal("tail saw nothing")
	}
	_ = shop

	// What the user may not do, tried on a raw connection of its own.
	conn, err := amqp.Dial(nodeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	refused := func(what string, do func(ch *amqp.Channel) error) {
		t.Helper()
		if ae := brokertest.ChannelError(t, conn, 10*time.Second, do); ae == nil || ae.Code != amqp.AccessRefused {
			t.Errorf("%s: %v, want 403 ACCESS_REFUSED", what, ae)
		}
	}
	publish := func(key string) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			if err := ch.Confirm(false); err != nil {
				return err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, key, false, false, amqp.Publishing{Body: []byte("{}")})
			if err != nil {
				return err
			}
			_, err = dc.WaitContext(ctx)
			return err
		}
	}
	refused("publish module.billing.paid", publish("module.billing.paid"))
	refused("publish node.n2.joined", publish("node.n2.joined"))
	refused("declare n2.shop.events", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("n2.shop.events", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	refused("declare mesh.node.n2.due", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("mesh.node.n2.due", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	for _, queue := range []string{wire.QueueDead, wire.QueueUnrouted, "n2.shop.events", "mesh.node.n2.due"} {
		refused("consume "+queue, func(ch *amqp.Channel) error {
			_, err := ch.Consume(queue, "", false, false, false, false, nil)
			return err
		})
	}
	refused("bind serve.billing.charge", func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
			return err
		}
		return ch.QueueBind("serve.billing.charge", "billing.charge", wire.ExchangeRPC, false, nil)
	})
}

// TestAFeatureWithoutItsPermissionsIsOff: a node whose broker user has the
// permissions computed for a config with delays off (as an operator
// printed them before delays were on by default), run with delays on: it
// starts and runs its modules, logs one warning naming the feature and
// the fix, refuses a delayed emit saying why, and its heartbeat leaves
// delays out of its features (meshctl features shows the node lacking
// it), instead of exiting with ACCESS_REFUSED.
func TestAFeatureWithoutItsPermissionsIsOff(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, password := brokertest.User(t)
	nodeURL := fmt.Sprintf("amqp://%s:%s@%s/%s", user, password, brokertest.Host(), vhost)
	off := false
	f := nodeconfig.File{Node: "n1", AMQPURL: nodeURL, Delays: &off, Modules: []nodeconfig.Module{{Name: "shop"}}}
	p := f.Permissions("", nil)
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
	for _, tp := range p.Topics {
		brokertest.Ctl(t, "set_topic_permissions", "-p", vhost, user, tp.Exchange, tp.Write, tp.Read)
	}

	f.Delays = nil // delays on, the default
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := f.Runtime()
	if !cfg.Delays {
		t.Fatal("delays are not on by default")
	}
	var logs syncLog
	cfg.StateDir, cfg.Logger = t.TempDir(), slog.New(slog.NewTextHandler(&logs, nil))
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("a node lacking the delays' permissions: %v", err)
	}
	defer n.Close(context.Background())
	shop, err := n.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"sold"}}, f.Modules[0].ModuleConfig())
	if err != nil {
		t.Fatalf("load shop: %v", err)
	}
	if _, err := shop.Mesh().Emit(ctx, "sold", map[string]int{"n": 1}); err != nil {
		t.Errorf("an emit on a node without delays: %v", err)
	}
	_, err = shop.Mesh().Emit(ctx, "sold", map[string]int{"n": 2}, sdk.After(time.Minute))
	if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), "delays, which are off on this node") || !strings.Contains(err.Error(), "meshctl topology permissions") {
		t.Errorf("a delayed emit on a node whose delays are refused: %v", err)
	}
	if got := n.Features(); slices.Contains(got, runtime.FeatureDelays) {
		t.Errorf("features %v include delays", got)
	}
	if n.MeshHas(runtime.FeatureDelays) {
		t.Error("the mesh has delays, with this node lacking them")
	}
	log := logs.String()
	if strings.Count(log, "a feature is off") != 1 || !strings.Contains(log, "feature=delays") || !strings.Contains(log, "ACCESS_REFUSED") || !strings.Contains(log, "set_permissions") {
		t.Errorf("the log does not warn once, naming the feature, the refusal and the fix:\n%s", log)
	}
	states := runtime.MeshFeatures([]runtime.Heartbeat{{Node: "n1", Release: "v0.2.0", Features: []string{"history"}}, {Node: "old"}})
	if states[0].Feature != runtime.FeatureDelays || !slices.Equal(states[0].Lacks, []string{"n1"}) || !slices.Equal(states[0].Has, []string{"old"}) {
		t.Errorf("MeshFeatures: %+v", states)
	}
}

// syncLog is a log buffer safe for concurrent writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSpooledDelayedEmitWithDelaysRefused: a node of the same permissions
// that starts before the broker answers accepts a delayed emit into its
// spool (it cannot know yet that its delays will be refused). Once it
// connects and the broker refuses the cascade, that event does not hold
// the spool: it is dead-lettered at once (reason refused, saying delays
// are off), and the event spooled behind it is published.
func TestSpooledDelayedEmitWithDelaysRefused(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, password := brokertest.User(t)
	proxy := brokertest.NewProxy(t)
	proxy.Down()
	nodeURL := fmt.Sprintf("amqp://%s:%s@%s/%s", user, password, proxy.Addr(), vhost)
	off := false
	f := nodeconfig.File{Node: "n1", AMQPURL: nodeURL, Delays: &off, Modules: []nodeconfig.Module{{Name: "shop"}}}
	p := f.Permissions("", nil)
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
	for _, tp := range p.Topics {
		brokertest.Ctl(t, "set_topic_permissions", "-p", vhost, user, tp.Exchange, tp.Write, tp.Read)
	}
	// The mesh's exchanges, for the taps to bind before the node runs.
	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ch, err := raw.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range runtime.MeshObjects() {
		if o.Kind == "exchange" {
			if err := ch.ExchangeDeclare(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args); err != nil {
				t.Fatal(err)
			}
		}
	}
	events := brokertest.Tap(t, url, wire.ExchangeEvents, "module.shop.#")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")

	f.Delays = nil // delays on, the default
	cfg := f.Runtime()
	cfg.StateDir, cfg.Logger = t.TempDir(), slog.New(slog.DiscardHandler)
	cfg.StartWithoutBroker, cfg.ReconnectMin, cfg.ReconnectMax = true, 20*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	shop, err := n.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"sold"}}, f.Modules[0].ModuleConfig())
	if err != nil {
		t.Fatalf("load shop: %v", err)
	}
	delayed, err := shop.Mesh().Emit(ctx, "sold", 1, sdk.After(time.Hour))
	if err != nil {
		t.Fatalf("a delayed emit before the broker answers: %v", err)
	}
	plain, err := shop.Mesh().Emit(ctx, "sold", 2)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Up()
	for got := 0; got < 2; {
		select {
		case d := <-dead:
			if d.MessageId != delayed || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonRefused ||
				!strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadError]), "delays are off on this node") {
				t.Errorf("dead letter %s: %v, want the delayed event %s, refused, saying delays are off", d.MessageId, d.Headers, delayed)
			}
			got++
		case d := <-events:
			if d.MessageId != plain {
				t.Errorf("published %s, want only the plain event %s", d.MessageId, plain)
			}
			got++
		case <-ctx.Done():
			t.Fatalf("the spooled events did not come out (%d of 2)", got)
		}
	}
}
