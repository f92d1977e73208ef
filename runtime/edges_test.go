package runtime_test

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strconv"
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

// unacked is how many of queue's messages are delivered and not
// acknowledged, as the queue itself says (rabbitmqctl, not the
// management API's statistics, which lag).
func unacked(t *testing.T, vhostURL, queue string) int {
	t.Helper()
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "-p", strings.TrimPrefix(u.Path, "/"), "name", "messages_unacknowledged").Output()
	if err != nil {
		t.Fatalf("list_queues: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("list_queues: %q", line)
			}
			return n
		}
	}
	t.Fatalf("list_queues: no queue %s in\n%s", queue, out)
	return 0
}

// TestTimeoutOnTheLastAttemptIsAcked: a handler that overruns its timeout
// on its last attempt has its event dead-lettered, and the delivery is
// acknowledged then, not when (if ever) another delivery comes. (A
// classic queue: rabbitmqctl reads its unacked count from the queue
// itself; a quorum queue's comes from metrics that lag.)
func TestTimeoutOnTheLastAttemptIsAcked(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	ch := rawConn(t, vhost)
	hung := make(chan struct{})
	t.Cleanup(func() { close(hung) })
	entered := make(chan struct{}, 1)
	load(t, n, sdk.Module{Name: "sloth", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.slow.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			entered <- struct{}{}
			<-hung // ignores its context: overruns
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 1, HandlerTimeout: 200 * time.Millisecond, Prefetch: 32, Concurrency: 4, QueueType: runtime.QueueClassic})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.slow.job", 1); err != nil {
		t.Fatal(err)
	}
	<-entered
	d := nextDead(t, ch)
	if d.Headers[wire.HeaderDeadReason] == nil {
		t.Fatalf("dead letter without a reason: %+v", d.Headers)
	}
	queue := wire.ModuleQueue("anchor", "sloth")
	waitFor(t, 10*time.Second, func() bool { return unacked(t, vhost, queue) == 0 })
}

// TestEmitWhileTheDrainWaitsForConfirms: while the spool's drain holds
// new appends back and waits for the confirms of its last batch (held
// here by a hook, as a quorum queue without a majority withholds them),
// an emit still returns, spooled, and every event reaches the broker
// once the confirms come.
func TestEmitWhileTheDrainWaitsForConfirms(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(vhost, brokertest.Host(), proxy.Addr(), 1), "anchor", func(c *runtime.Config) {
		c.ReconnectMin, c.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	})
	ch := rawConn(t, vhost)
	if _, err := ch.QueueDeclare("sink", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("sink", "mesh.drain.#", wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	emitted := make(chan error, 1) // what the emit made while the drain waited returned
	var once sync.Once
	n.SetTestHooks(runtime.TestHooks{DrainWaits: func() {
		once.Do(func() {
			// The drain has published the spool's last batch and waits
			// (for as long as this hook holds it): an emit now must not
			// wait for it.
			returned := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_, err := n.Emit(ctx, "test", "mesh.drain.during", 0)
				returned <- err
			}()
			select {
			case err := <-returned:
				emitted <- err
			case <-time.After(30 * time.Second):
				emitted <- errors.New("the emit never returned while the drain waited for confirms")
			}
		})
	}})
	proxy.Down() // the node loses the broker: emits are spooled
	waitFor(t, 15*time.Second, func() bool { return !n.Stats().Connected })
	const spooled = 3
	for i := range spooled {
		if _, err := n.Emit(emitCtx(t), "test", "mesh.drain.before", i); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Up() // the node reconnects and drains: the hook holds its confirm wait
	select {
	case err := <-emitted:
		if err != nil {
			t.Fatalf("emit while the drain waited: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the drain never waited for confirms")
	}
	got := map[string]int{}
	for range spooled + 1 {
		d := nextFrom(t, ch, "sink")
		got[d.RoutingKey]++
	}
	if got["mesh.drain.before"] != spooled || got["mesh.drain.during"] != 1 {
		t.Fatalf("the sink got %v, want %d before and 1 during", got, spooled)
	}
}

// consumerTags are the tags of queue's consumers, as the broker lists
// them.
func consumerTags(t *testing.T, vhostURL, queue string) []string {
	t.Helper()
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("rabbitmqctl", "-q", "list_consumers", "-p", strings.TrimPrefix(u.Path, "/"), "queue_name", "consumer_tag").Output()
	if err != nil {
		t.Fatalf("list_consumers: %v", err)
	}
	var tags []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			tags = append(tags, f[1])
		}
	}
	return tags
}

