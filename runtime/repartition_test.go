package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAGroupChangesItsPartitionCountLive: billing keeps order over 16
// partitions on two nodes while its keys' events come without pause (64
// keys from the nodes by sdk.WithKey, 8 more from a raw client setting only
// x-partition-key, through the intake). The operator's StartRepartition
// changes the count to 32 and, once that change is over, back to 16. Every
// key's events are handled once each and in order through both changes,
// a key's events one at a time. The intake's member is held at each start
// marker while the raw client sends: those events reach the group while the
// change is under way and are handled from the change's catch-up queues. At
// the end the group's partitions are epoch 2's 16 (the broker's queues say
// so), the old partitions and catch-up queues are gone, both members say
// epoch 2 in their heartbeats, and a change asked for while none is needed,
// or to 65 partitions, is refused.
func TestAGroupChangesItsPartitionCountLive(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	fast := func(c *runtime.Config) { c.HeartbeatInterval = 200 * time.Millisecond }
	a, b := testNode(t, url, "a", fast), testNode(t, url, "b", fast)
	log := newOrderLog()
	log.atLeastOnce = true // a member that loses its connection leaves what it handled unacknowledged
	atStart, release := make(chan struct{}), make(chan struct{})
	var caught atomic.Int64
	hooks := runtime.TestHooks{
		IntakeMarker: func(marker string) {
			if marker != wire.PartitionsStart {
				return
			}
			select {
			case atStart <- struct{}{}:
				<-release
			case <-time.After(10 * time.Second): // a start marker seen again: not held
			}
		},
		CaughtUp: func(string) { caught.Add(1) },
	}
	a.SetTestHooks(hooks)
	b.SetTestHooks(hooks)
	ordered(t, a, log.handler("a", nil), 16)
	ordered(t, b, log.handler("b", nil), 16)

	conn, user := operator(t, url)
	raw := rawConn(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}

	// The nodes' keys, emitted in turns until stop; last says the last
	// sequence number of each.
	var (
		mu   sync.Mutex
		last = map[string]int{}
	)
	stop := make(chan struct{})
	emitted := make(chan error, 1)
	go func() {
		for seq := 1; ; seq++ {
			for k := range 64 {
				select {
				case <-stop:
					emitted <- nil
					return
				default:
				}
				key := fmt.Sprintf("k%d", k)
				n := a
				if k%2 == 1 {
					n = b
				}
				if _, err := n.Emit(context.Background(), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
					emitted <- err
					return
				}
				mu.Lock()
				last[key] = seq
				mu.Unlock()
			}
		}
	}()
	// The raw client's keys: each a next event, x-partition-key only.
	foreign := func() {
		t.Helper()
		for k := range 8 {
			key := fmt.Sprintf("r%d", k)
			mu.Lock()
			last[key]++
			seq := last[key]
			mu.Unlock()
			bd, _ := json.Marshal(body{Key: key, Seq: seq})
			publishForeign(t, raw, key, bd, "", nil)
		}
	}
	for range 3 {
		foreign()
	}
	handled := func(n int) { waitFor(t, 60*time.Second, func() bool { return log.count() >= n }) }
	handled(500) // under way on both nodes

	change := func(to, epoch int) {
		t.Helper()
		started, err := runtime.StartRepartition(emitCtx(t), conn, user, "g", "billing", to)
		if err != nil {
			t.Fatalf("repartition to %d: %v", to, err)
		}
		if started.Number != epoch || started.Partitions != to {
			t.Fatalf("repartition to %d: asked for %+v, want epoch %d", to, started, epoch)
		}
		select {
		case <-atStart:
		case <-time.After(30 * time.Second):
			t.Fatalf("repartition to %d: the intake's member never reached the start marker", to)
		}
		before := caught.Load()
		for range 3 {
			foreign() // behind the start marker: to the catch-up queues
		}
		release <- struct{}{}
		waitChanged(t, conn, epoch, to)
		if got := caught.Load() - before; got < 24 {
			t.Errorf("repartition to %d: %d events handled from the catch-up queues, want the raw client's 24 at least", to, got)
		}
	}
	change(32, 1)
	handled(log.count() + 500) // on the new count
	change(16, 2)
	handled(log.count() + 500)
	if _, err := runtime.StartRepartition(emitCtx(t), conn, user, "g", "billing", 16); err == nil {
		t.Error("a change to the count the group has was not refused")
	}
	if _, err := runtime.StartRepartition(emitCtx(t), conn, user, "g", "billing", 65); err == nil {
		t.Error("a change to 65 partitions was not refused")
	}
	close(stop)
	if err := <-emitted; err != nil {
		t.Fatal(err)
	}
	foreign()
	mu.Lock()
	want := map[string]int{}
	total := 0
	for k, n := range last {
		want[k] = n
		total += n
	}
	mu.Unlock()
	waitFor(t, 90*time.Second, func() bool { return log.count() >= total })
	log.mu.Lock()
	for _, br := range log.breaches {
		t.Error(br)
	}
	for k, n := range want {
		if log.next[k] != n {
			t.Errorf("key %s: handled up to %d, want %d", k, log.next[k], n)
		}
	}
	if log.handled != total {
		t.Errorf("%d handlings of %d events", log.handled, total)
	}
	log.mu.Unlock()

	// On the wire: epoch 2's 16 partitions, each with its consumers; none
	// of epochs 0 and 1, no catch-up queue.
	for i := range 16 {
		q, err := raw.QueueDeclarePassive(wire.PartitionQueueOf("g", "billing", 2, i), true, false, false, false, nil)
		if err != nil {
			t.Fatalf("partition %d of epoch 2: %v", i, err)
		}
		if q.Consumers == 0 {
			t.Errorf("partition %d of epoch 2 has no consumer", i)
		}
	}
	for _, q := range []string{wire.PartitionQueueOf("g", "billing", 0, 0), wire.PartitionQueueOf("g", "billing", 1, 31), wire.CatchUpQueue("g", "billing", 2, 0)} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s is still there", q)
		}
		_ = ch.Close()
	}
	waitFor(t, 30*time.Second, func() bool {
		for _, n := range []*runtime.Node{a, b} {
			other := "b"
			if n == b {
				other = "a"
			}
			heard := false
			for _, p := range n.Peers() {
				for _, s := range p.Modules {
					if p.Node == other && s.Name == "billing" && s.Epoch == 2 && s.Partitions == 16 {
						heard = true
					}
				}
			}
			if !heard {
				return false
			}
		}
		return true
	})
}

