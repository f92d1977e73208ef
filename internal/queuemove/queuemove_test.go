package queuemove_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/queuemove"
	"github.com/meshkit/mesh/internal/wire"
)

var errInterrupted = errors.New("interrupted by the test")

// dial connects to url with raw amqp091-go and opens a channel; the
// connection closes when t ends.
func dial(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// TestMigrateClassicToQuorumUnderLoad: a classic queue holding 500
// messages, with a producer publishing to its exchange throughout, moves
// to a quorum queue with a policy; the migration is interrupted once while
// moving out and once while moving back, and each run again resumes it.
// Read with raw amqp091-go at the end, the queue is quorum, bound as
// before, holds every message the producer had confirmed (none lost;
// duplicates, which a consumer's de-duplication drops, are counted), each
// with its type in x-mesh-routing-key; the temporary queue is gone.
func TestMigrateClassicToQuorumUnderLoad(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	conn, ch := dial(t, url)
	const queue, temp = "n1.ledger.events", "n1.ledger.events.migrating"
	if err := ch.ExchangeDeclare("ev", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "dlx"}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"order.#", "refund.*"} {
		if err := ch.QueueBind(queue, key, "ev", false, nil); err != nil {
			t.Fatal(err)
		}
	}

	// The producer: confirmed ids, from 500 before the migration on.
	var mu sync.Mutex
	confirmed := map[string]bool{}
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(i int) {
		id := "e" + strconv.Itoa(i)
		key := "order.created"
		if i%3 == 0 {
			key = "refund.asked"
		}
		c, err := pub.PublishWithDeferredConfirmWithContext(context.Background(), "ev", key, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-tenant": "acme"}})
		if err != nil {
			return // the test ended: its channel closed
		}
		if c.Wait() {
			mu.Lock()
			confirmed[id] = true
			mu.Unlock()
		}
	}
	for i := range 500 {
		publish(i)
	}
	stop := make(chan struct{})
	produced := make(chan struct{})
	var stopOnce sync.Once
	defer func() { stopOnce.Do(func() { close(stop) }); <-produced }()
	go func() {
		defer close(produced)
		for i := 500; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			publish(i)
		}
	}()

	api, err := brokerapi.New(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := brokerapi.Policy{Name: "mesh.queue." + queue, Pattern: `^n1\.ledger\.events$`, ApplyTo: "queues", Priority: 100,
		Definition: map[string]any{"delivery-limit": 4}}
	t.Cleanup(func() { _ = api.DeletePolicy(context.Background(), policy.Name) })
	plan := queuemove.Plan{Queue: queue, Temp: temp, Args: amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx"}, Policy: &policy}
	mover := func(interruptAt string) *queuemove.Mover {
		return &queuemove.Mover{Conn: conn, API: api, Batch: 50, AfterBatch: func(from string, moved int) error {
			if from == interruptAt {
				return errInterrupted
			}
			return nil
		}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := mover(queue).Migrate(ctx, plan); !errors.Is(err, errInterrupted) {
		t.Fatalf("first run: %v, want it interrupted moving out", err)
	}
	rep, err := mover(temp).Migrate(ctx, plan)
	if !errors.Is(err, errInterrupted) || !rep.Resumed {
		t.Fatalf("second run: %+v %v, want it resumed, then interrupted moving back", rep, err)
	}
	rep, err = mover("").Migrate(ctx, plan)
	if err != nil || !rep.Resumed {
		t.Fatalf("third run: %+v %v, want it resumed and done", rep, err)
	}
	stopOnce.Do(func() { close(stop) })
	<-produced

	q, err := api.Queue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if q.Type != "quorum" || !queuemove.SameArgs(q.Arguments, plan.Args) {
		t.Errorf("queue after the migration: type %s arguments %v", q.Type, q.Arguments)
	}
	bs, err := api.Bindings(ctx, queue)
	if err != nil || len(bs) != 2 || bs[0] != (brokerapi.Binding{Exchange: "ev", Key: "order.#"}) || bs[1] != (brokerapi.Binding{Exchange: "ev", Key: "refund.*"}) {
		t.Errorf("bindings after the migration: %v %v", bs, err)
	}
	if _, err := api.Queue(ctx, temp); !errors.Is(err, brokerapi.ErrNotFound) {
		t.Errorf("the temporary queue: %v, want it gone", err)
	}
	if _, err := api.Policy(ctx, policy.Name); err != nil {
		t.Errorf("the queue's policy: %v", err)
	}

	got := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got[d.MessageId]++
		if d.Headers["x-tenant"] != "acme" || string(d.Body) != d.MessageId {
			t.Errorf("message %s lost its headers or body: %v %q", d.MessageId, d.Headers, d.Body)
		}
		if d.Exchange == "" {
			n, _ := strconv.Atoi(d.MessageId[1:])
			want := "order.created"
			if n%3 == 0 {
				want = "refund.asked"
			}
			if d.Headers[wire.HeaderRoutingKey] != want || d.UserId != "guest" {
				t.Errorf("moved message %s: %s %v user %q, want its type %s, published as guest", d.MessageId, wire.HeaderRoutingKey, d.Headers[wire.HeaderRoutingKey], d.UserId, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dups := 0, 0
	for id := range confirmed {
		if got[id] == 0 {
			lost++
		}
	}
	for _, n := range got {
		dups += n - 1
	}
	t.Logf("confirmed %d, read %d distinct, %d duplicates (dropped by de-duplication); moved out %d, back %d in the last run", len(confirmed), len(got), dups, rep.MovedOut, rep.MovedIn)
	if lost != 0 || len(confirmed) < 500 {
		t.Errorf("%d of %d confirmed messages lost", lost, len(confirmed))
	}
}

// TestMigrateRefusesWhileConsumed: a queue still consumed (a node that
// does not know migrations) is not deleted under its consumer: the
// migration waits, then says so, and nothing is lost; once the consumer
// goes, running it again finishes it.
func TestMigrateRefusesWhileConsumed(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	conn, ch := dial(t, url)
	const queue, temp = "q", "q.migrating"
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := ch.Publish("", queue, false, false, amqp.Publishing{MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Qos(3, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Consume(queue, "v010", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	api, err := brokerapi.New(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	plan := queuemove.Plan{Queue: queue, Temp: temp, Args: amqp.Table{"x-queue-type": "quorum"}}
	m := &queuemove.Mover{Conn: conn, API: api, ConsumerWait: time.Second}
	ctx := context.Background()
	if _, err := m.Migrate(ctx, plan); !errors.Is(err, queuemove.ErrConsumers) {
		t.Fatalf("migrating a consumed queue: %v, want %v", err, queuemove.ErrConsumers)
	}
	holder.Close() // its 3 unacknowledged messages return to the queue
	rep, err := m.Migrate(ctx, plan)
	if err != nil || !rep.Resumed || rep.MovedIn != 10 {
		t.Fatalf("after the consumer went: %+v %v, want 10 moved back", rep, err)
	}
}