// TestLongNamesKeepTheirConsumerTags: a consumer whose tag would pass the
// 255 bytes of an AMQP short string (a long tool key, a long queue name)
// still gets a tag of the node's, cut with a digest, never one the broker
// makes up, so Stop cancels it by name.
func TestLongNamesKeepTheirConsumerTags(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	ch := rawConn(t, vhost)
	key := "long." + strings.Repeat("k", 240)
	queue := "legacy." + strings.Repeat("q", 240)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	m := load(t, n, sdk.Module{Name: "longnames", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.Serve(key, sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) { return "ok", nil })),
			m.Consume(queue, 1, newRecorder(nil)))
	}}, runtime.ModuleConfig{ToolGrants: []string{"long.*"}})
	for _, q := range []string{wire.ServeQueue(key), queue} {
		tags := consumerTags(t, vhost, q)
		if len(tags) != 1 || !strings.HasPrefix(tags[0], "mesh.anchor.longnames.") || len(tags[0]) > 255 {
			t.Errorf("%s: consumer tags %q, want one of the node's, at most 255 bytes", q[:20], tags)
		}
	}
	stop(t, m)
	for _, q := range []string{wire.ServeQueue(key), queue} {
		if tags := consumerTags(t, vhost, q); len(tags) != 0 {
			t.Errorf("%s: consumers %q left after Stop", q[:20], tags)
		}
	}
}

// TestUnrecordedEventIsNotAcked: a de-duplicating module whose record of
// handled ids fails (a full disk, forced here) does not acknowledge the
// event until the record works: while it fails, the delivery stays
// unacknowledged; the handler ran once.
func TestUnrecordedEventIsNotAcked(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	queue := wire.ModuleQueue("anchor", "recorder")
	var mu sync.Mutex
	calls, unackedWhileFailing := 0, -1
	n.SetTestHooks(runtime.TestHooks{Record: func(id string, err error) error {
		mu.Lock()
		calls++
		c := calls
		mu.Unlock()
		switch c {
		case 1:
			return errors.New("no space left on device (forced)")
		case 2:
			u := unacked(t, vhost, queue) // the ack has not gone out
			mu.Lock()
			unackedWhileFailing = u
			mu.Unlock()
			return errors.New("no space left on device (forced)")
		}
		return err
	}})
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "recorder", Setup: func(m sdk.Mesh) error { return m.On("mesh.rec.#", rec) }},
		runtime.ModuleConfig{QueueType: runtime.QueueClassic})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.rec.one", 1); err != nil {
		t.Fatal(err)
	}
	rec.next(t)
	waitFor(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls >= 3
	})
	waitFor(t, 10*time.Second, func() bool { return unacked(t, vhost, queue) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if unackedWhileFailing != 1 {
		t.Errorf("while the record failed, %d unacked: want the delivery held (1)", unackedWhileFailing)
	}
	if rec.count() != 1 {
		t.Errorf("the handler ran %d times, want once", rec.count())
	}
}

// TestUnwrittenRecordsHoldTheAck: a de-duplicating module whose handled
// ids cannot be written down (a full disk, forced at the write its acker
// makes before it acks) sends no ack until the write works: while it
// fails, the delivery stays unacknowledged, the write is tried again by
// itself (no other delivery comes to prompt it), and the handler ran
// once. The ack then goes, after the record is on disk.
func TestUnwrittenRecordsHoldTheAck(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	queue := wire.ModuleQueue("anchor", "writer")
	var mu sync.Mutex
	failing, unackedWhileFailing := 0, -1
	n.SetTestHooks(runtime.TestHooks{WriteRecords: func(err error) error {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("the real write failed: %v", err)
		}
		switch failing++; failing {
		case 1:
			return errors.New("no space left on device (forced)")
		case 2:
			unackedWhileFailing = unacked(t, vhost, queue) // the ack has not gone out
			return errors.New("no space left on device (forced)")
		}
		return err
	}})
	rec := newRecorder(nil)
	load(t, n, sdk.Module{Name: "writer", Setup: func(m sdk.Mesh) error { return m.On("mesh.write.#", rec) }},
		runtime.ModuleConfig{QueueType: runtime.QueueClassic})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.write.one", 1); err != nil {
		t.Fatal(err)
	}
	rec.next(t)
	waitFor(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return failing >= 3
	})
	waitFor(t, 10*time.Second, func() bool { return unacked(t, vhost, queue) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if unackedWhileFailing != 1 {
		t.Errorf("while the write failed, %d unacked: want the delivery held (1)", unackedWhileFailing)
	}
	if rec.count() != 1 {
		t.Errorf("the handler ran %d times, want once", rec.count())
	}
}

// dropConsumer makes the broker forget the consumer of quorum queue in
// the virtual host of vhostURL without telling its channel: a rabbit_fifo
// cancel command sent to the queue's leader, as RabbitMQ 3.10 itself did
// in the soak to a consumer registered while the queue had no leader.
func dropConsumer(t *testing.T, vhostURL, queue string) {
	t.Helper()
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	expr := `{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"` + strings.TrimPrefix(u.Path, "/") + `">>, queue, <<"` + queue + `">>)),` +
		` [C] = rabbit_amqqueue:consumers(Q),` +
		` ra:process_command(amqqueue:get_pid(Q), rabbit_fifo:make_checkout({element(2, C), element(1, C)}, cancel, #{})).`
	out, err := exec.Command("rabbitmqctl", "eval", expr).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "{ok,") {
		t.Fatalf("drop the consumer of %s: %v\n%s", queue, err, out)
	}
}

