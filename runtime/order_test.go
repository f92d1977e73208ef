package runtime_test

import (
	"context"
	"encoding/json"
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

// orderLog is what an ordered group's handlers saw: per key, the sequence
// numbers in the order their handling succeeded, and every breach of
// order (a handling of a key's event other than the next, or two of one
// key at once).
type orderLog struct {
	// atLeastOnce: an event of a key handled again (its ack lost with a
	// connection, or its channel) is counted in redelivered, not a
	// breach, and so is a key handled on two members at once while one
	// finishes what it started before it lost its connection; an event
	// handled before an earlier one of its key still is a breach.
	atLeastOnce bool
	redelivered int
	mu          sync.Mutex
	next        map[string]int // the sequence number each key expects next
	inFlight    map[string]int
	breaches    []string
	handled     int
	by          map[string]int // successes by node
}

func newOrderLog() *orderLog {
	return &orderLog{next: map[string]int{}, inFlight: map[string]int{}, by: map[string]int{}}
}

// body is an ordered event's body: its key and its place in the key's
// order (from 1).
type body struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// handler is node's handler: it checks order and calls fail, which may
// fail the handling (nil: it succeeds).
func (o *orderLog) handler(node string, fail func(b body, attempt int) error) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		var b body
		if err := json.Unmarshal(ev.Body, &b); err != nil {
			return sdk.Permanent(err)
		}
		if ev.Headers[wire.HeaderPartitionKey] != b.Key && b.Key != "" {
			o.breach("event %s of key %q arrived with key header %q", ev.ID, b.Key, ev.Headers[wire.HeaderPartitionKey])
		}
		o.mu.Lock()
		o.inFlight[b.Key]++
		if o.inFlight[b.Key] > 1 && !o.atLeastOnce {
			o.breaches = append(o.breaches, fmt.Sprintf("key %q: two events handled at once (seq %d on %s)", b.Key, b.Seq, node))
		}
		switch want := o.next[b.Key] + 1; {
		case b.Seq < want && o.atLeastOnce:
			o.redelivered++
		case b.Seq != want:
			o.breaches = append(o.breaches, fmt.Sprintf("key %q: seq %d handled on %s (attempt %d) when %d was next", b.Key, b.Seq, node, ev.Attempt, want))
		}
		o.mu.Unlock()
		var err error
		if fail != nil {
			err = fail(b, ev.Attempt)
		}
		o.mu.Lock()
		o.inFlight[b.Key]--
		if err == nil && b.Seq > o.next[b.Key] {
			o.next[b.Key] = b.Seq
			o.handled++
			o.by[node]++
		}
		o.mu.Unlock()
		return err
	})
}

func (o *orderLog) breach(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.breaches = append(o.breaches, fmt.Sprintf(format, args...))
}

// check fails t with every breach, and for each key k0 to k(keys-1) not
// handled up to each.
func (o *orderLog) check(t *testing.T, keys, each int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.breaches {
		t.Error(b)
	}
	for k := range keys {
		if got := o.next[fmt.Sprintf("k%d", k)]; got != each {
			t.Errorf("key k%d: handled up to %d, want %d", k, got, each)
		}
	}
}

func (o *orderLog) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handled
}

// ordered loads billing on n as a member of group g keeping order over
// partitions partitions.
func ordered(t *testing.T, n *runtime.Node, h sdk.Handler, partitions int) *runtime.Module {
	t.Helper()
	return load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("mesh.ledger.#", h) }},
		runtime.ModuleConfig{Group: "g", Partitions: partitions, Concurrency: 8, MaxAttempts: 5})
}

