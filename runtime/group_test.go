package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// handling is one handler call of a group's member: on which node, of
// which event, at which attempt.
type handling struct {
	node, id string
	attempt  int
}

// handlings records the handler calls of a group's members.
type handlings struct {
	mu   sync.Mutex
	all  []handling
	done map[string]int // successes by event id
}

func (h *handlings) add(c handling, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, c)
	if h.done == nil {
		h.done = map[string]int{}
	}
	if ok {
		h.done[c.id]++
	}
}

func (h *handlings) succeeded() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.done)
}

// member is the module billing as a member of group g on node, handling
// with fail (nil: every call succeeds) and recording into h.
func member(t *testing.T, n *runtime.Node, node string, h *handlings, mc runtime.ModuleConfig, fail func(sdk.Event) error) *runtime.Module {
	t.Helper()
	mc.Group = "g"
	return load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.invoice.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var err error
			if fail != nil {
				err = fail(ev)
			}
			h.add(handling{node: node, id: ev.ID, attempt: ev.Attempt}, err == nil)
			return err
		}))
	}}, mc)
}

// TestAGroupSharesItsEvents: the copies of a module on two nodes in one
// group compete for its events: each event is handled once by the group,
// and both members handle some. The group's queue is on the wire as
// ADR 48 names it, consumed by both; the nodes' own queues are bound to
// nothing (else each node would handle every event as well).
func TestAGroupSharesItsEvents(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
	h := &handlings{}
	bHandled := make(chan struct{})
	var bOnce sync.Once
	// a holds its first event until b has handled one: with a prefetch
	// of 1 the group's queue must then give b the next.
	var aFirst sync.Once
	member(t, a, "a", h, runtime.ModuleConfig{Prefetch: 1}, func(sdk.Event) error {
		var err error
		aFirst.Do(func() {
			select {
			case <-bHandled:
			case <-time.After(15 * time.Second):
				err = errors.New("b never handled an event of the group")
			}
		})
		return err
	})
	member(t, b, "b", h, runtime.ModuleConfig{Prefetch: 1}, func(sdk.Event) error {
		bOnce.Do(func() { close(bHandled) })
		return nil
	})
	raw := rawConn(t, url)
	q, err := raw.QueueDeclarePassive(wire.GroupQueue("g", "billing"), true, false, false, false, nil)
	if err != nil || q.Consumers != 2 {
		t.Fatalf("group queue %s: %+v, %v; want it consumed by both members", wire.GroupQueue("g", "billing"), q, err)
	}
	const events = 60
	for i := range events {
		if _, err := a.Emit(emitCtx(t), "test", "mesh.invoice.due", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, func() bool { return h.succeeded() == events })
	h.mu.Lock()
	defer h.mu.Unlock()
	by := map[string]int{}
	for _, c := range h.all {
		by[c.node]++
	}
	for id, n := range h.done {
		if n != 1 {
			t.Errorf("event %s handled %d times by the group, want once", id, n)
		}
	}
	if by["a"] == 0 || by["b"] == 0 {
		t.Errorf("handlings by node: %v; want both members to share the events", by)
	}
	for _, node := range []string{"a", "b"} {
		if n := queueDepth(t, raw, wire.ModuleQueue(node, "billing")); n != 0 {
			t.Errorf("%s holds %d events: a member's own queue must be bound to nothing", wire.ModuleQueue(node, "billing"), n)
		}
	}
}

// TestAGroupMembersRetriesStayWithIt: a member that fails an event retries
// it itself when the retry is a copy (a classic queue's, through the
// node's own queue, whose copies only the node trusts): the second
// attempt is on the node that made the first, and counted as the second.
// On a quorum queue a failed attempt goes back to the group's queue, which
// counts it, so any member may make the next, counted as well.
func TestAGroupMembersRetriesStayWithIt(t *testing.T) {
	t.Parallel()
	for _, qt := range []string{runtime.QueueClassic, runtime.QueueQuorum} {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			url := brokertest.VHost(t)
			a, b := testNode(t, url, "a", nil), testNode(t, url, "b", nil)
			h := &handlings{}
			failFirst := func(ev sdk.Event) error {
				if ev.Attempt == 1 {
					return fmt.Errorf("attempt %d fails", ev.Attempt)
				}
				return nil
			}
			mc := runtime.ModuleConfig{QueueType: qt, Prefetch: 4, MaxAttempts: 3}
			member(t, a, "a", h, mc, failFirst)
			member(t, b, "b", h, mc, failFirst)
			const events = 40
			for i := range events {
				if _, err := b.Emit(emitCtx(t), "test", "mesh.invoice.due", map[string]int{"i": i}); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 30*time.Second, func() bool { return h.succeeded() == events })
			h.mu.Lock()
			defer h.mu.Unlock()
			first := map[string]string{}
			for _, c := range h.all {
				switch c.attempt {
				case 1:
					first[c.id] = c.node
				case 2:
					if qt == runtime.QueueClassic && first[c.id] != c.node {
						t.Errorf("event %s: attempt 1 on %q, attempt 2 on %s; a copy stays with its node", c.id, first[c.id], c.node)
					}
					if first[c.id] == "" {
						t.Errorf("event %s: attempt 2 on %s before any attempt 1", c.id, c.node)
					}
				default:
					t.Errorf("event %s: attempt %d on %s; every event succeeds at its second", c.id, c.attempt, c.node)
				}
			}
			if len(h.all) != 2*events {
				t.Errorf("%d handler calls for %d events failing once each, want %d", len(h.all), events, 2*events)
			}
		})
	}
}