// waitReadyAgain waits until n is ready once its modules consume again:
// Ready says so once a module's attach has returned, and a module's
// handlers may run on the consumers it made before then (a resume after a
// first attach the busy broker could not give at once, say).
func waitReadyAgain(t *testing.T, n *runtime.Node) {
	t.Helper()
	var err error
	defer func() {
		if t.Failed() {
			t.Logf("Ready, last asked: %v", err)
		}
	}()
	waitFor(t, 30*time.Second, func() bool { err = n.Ready(); return err == nil })
}

// TestLostConsumerIsConsumedAgain: the broker drops the consumers of a
// module's queue and of a queue it consumes without a word to their
// channels (as RabbitMQ 3.10 can, see checkConsumers). The module finds
// them gone, consumes both again, and the events that wait in them are
// handled; without the check they would wait forever while the module
// looks healthy.
func TestLostConsumerIsConsumedAgain(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", func(c *runtime.Config) { c.ConsumerCheckInterval = 50 * time.Millisecond })
	ch := rawConn(t, vhost)
	const outside = "outside.orders"
	if _, err := ch.QueueDeclare(outside, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 16)
	load(t, n, sdk.Module{Name: "keeper", Setup: func(m sdk.Mesh) error {
		on := m.On("mesh.keep.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled <- "event"
			return nil
		}))
		return errors.Join(on, m.Consume(outside, 4, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled <- "message"
			return nil
		})))
	}}, runtime.ModuleConfig{ConsumeGrants: []string{outside}})
	own := wire.ModuleQueue("anchor", "keeper")
	for _, q := range []string{own, outside} {
		dropConsumer(t, vhost, q)
		if info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil || info.Consumers != 0 {
			t.Fatalf("after the drop, queue %s reports %d consumers (%v)", q, info.Consumers, err)
		}
	}
	if _, err := n.Emit(emitCtx(t), "test", "mesh.keep.this", 1); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", outside, false, false, amqp.Publishing{MessageId: "m-1", Body: []byte(`{}`), DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	limit := time.After(30 * time.Second)
	for len(seen) < 2 {
		select {
		case what := <-handled:
			seen[what] = true
		case <-limit:
			t.Fatalf("handled after the consumers were dropped: %v (the module must consume both queues again)", seen)
		}
	}
	if lost := n.Stats().ConsumersLost; lost < 2 {
		t.Errorf("Stats.ConsumersLost = %d, want 2 or more", lost)
	}
	waitReadyAgain(t, n)
}

