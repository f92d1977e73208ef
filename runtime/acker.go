package runtime

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ackLinger is how long a worker with acknowledgements held waits for
// another delivery before it sends them (docs/adr/0023-coalesced-acks.md).
const ackLinger = time.Millisecond

// acker coalesces the acknowledgements of one consumer channel. RabbitMQ
// numbers a channel's deliveries 1, 2, 3...; an ack with multiple set
// acknowledges every delivery up to its tag still outstanding. So an ack
// is held, and when the acker flushes, the held acks that, with the
// deliveries already settled, form a run from the lowest unsettled tag go
// as one ack with multiple; held acks past a gap (a delivery still being
// handled, or waiting to be rejected for a retry) go one by one. A
// delivery settled any other way (a reject) is reported with settled
// after it was sent, so no multiple ack can cover it before.
type acker struct {
	ch amqp.Acknowledger
	// max is how many held acks make a flush at once (a quarter of the
	// prefetch: the broker sends no more than the prefetch unacked).
	max      int
	prefetch int
	// flow is what the workers on ch report (consumerFlow); set by the
	// consumer that makes the acker.
	flow *consumerFlow
	// records, if set, writes down the ids recorded as handled since its
	// last call (Module.writeRecords); a flush sends no ack before it
	// returned nil.
	records func() error

	mu   sync.Mutex
	seen uint64              // the highest tag delivered
	base uint64              // every tag up to base is settled on the wire
	held map[uint64]struct{} // acked by the module, not yet sent
	done map[uint64]struct{} // settled on the wire above base
}

func newAcker(ch amqp.Acknowledger, prefetch int) *acker {
	return &acker{ch: ch, max: max(1, prefetch/4), prefetch: prefetch, held: make(map[uint64]struct{}), done: make(map[uint64]struct{}), flow: &consumerFlow{}}
}

// delivered records that tag was delivered.
func (a *acker) delivered(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = max(a.seen, tag)
}

// lingers says whether acks are held, and whether a worker with acks
// held may wait for another delivery before it sends them: not when half
// the prefetch is unsettled on the wire, for then the broker may be
// waiting for acks before it sends more (a module process, or many
// workers, keep most of the prefetch in flight).
func (a *acker) lingers() (held, lingers bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.held) == 0 {
		return false, false
	}
	unsettled := int(a.seen-a.base) - len(a.done)
	return true, unsettled < a.prefetch/2
}

// ack holds the acknowledgement of tag, and flushes if max are held.
func (a *acker) ack(tag uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[tag] = struct{}{}
	if len(a.held) >= a.max {
		if err := a.flushLocked(false); !errors.Is(err, errRecordsUnwritten) {
			return err
		}
		// Held, not lost: the worker's next wait tries again
		// (flushThenWait).
	}
	return nil
}

// settled records that tag was settled on the wire by other means.
func (a *acker) settled(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if tag > a.base {
		a.done[tag] = struct{}{}
	}
}

// flush sends every held ack.
func (a *acker) flush() error { return a.flushOf(true) }

// flushOf is flush if all. Otherwise (the workers' own flushes), fewer
// than max acks held past a gap (a delivery still being handled) stay
// held when the run before the gap went: the next flush finds the gap
// closed, most often, and they go in its one multiple ack instead of one
// ack each. A worker that leaves acks held so flushes them all within
// ackLinger (flushThenWait).
func (a *acker) flushOf(all bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.flushLocked(all)
}

// errRecordsUnwritten says a flush sent no ack because the ids recorded
// as handled could not be written down: the acks stay held, for the next
// flush.
var errRecordsUnwritten = errors.New("the handled events' records could not be written; their acks wait")

// flushLocked is flush (all) or flushGrouped; the caller holds a.mu.
func (a *acker) flushLocked(all bool) error {
	if len(a.held) == 0 {
		return nil
	}
	if a.records != nil {
		// Every held ack's record was added before the ack was held:
		// written first, so that an event acknowledged is one whose
		// redelivery after a crash is recognised.
		if err := a.records(); err != nil {
			return fmt.Errorf("%w: %w", errRecordsUnwritten, err)
		}
	}
	// The run of settled or held tags from base+1.
	var top uint64 // the highest held tag in the run
	next := a.base + 1
	for {
		if _, ok := a.held[next]; ok {
			top = next
			delete(a.held, next)
		} else if _, ok := a.done[next]; ok {
			delete(a.done, next)
		} else {
			break
		}
		next++
	}
	a.base = next - 1
	var err error
	if top > 0 {
		err = a.ch.Ack(top, true)
	}
	if !all && top > 0 && len(a.held) < a.max {
		return err // past the gap: for the next flush (flushOf)
	}
	// Past the gap: one by one.
	for tag := range a.held {
		if e := a.ch.Ack(tag, false); e != nil && err == nil {
			err = e
		}
		delete(a.held, tag)
		a.done[tag] = struct{}{}
	}
	return err
}