// TestAnEventCannotPoseAsAPartitionMarker: a publisher of events (raw
// amqp091-go, through mesh.events, with a user-id the broker checks)
// sets x-mesh-partitions on its events: retire on one stamped with its
// slot (straight to a partition), start and end on others without (through
// the intake). Each is handled as the event it is, in its key's order, the
// partitions stay, and no change of the count begins.
func TestAnEventCannotPoseAsAPartitionMarker(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a := testNode(t, url, "a", nil)
	log := newOrderLog()
	ordered(t, a, log.handler("a", nil), 4)
	conn, user := operator(t, url)
	raw := rawConn(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	markers := []string{wire.PartitionsRetire, wire.PartitionsStart, wire.PartitionsEnd, wire.PartitionsRetire}
	for seq, marker := range markers {
		bd, _ := json.Marshal(body{Key: "forger", Seq: seq + 1})
		h := amqp.Table{wire.HeaderPartitions: marker}
		if seq == 0 {
			h[wire.SlotHeader("forger")] = wire.SlotMark
		}
		if seq == 1 {
			bd = []byte(`{"key":"forger","seq":2,"epoch":1,"partitions":8,"from":4}`)
		}
		publishForeign(t, raw, "forger", bd, user, h)
	}
	waitFor(t, 30*time.Second, func() bool { return log.count() == len(markers) })
	log.check(t, 0, 0)
	log.mu.Lock()
	if log.next["forger"] != len(markers) {
		t.Errorf("the forger's events handled up to %d, want %d", log.next["forger"], len(markers))
	}
	log.mu.Unlock()
	e, err := runtime.ReadGroupEpoch(conn, "g", "billing", 0, 0)
	if err != nil || e.Number != 0 || e.Partitions != 4 || len(e.Pending) != 0 {
		t.Errorf("the group after the forged markers: %+v, %v; want epoch 0, its 4 partitions", e, err)
	}
}

// TestAGroupKeyedByARuleChangesItsCount: billing keeps order by order_key
// body.key over 4 partitions on two nodes, every event through the intake;
// while 32 keys are emitted without pause (none with sdk.WithKey), the
// count changes to 8. The intake's member is held at the start marker
// until more events have come: those wait in the catch-up queues. Every
// key's events are handled once each, in order.
func TestAGroupKeyedByARuleChangesItsCount(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
	log := newOrderLog()
	log.atLeastOnce = true // a member that loses its connection leaves what it handled unacknowledged
	atStart, release := make(chan struct{}), make(chan struct{})
	var caught atomic.Int64
	hooks := runtime.TestHooks{
		IntakeMarker: func(marker string) {
			if marker == wire.PartitionsStart {
				atStart <- struct{}{}
				<-release
			}
		},
		CaughtUp: func(string) { caught.Add(1) },
	}
	for name, n := range map[string]*runtime.Node{"a": a, "b": b} {
		n.SetTestHooks(hooks)
		load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("mesh.ledger.#", log.handler(name, nil)) }},
			runtime.ModuleConfig{Group: "g", Partitions: 4, OrderKey: "body.key", Concurrency: 8, MaxAttempts: 5})
	}
	sent, stop := emitting(32, func(k, seq int) error {
		_, err := a.Emit(context.Background(), "test", "mesh.ledger.entry", body{Key: fmt.Sprintf("k%d", k), Seq: seq})
		return err
	})
	waitFor(t, 60*time.Second, func() bool { return log.count() >= 300 })
	conn, user := operator(t, url)
	if _, err := runtime.StartRepartition(emitCtx(t), conn, user, "g", "billing", 8); err != nil {
		t.Fatal(err)
	}
	<-atStart
	held := sent.Load()
	waitFor(t, 30*time.Second, func() bool { return sent.Load() >= held+200 }) // behind the start marker
	close(release)
	waitChanged(t, conn, 1, 8)
	after := int(sent.Load()) + 300 // handled on the new count
	waitFor(t, 60*time.Second, func() bool { return log.count() >= after })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() bool { return log.count() == int(sent.Load()) })
	log.check(t, 0, 0)
	if c := caught.Load(); c < 200 {
		t.Errorf("%d events handled from the catch-up queues, want the 200 and more emitted while the change was held", c)
	}
}