// TestStalledConsumerIsConsumedAgain: the broker checks a whole prefetch
// of a module's queue, and of a queue it consumes, out to their consumers
// and never delivers it (as RabbitMQ 3.10 did in the soak; forced here by
// the workers dropping those deliveries unseen). The consumers' credit is
// spent, nothing more comes, and the queues report a consumer: the module
// finds them stalled, consumes both again, and every event and message is
// handled, those held back among them; without the check they would wait
// forever while the module looks healthy.
func TestStalledConsumerIsConsumedAgain(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", func(c *runtime.Config) { c.ConsumerCheckInterval = 50 * time.Millisecond })
	ch := rawConn(t, vhost)
	const outside = "outside.stalled"
	if _, err := ch.QueueDeclare(outside, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	own := wire.ModuleQueue("anchor", "keeper")
	var mu sync.Mutex
	unseen := map[string]int{own: 2, outside: 4} // each consumer's prefetch
	n.SetTestHooks(runtime.TestHooks{Unseen: func(queue string) bool {
		mu.Lock()
		defer mu.Unlock()
		if unseen[queue] > 0 {
			unseen[queue]--
			return true
		}
		return false
	}})
	handled := make(chan string, 64)
	load(t, n, sdk.Module{Name: "keeper", Setup: func(m sdk.Mesh) error {
		on := m.On("mesh.keep.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled <- "event " + ev.ID
			return nil
		}))
		return errors.Join(on, m.Consume(outside, 4, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled <- "message " + ev.ID
			return nil
		})))
	}}, runtime.ModuleConfig{Prefetch: 2, ConsumeGrants: []string{outside}})

	want := map[string]bool{}
	for i := range 3 { // one more than the prefetch: it waits, ready
		id, err := n.Emit(emitCtx(t), "test", "mesh.keep.this", i)
		if err != nil {
			t.Fatal(err)
		}
		want["event "+id] = true
	}
	for i := range 5 {
		id := "m-" + strconv.Itoa(i)
		if err := ch.Publish("", outside, false, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
		want["message "+id] = true
	}
	limit := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case what := <-handled:
			delete(want, what)
		case <-limit:
			t.Fatalf("not handled: %v (the module must find both consumers stalled and consume them again)", want)
		}
	}
	if lost := n.Stats().ConsumersLost; lost < 2 {
		t.Errorf("Stats.ConsumersLost = %d, want 2 or more", lost)
	}
	waitReadyAgain(t, n)
}

// TestHandlerPastTheGraceIsNotRunAgain: a module stops while a handler
// that ignores its cancelled context still runs; Stop leaves it behind
// after the grace, and its delivery returns to the queue. When it then
// succeeds, its event is recorded as handled all the same, so the
// module's next load acknowledges the redelivery without running it
// again. (Before, the record was closed with Stop and the event ran twice.)
func TestHandlerPastTheGraceIsNotRunAgain(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	recorded := make(chan string, 4)
	n.SetTestHooks(runtime.TestHooks{Record: func(id string, err error) error {
		if err == nil {
			recorded <- id
		}
		return err
	}})
	release := make(chan struct{})
	runs := make(chan string, 4)
	def := sdk.Module{Name: "lingerer", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.linger.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			runs <- ev.ID
			<-release // ignores its cancelled context
			return nil
		}))
	}}
	m := load(t, n, def, runtime.ModuleConfig{})
	id, err := n.Emit(emitCtx(t), "test", "mesh.linger.job", 1)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_ = m.Stop(ctx) // past the grace: the handler is left behind
	cancel()
	close(release)
	select {
	case got := <-recorded:
		if got != id {
			t.Fatalf("recorded %s, want %s", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler left behind succeeded and its event was not recorded as handled")
	}
	load(t, n, def, runtime.ModuleConfig{})
	waitFor(t, 10*time.Second, func() bool { return n.Stats().Duplicates >= 1 })
	select {
	case again := <-runs:
		t.Fatalf("event %s ran again on the next load", again)
	default:
	}
}
