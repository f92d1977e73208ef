//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// TestRefusedSpooledEvents: a stream of emits goes through an outage, so
// it is spooled; among its events are some the broker will refuse (their
// only queue is full, reject-publish) and, once the alternate exchange has
// lost mesh.unrouted, some it will return. The spool does not wedge: the
// refused ones reach mesh.dead-letters (reason refused) after emit_timeout,
// the returned ones mesh.unrouted, every other one its handler. Each
// emitted id is in one of the three places: lost 0.
func TestRefusedSpooledEvents(t *testing.T) {
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	const emitTimeout = 5 * time.Second
	n := newNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "spooler", func(c *runtime.Config) {
		c.EmitTimeout = emitTimeout
	})
	ch := brokertest.Channel(t, url)
	if _, err := ch.QueueDeclare("full", false, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-max-length": int64(1), "x-overflow": "reject-publish",
	}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("full", "module.sink.full", wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", "full", false, false, amqp.Publishing{Body: []byte("filler")}); err != nil {
		t.Fatal(err)
	}

	handled := newIDSet()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := n.Load(ctx, sinkModule(handled), runtime.ModuleConfig{Prefetch: 64, Concurrency: 4, MaxAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	s := startStream(t, m.Mesh(), 4)
	refused, unroutable := newIDSet(), newIDSet()
	emit := func(typ string, into *idSet, i int) {
		id, err := m.Mesh().Emit(ctx, typ, map[string]int{"i": i})
		if err != nil {
			t.Fatalf("emit %s: %v", typ, err)
		}
		into.add(id)
		s.confirmed.add(id)
	}
	if !waitFor(30*time.Second, func() bool { return handled.len() >= 200 }) {
		t.Fatalf("only %d events handled before the outage", handled.len())
	}
	proxy.Down()
	if !waitFor(30*time.Second, func() bool { return !n.Connected() }) {
		t.Fatal("the node never noticed the outage")
	}
	for i := range 3 {
		emit("full", refused, i) // spooled among the stream's ticks
	}
	proxy.Up()
	// The first refused event holds the spool: what is emitted now waits
	// behind it, and is resent only after mesh.unrouted lost its binding.
	if !waitFor(30*time.Second, func() bool { return n.Stats().Refused > 0 }) {
		t.Fatal("the broker never refused a spooled event")
	}
	if err := ch.QueueUnbind(wire.QueueUnrouted, "", wire.ExchangeUnrouted, nil); err != nil {
		t.Fatal(err)
	}
	// Emitted within emit_timeout of the first refusal, these are
	// spooled behind it and returned on their resend. On a machine so
	// slow that the spool emptied first, an emit goes direct, is returned
	// and fails with ErrRefused: the emitter is told, nothing is lost,
	// and the test counts it apart.
	var toldEmitter int
	for i := range 3 {
		id, err := m.Mesh().Emit(ctx, "nowhere", map[string]int{"i": i})
		switch {
		case errors.Is(err, wire.ErrRefused):
			toldEmitter++
		case err != nil:
			t.Fatalf("emit nowhere: %v", err)
		default:
			unroutable.add(id)
			s.confirmed.add(id)
		}
	}
	if !waitFor(2*time.Minute, func() bool {
		st := n.Stats()
		return st.SpoolDeadLettered >= 3 && int(st.SpoolUnrouted) >= unroutable.len()
	}) {
		t.Fatalf("the spool wedged: %+v", n.Stats())
	}
	s.end()
	ticks := s.confirmed.len() - refused.len() - unroutable.len()
	if !waitFor(2*time.Minute, func() bool { return n.Stats().SpoolEvents == 0 && handled.len() >= ticks }) {
		t.Errorf("handled %d of %d ticks; stats %+v", handled.len(), ticks, n.Stats())
	}

	dead := drainIDs(t, ch, wire.QueueDead, func(d amqp.Delivery) bool { return d.Headers[wire.HeaderDeadReason] == wire.DeadReasonRefused })
	kept := drainIDs(t, ch, wire.QueueUnrouted, func(d amqp.Delivery) bool { return d.Headers[wire.HeaderRoutingKey] == "module.sink.nowhere" })
	if refused.missingFrom(dead) != 0 || dead.len() != refused.len() {
		t.Errorf("dead letters: %d of the %d refused events, %d in all", refused.len()-refused.missingFrom(dead), refused.len(), dead.len())
	}
	if unroutable.missingFrom(kept) != 0 || kept.len() != unroutable.len() {
		t.Errorf("mesh.unrouted: %d of the %d returned events, %d in all", unroutable.len()-unroutable.missingFrom(kept), unroutable.len(), kept.len())
	}
	accounted := newIDSet()
	for _, set := range []*idSet{handled, dead, kept} {
		for id := range set.ids {
			accounted.add(id)
		}
	}
	st := n.Stats()
	if handled.overOnce() > 0 {
		t.Errorf("%d events reached the handler more than once", handled.overOnce())
	}
	summary{
		emitted: int(s.attempts.Load()) + 6, confirmed: s.confirmed.len(), handled: handled.len(),
		duplicates: int(st.Duplicates), deadLettered: dead.len(), lost: s.confirmed.missingFrom(accounted),
		extra: fmt.Sprintf("spooled=%d resent=%d refused_confirms=%d spool_dead_lettered=%d kept_in_mesh.unrouted=%d returned_to_the_emitter=%d",
			st.Spooled, st.Resent, st.Refused, st.SpoolDeadLettered, st.SpoolUnrouted, toldEmitter),
	}.report(t)
}

// drainIDs takes every message of queue and returns the ids of those keep
// accepts.
func drainIDs(t *testing.T, ch *amqp.Channel, queue string, keep func(amqp.Delivery) bool) *idSet {
	t.Helper()
	ids := newIDSet()
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return ids
		}
		if keep(d) {
			ids.add(d.MessageId)
		}
	}
}