// ack acknowledges d, which came from src: held by the acker of its
// channel if it has one (the module's event queue), at once otherwise.
// A delivery of an ordered partition's lane (src.lane) is held by its
// partition's acker too, and its lane goes on to its key's next event.
func (src source) ack(d amqp.Delivery) error {
	if src.lane != nil {
		err := src.acks.ack(d.DeliveryTag)
		src.lane.settled()
		return err
	}
	if src.acks != nil {
		return src.acks.ack(d.DeliveryTag)
	}
	return d.Ack(false)
}

// reject rejects d, requeued, and then tells its channel's acker. A
// delivery of an ordered partition's lane is not requeued (that would
// put it behind its key's later events): its lane tries it again.
func (src source) reject(d amqp.Delivery) error {
	if src.lane != nil {
		src.lane.retry(0)
		return nil
	}
	err := d.Reject(true)
	if src.acks != nil {
		src.acks.settled(d.DeliveryTag)
	}
	return err
}

// What a worker that found no delivery waiting does with the acks its
// channel holds (ackPlan).
const (
	ackNothingHeld = iota // nothing to send
	ackNow                // send them before waiting: the broker may be waiting for them
	ackAfterLinger        // wait up to ackLinger for a delivery first
)

// ackPlan says what a worker that found no delivery waiting does with the
// acks a holds. It lingers unless the acker says the broker may be
// waiting for them; and it lingers then too while a module process's
// outcomes, come back in a batch, are still to be taken by the workers
// they woke (ModuleConfig.outcomesDue): those are about to hold their
// acks, and the last of them sends them all, one write for the batch
// instead of one for each worker. A worker that lingers sends what is
// held after ackLinger at the latest, whatever the others do
// (docs/adr/0037-module-process-path-costs-cpu.md).
func (m *Module) ackPlan(a *acker) int {
	held, lingers := a.lingers()
	switch {
	case !held:
		return ackNothingHeld
	case lingers:
		return ackAfterLinger
	case m.cfg.outcomesDue != nil && m.cfg.outcomesDue.Load() > 0:
		return ackAfterLinger
	}
	return ackNow
}

// nextDelivery is a worker's wait for its next delivery: at once if one is
// waiting; otherwise, with acks held on its channel, it waits up to
// ackLinger for another before it sends them (unless the acker says the
// broker may be waiting for them), so that under load one ack with
// multiple settles many deliveries, and when the queue runs dry no ack
// waits longer than ackLinger.
func (m *Module) nextDelivery(deliveries <-chan amqp.Delivery, a *acker, linger *time.Timer) (amqp.Delivery, bool) {
	select {
	case d, ok := <-deliveries:
		return d, ok
	default:
	}
	switch m.ackPlan(a) {
	case ackNothingHeld:
		return m.flushThenWait(deliveries, a, linger) // the flush does nothing
	case ackNow:
		// Workers woken with this one hold their acks first, so that
		// one flush sends them all: one write to the broker, not one
		// each (issue 30).
		goruntime.Gosched()
		return m.flushThenWait(deliveries, a, linger)
	}
	linger.Reset(ackLinger)
	select {
	case d, ok := <-deliveries:
		linger.Stop() // Go 1.23 timers: no stale tick is received after Stop or Reset
		return d, ok
	case <-linger.C:
	}
	return m.flushThenWait(deliveries, a, linger)
}

// flushThenWait sends the acks a holds and waits for the next delivery.
// Its first flush is a worker's (flushOf): what that leaves held past a
// gap is sent, all of it, if no delivery comes within ackLinger. While
// the records of the handled events cannot be written (a full
// disk), the acks stay held and the flush is tried again with back-off,
// as long as no delivery comes: the broker may send none until it has
// them.
func (m *Module) flushThenWait(deliveries <-chan amqp.Delivery, a *acker, retry *time.Timer) (amqp.Delivery, bool) {
	all := false
	for attempt := 1; ; attempt++ {
		err := a.flushOf(all)
		if err == nil {
			if held, _ := a.lingers(); all || !held {
				d, ok := <-deliveries
				return d, ok
			}
			// Acks held past a gap (flushOf) go with the next flush,
			// or after ackLinger whatever happens.
			retry.Reset(ackLinger)
			select {
			case d, ok := <-deliveries:
				retry.Stop()
				return d, ok
			case <-retry.C:
			}
			all = true
			continue
		}
		if !errors.Is(err, errRecordsUnwritten) {
			m.log.Warn("ack failed; the events will be delivered again (and recognised as handled)", "err", err)
			d, ok := <-deliveries
			return d, ok
		}
		delay := expBackoff(100*time.Millisecond, 5*time.Second, attempt)
		m.log.Error("could not write down the handled events; their acks wait until they are written", "err", err, "attempt", attempt, "retry_in", delay)
		retry.Reset(delay)
		select {
		case d, ok := <-deliveries:
			retry.Stop()
			return d, ok
		case <-retry.C:
		}
	}
}