// TestAnIntakeThatCannotSendHoldsOnlyItsKey: the intake's sends on of one
// key's events fail (forced by a hook, as a broker's negative confirm or a
// lost channel would), again and again. A raw client's events without a
// slot, of key "held" and of another key, come through the intake: the
// other key's are all handled while "held"'s are tried again, none lost or
// skipped; once sends go, "held"'s are handled, once each, in order.
func TestAnIntakeThatCannotSendHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a := testNode(t, url, "a", nil)
	log := newOrderLog()
	const held, other = "held", "other"
	var failing atomic.Bool
	failing.Store(true)
	var failed atomic.Int64
	a.SetTestHooks(runtime.TestHooks{IntakeSend: func(key string) error {
		if key == held && failing.Load() {
			failed.Add(1)
			return errors.New("refused (forced)")
		}
		return nil
	}})
	ordered(t, a, log.handler("a", nil), 2)
	raw := rawConn(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const each = 10
	for seq := 1; seq <= each; seq++ {
		for _, key := range []string{held, other} {
			bd, _ := json.Marshal(body{Key: key, Seq: seq})
			publishForeign(t, raw, key, bd, "", nil)
		}
	}
	// The other key's all handled: the intake got past "held"'s first,
	// which it still tries to send on.
	waitFor(t, 60*time.Second, func() bool { log.mu.Lock(); defer log.mu.Unlock(); return log.next[other] == each })
	log.mu.Lock()
	if log.next[held] != 0 {
		t.Errorf("key %s handled up to %d while its partition refused everything", held, log.next[held])
	}
	log.mu.Unlock()
	waitFor(t, 30*time.Second, func() bool { return failed.Load() >= 3 }) // tried again and again
	log.mu.Lock()
	if log.next[held] != 0 {
		t.Errorf("key %s handled up to %d while its sends failed", held, log.next[held])
	}
	log.mu.Unlock()
	failing.Store(false)
	waitFor(t, 60*time.Second, func() bool { return log.count() == 2*each })
	log.check(t, 0, 0)
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.next[held] != each {
		t.Errorf("key %s handled up to %d, want %d", held, log.next[held], each)
	}
}

// operator is a connection of the test's broker user, as meshctl's, and
// its user name (for a marker's user-id).
func operator(t *testing.T, url string) (*amqp.Connection, string) {
	t.Helper()
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, uri.Username
}

// publishForeign publishes, confirmed on raw (in confirm mode), a foreign
// event of key with body bd through mesh.events, with headers extra
// beside the contract's and x-partition-key.
func publishForeign(t *testing.T, raw *amqp.Channel, key string, bd []byte, userID string, extra amqp.Table) {
	t.Helper()
	id := ulid.Make().String()
	h := amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "outside", wire.HeaderNode: "outside",
		wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano), wire.HeaderPartitionKey: key}
	for k, v := range extra {
		h[k] = v
	}
	conf, err := raw.PublishWithDeferredConfirmWithContext(emitCtx(t), wire.ExchangeEvents, "mesh.ledger.entry", true, false, amqp.Publishing{
		MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, UserId: userID, Body: bd, Headers: h})
	if err != nil || !conf.Wait() {
		t.Fatalf("foreign publish of %s: %v", key, err)
	}
}