// TestAGroupKeepsEachKeysOrder: billing in group g on two nodes, keeping
// order over 4 partitions with 8 handler calls at once: 20 keys of 15
// events each, emitted key by key in turns from both nodes, and a foreign
// publisher's key (raw amqp091-go, x-partition-key and no slot: through
// the group's intake) and another's by the CloudEvents partitioning
// extension (cloudEvents:partitionkey), are each handled once, a key's events one at a time
// and in their order, while other keys run beside them (key k0's first
// event waits until another key's handling starts, which only parallel
// lanes allow). Key k3's third event fails twice: its later events wait
// for its third attempt. Every partition is on the wire as ADR 48 names
// it, a single active consumer queue with its active consumer.
func TestAGroupKeepsEachKeysOrder(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
	log := newOrderLog()
	other := make(chan struct{})
	var otherOnce sync.Once
	fail := func(bd body, attempt int) error {
		switch {
		case bd.Key == "k0" && bd.Seq == 1:
			select {
			case <-other:
			case <-time.After(20 * time.Second):
				return sdk.Permanent(fmt.Errorf("no other key's handling began while k0's first was in hand"))
			}
		case bd.Key != "k0":
			otherOnce.Do(func() { close(other) })
		}
		if bd.Key == "k3" && bd.Seq == 3 && attempt < 3 {
			return fmt.Errorf("attempt %d of k3's third fails", attempt)
		}
		return nil
	}
	ordered(t, a, log.handler("a", fail), 4)
	ordered(t, b, log.handler("b", fail), 4)

	raw := rawConn(t, url)
	for i := range 4 {
		q, err := raw.QueueDeclarePassive(wire.PartitionQueue("g", "billing", i), true, false, false, false, nil)
		if err != nil || q.Consumers != 1 { // a single active consumer queue counts its active one
			t.Fatalf("partition %d: %+v, %v; want a queue with its active consumer", i, q, err)
		}
	}
	const keys, each = 20, 15
	total := keys*each + 20
	for seq := 1; seq <= each; seq++ {
		for k := range keys {
			n := a
			if k%2 == 1 {
				n = b
			}
			key := fmt.Sprintf("k%d", k)
			if _, err := n.Emit(emitCtx(t), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// The foreign key by x-partition-key, another by the CloudEvents
	// partitioning extension's header (its key stamped in x-partition-key
	// by the intake, as the handler checks).
	for seq := 1; seq <= 10; seq++ {
		for key, header := range map[string]string{"foreign": wire.HeaderPartitionKey, "cloud": "cloudEvents:partitionkey"} {
			id := ulid.Make().String()
			b, _ := json.Marshal(body{Key: key, Seq: seq})
			conf, err := raw.PublishWithDeferredConfirmWithContext(emitCtx(t), wire.ExchangeEvents, "mesh.ledger.entry", true, false, amqp.Publishing{
				MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, Body: b,
				Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "outside", wire.HeaderNode: "outside",
					wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano), header: key}})
			if err != nil || !conf.Wait() {
				t.Fatalf("foreign publish %d of %s: %v", seq, key, err)
			}
		}
	}
	waitFor(t, 60*time.Second, func() bool { return log.count() == total })
	log.check(t, keys, each)
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.next["cloud"] != 10 {
		t.Errorf("the CloudEvents key: handled up to %d, want 10", log.next["cloud"])
	}
	if log.next["foreign"] != 10 {
		t.Errorf("the foreign key: handled up to %d, want 10", log.next["foreign"])
	}
}

// TestAnOrderedPartitionMovesWithoutReordering: billing keeps order over 2
// partitions on node a, which owns them (it consumed first), and on b,
// waiting. a stops while its handlers are mid-way: it lets each partition
// go once what it started has settled (drain, then close), and b takes
// the rest, what a held and had not started first. Every event is handled
// once, each key in order.
func TestAnOrderedPartitionMovesWithoutReordering(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
	log := newOrderLog()
	stopA := make(chan struct{})
	var stopOnce sync.Once
	slow := func(bd body, attempt int) error {
		if bd.Seq == 5 {
			stopOnce.Do(func() { close(stopA) }) // a has events in hand and more waiting
		}
		return nil
	}
	first := ordered(t, a, log.handler("a", slow), 2)
	ordered(t, b, log.handler("b", nil), 2)
	const keys, each = 6, 40
	go func() {
		<-stopA
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := first.Stop(ctx); err != nil {
			log.breach("stop a: %v", err)
		}
	}()
	for seq := 1; seq <= each; seq++ {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			if _, err := a.Emit(emitCtx(t), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 60*time.Second, func() bool { return log.count() == keys*each })
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, br := range log.breaches {
		t.Error(br)
	}
	if log.by["b"] == 0 {
		t.Errorf("handled by node: %v; b took nothing over", log.by)
	}
}

// activeOwners counts, per node, the partitions of group g's billing whose
// active consumer (single active consumer, as the broker says:
// rabbitmqctl list_consumers) is that node's; and how many partitions
// have one.
func activeOwners(t *testing.T, url string) (by map[string]int, owned int) {
	t.Helper()
	vhost := url[strings.LastIndex(url, "/")+1:]
	out, err := brokertest.CtlOutput("list_consumers", "-p", vhost, "queue_name", "consumer_tag", "active", "--formatter", "json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []struct {
		Queue  string `json:"queue_name"`
		Tag    string `json:"consumer_tag"`
		Active bool   `json:"active"`
	}
	if err := json.Unmarshal(out, &cs); err != nil {
		t.Fatalf("list_consumers: %v: %s", err, out)
	}
	by = map[string]int{}
	for _, c := range cs {
		if !c.Active || !strings.HasPrefix(c.Queue, "group.g.billing.p") {
			continue
		}
		node := strings.Split(c.Tag, ".")[1] // mesh.NODE.billing.pNNN
		by[node]++
		owned++
	}
	return by, owned
}

// balanced reports whether by spreads 16 partitions over nodes, max - min
// at most 1.
func balanced(by map[string]int, owned int, nodes ...string) bool {
	if owned != 16 || len(by) != len(nodes) {
		return false
	}
	lo, hi := owned, 0
	for _, n := range nodes {
		lo, hi = min(lo, by[n]), max(hi, by[n])
	}
	return hi-lo <= 1
}

// TestAGroupsPartitionsSpreadOverItsMembers: with three members and 16
// partitions, each member's consumer is the active one of 5 or 6 (read
// from the broker), whatever member consumed first; when one leaves, the
// two left share its partitions, 8 each, and its keys' order holds
// through every move.
func TestAGroupsPartitionsSpreadOverItsMembers(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	fast := func(c *runtime.Config) { c.HeartbeatInterval = 200 * time.Millisecond }
	nodes := map[string]*runtime.Node{}
	log := newOrderLog()
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = testNode(t, url, name, fast)
		ordered(t, nodes[name], log.handler(name, nil), 16)
	}
	// Keys enough to feed every partition: a member learns it owns one
	// only from its deliveries.
	var keys []string
	covered := map[int]bool{}
	for k := 0; len(covered) < 16; k++ {
		key := fmt.Sprintf("k%d", k)
		keys = append(keys, key)
		covered[wire.Slot(key)%16] = true
	}
	var stopping atomic.Bool
	emitted := make(chan int, 1)
	go func() {
		n := 0
		defer func() { emitted <- n }()
		for seq := 1; !stopping.Load(); seq++ {
			for _, key := range keys {
				if _, err := nodes["a"].Emit(context.Background(), "test", "mesh.ledger.entry", body{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
					log.breach("emit: %v", err)
					return
				}
				n++
			}
		}
	}()
	waitFor(t, 60*time.Second, func() bool { by, owned := activeOwners(t, url); return balanced(by, owned, "a", "b", "c") })
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := nodes["c"].Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() bool { by, owned := activeOwners(t, url); return balanced(by, owned, "a", "b") })
	stopping.Store(true)
	n := <-emitted
	waitFor(t, 60*time.Second, func() bool { return log.count() >= n })
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, br := range log.breaches {
		t.Error(br)
	}
	if log.handled != n {
		t.Errorf("%d handlings for %d events", log.handled, n)
	}
}

// TestAGroupKeysEventsByItsRule: billing keeps order over 4 partitions on
// two nodes by order_key body.key: events emitted with no key, or with
// another (sdk.WithKey("decoy")), are keyed by their body's field, every
// one through the group's intake; each key's events are handled once, in
// order, the handler seeing the rule's key in x-partition-key. An event
// whose body has no such field is dead-lettered as malformed, naming the
// rule.
func TestAGroupKeysEventsByItsRule(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
	log := newOrderLog()
	byRule := func(n *runtime.Node, node string) {
		load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("mesh.ledger.#", log.handler(node, nil)) }},
			runtime.ModuleConfig{Group: "g", Partitions: 4, OrderKey: "body.key", Concurrency: 8, MaxAttempts: 5})
	}
	byRule(a, "a")
	byRule(b, "b")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	const keys, each = 8, 10
	for seq := 1; seq <= each; seq++ {
		for k := range keys {
			var opts []sdk.EmitOption
			if k%2 == 1 {
				opts = append(opts, sdk.WithKey("decoy")) // the rule's key wins
			}
			if _, err := a.Emit(emitCtx(t), "test", "mesh.ledger.entry", body{Key: fmt.Sprintf("k%d", k), Seq: seq}, opts...); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := a.Emit(emitCtx(t), "test", "mesh.ledger.entry", map[string]int{"seq": 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() bool { return log.count() == keys*each })
	select {
	case d := <-dead:
		if d.Headers[wire.HeaderDeadReason] != wire.DeadReasonMalformed || !strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadError]), "order_key body.key: the body has no field key") {
			t.Errorf("the event with no key by the rule was dead-lettered with %v: %v, want malformed naming the rule", d.Headers[wire.HeaderDeadReason], d.Headers[wire.HeaderDeadError])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the event with no key by the rule was not dead-lettered")
	}
	log.check(t, keys, each)
}