// TestJoiningAndLeavingAGroupLosesNothing: the events a module's own queue
// holds when it joins a group are still handled (its own queue is
// consumed, no longer bound); while the member is stopped the group's
// queue keeps what comes, not the node's; a module that leaves the group
// gets its own queue bound again, and the group's queue stays bound and
// keeps what comes for the group's other members. Read on the wire with raw amqp091-go.
func TestJoiningAndLeavingAGroupLosesNothing(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "a", nil)
	raw := rawConn(t, url)
	own, group := wire.ModuleQueue("a", "billing"), wire.GroupQueue("g", "billing")
	h := &handlings{}
	emit := func(k int) {
		t.Helper()
		for i := range k {
			if _, err := n.Emit(emitCtx(t), "test", "mesh.invoice.due", map[string]int{"i": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	alone := func() *runtime.Module {
		return load(t, n, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
			return m.On("mesh.invoice.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				h.add(handling{node: "a", id: ev.ID, attempt: ev.Attempt}, true)
				return nil
			}))
		}}, runtime.ModuleConfig{})
	}
	m := alone()
	stop(t, m)
	emit(5) // wait in the node's own queue
	if d := queueDepth(t, raw, own); d != 5 {
		t.Fatalf("%s holds %d, want the 5 emitted while the module was stopped", own, d)
	}
	m = member(t, n, "a", h, runtime.ModuleConfig{}, nil)
	waitFor(t, 20*time.Second, func() bool { return h.succeeded() == 5 })
	emit(5)
	waitFor(t, 20*time.Second, func() bool { return h.succeeded() == 10 })
	stop(t, m)
	emit(3)
	if d, g := queueDepth(t, raw, own), queueDepth(t, raw, group); d != 0 || g != 3 {
		t.Fatalf("with the member stopped: %s holds %d, %s %d; want 0 and the 3 emitted", own, d, group, g)
	}
	m = alone() // leaves the group
	emit(2)
	waitFor(t, 20*time.Second, func() bool { return h.succeeded() == 12 })
	// A member that leaves does not unbind the group's queue: the binding
	// is the group's, which other members may still consume.
	if g := queueDepth(t, raw, group); g != 5 {
		t.Errorf("%s holds %d after its member left, want the 3 it kept and the 2 since, for the group", group, g)
	}
}

// TestAGroupsDeadLetterGoesBackToTheGroup: an event a member gives up on is
// dead-lettered naming the group's queue (read on the wire), and a replay
// of it goes back to the group's queue, where a member handles it.
func TestAGroupsDeadLetterGoesBackToTheGroup(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "a", nil)
	h := &handlings{}
	var replayed atomic.Bool
	member(t, n, "a", h, runtime.ModuleConfig{}, func(ev sdk.Event) error {
		if replayed.Load() {
			return nil
		}
		return fmt.Errorf("%w: not yet", sdk.ErrPermanent)
	})
	raw := rawConn(t, url)
	id, err := n.Emit(emitCtx(t), "test", "mesh.invoice.due", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return queueDepth(t, raw, wire.QueueDead) == 1 })
	d, ok, err := raw.Get(wire.QueueDead, false)
	if err != nil || !ok {
		t.Fatalf("get the dead letter: %v, %v", ok, err)
	}
	if d.MessageId != id || d.Headers[wire.HeaderDeadQueue] != wire.GroupQueue("g", "billing") {
		t.Fatalf("dead letter %s from %v, want %s from %s", d.MessageId, d.Headers[wire.HeaderDeadQueue], id, wire.GroupQueue("g", "billing"))
	}
	if err := d.Nack(false, true); err != nil { // back, for the replay
		t.Fatal(err)
	}
	replayed.Store(true)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := deadletters.Replay(emitCtx(t), conn, wire.QueueDead, deadletters.Filter{IDs: []string{id}})
	if err != nil || res.Done != 1 || res.Queues[wire.GroupQueue("g", "billing")] != 1 {
		t.Fatalf("replay: %+v, %v; want the one dead letter back to the group's queue", res, err)
	}
	waitFor(t, 10*time.Second, func() bool { return h.succeeded() == 1 })
}