// TestAnOrderedGroupResumesAfterItsConnectionIsCut: billing keeps order
// over 4 partitions on a node whose connections go through a proxy; the
// proxy cuts them mid-stream. The node resumes on new connections and
// consumes its partitions again: every key's events, those before the cut
// and after, are handled in order, none lost.
func TestAnOrderedGroupResumesAfterItsConnectionIsCut(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	a := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "a", func(c *runtime.Config) {
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	})
	resumed := make(chan struct{}, 1)
	a.SetTestHooks(runtime.TestHooks{Resumed: func() {
		select {
		case resumed <- struct{}{}:
		default:
		}
	}})
	log := newOrderLog()
	log.atLeastOnce = true // a member that loses its connection leaves what it handled unacknowledged
	ordered(t, a, log.handler("a", nil), 4)
	const keys, each = 16, 10
	emit := func(from, to int) {
		t.Helper()
		for seq := from; seq <= to; seq++ {
			for k := range keys {
				key := fmt.Sprintf("k%d", k)
				if _, err := a.Emit(emitCtx(t), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	emit(1, each/2)
	waitFor(t, 60*time.Second, func() bool { return log.count() == keys*each/2 })
	proxy.Cut()
	select {
	case <-resumed:
	case <-time.After(60 * time.Second):
		t.Fatal("the node did not resume after its connections were cut")
	}
	emit(each/2+1, each)
	waitFor(t, 60*time.Second, func() bool { return log.count() == keys*each })
	log.check(t, keys, each)
}

// TestAChangeSurvivesItsIntakeMembersLoss: node a, the group's intake
// member, makes a change of the count (4 -> 8) up to its end marker and
// loses its connections there (a proxy cuts them): the start and end
// markers return to the intake, b takes it over, does the change's steps
// again and ends it. Keys emitted from b throughout are each handled once,
// in order.
func TestAChangeSurvivesItsIntakeMembersLoss(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	fast := func(c *runtime.Config) {
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
		c.HeartbeatInterval = 200 * time.Millisecond
	}
	a := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "a", fast)
	b := testNode(t, url, "b", fast)
	atEnd, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.SetTestHooks(runtime.TestHooks{IntakeMarker: func(marker string) {
		if marker == wire.PartitionsEnd {
			once.Do(func() { close(atEnd); <-release })
		}
	}})
	log := newOrderLog()
	log.atLeastOnce = true                  // a member that loses its connection leaves what it handled unacknowledged
	ordered(t, a, log.handler("a", nil), 4) // first: the intake's active member
	ordered(t, b, log.handler("b", nil), 4)
	sent, stop := emitting(16, func(k, seq int) error {
		key := fmt.Sprintf("k%d", k)
		_, err := b.Emit(context.Background(), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key))
		return err
	})
	waitFor(t, 60*time.Second, func() bool { return log.count() >= 200 })
	conn, user := operator(t, url)
	if _, err := runtime.StartRepartition(emitCtx(t), conn, user, "g", "billing", 8); err != nil {
		t.Fatal(err)
	}
	select {
	case <-atEnd:
	case <-time.After(30 * time.Second):
		t.Fatal("a never reached the change's end marker")
	}
	proxy.Cut()
	close(release)
	waitChanged(t, conn, 1, 8)
	after := int(sent.Load()) + 200
	waitFor(t, 60*time.Second, func() bool { return log.count() >= after })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() bool { return log.count() >= int(sent.Load()) })
	log.check(t, 0, 0)
	if got := log.count(); got != int(sent.Load()) {
		t.Errorf("%d handlings of %d events", got, sent.Load())
	}
}

// emitting emits key k's next event (emit(k, seq)) for keys 0 to keys-1 in
// turns, from seq 1, until stop is called; sent counts those emitted, and
// stop returns the first emit error.
func emitting(keys int, emit func(k, seq int) error) (sent *atomic.Int64, stop func() error) {
	sent = new(atomic.Int64)
	done, emitted := make(chan struct{}), make(chan error, 1)
	go func() {
		for seq := 1; ; seq++ {
			for k := range keys {
				select {
				case <-done:
					emitted <- nil
					return
				default:
				}
				if err := emit(k, seq); err != nil {
					emitted <- err
					return
				}
				sent.Add(1)
			}
		}
	}()
	return sent, func() error { close(done); return <-emitted }
}

// waitChanged waits until group g's billing is at epoch with count
// partitions and no queue of the change is left.
func waitChanged(t *testing.T, conn *amqp.Connection, epoch, count int) {
	t.Helper()
	var seen runtime.GroupEpoch
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the change to %d partitions: the group last read as %+v", count, seen)
		}
	})
	waitFor(t, 60*time.Second, func() bool {
		e, err := runtime.ReadGroupEpoch(conn, "g", "billing", 0, 0)
		seen = e
		return err == nil && e.Number == epoch && e.Partitions == count && len(e.Pending) == 0
	})
}
