package runtime

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consumerKey is one consumer of the module: the channel it was made on
// and the queue it consumes.
type consumerKey struct {
	ch    *amqp.Channel
	queue string
}

// checkConsumers asks the broker, every ConsumerCheckInterval while the
// module runs, whether each of its consumers is still there and still fed,
// and consumes again a queue whose consumer is lost or stalled on two
// checks in a row while the module's channel for it is open.
//
// Lost: the queue reports no consumer. RabbitMQ 3.10 can lose a quorum
// queue's consumer without a word to the channel: in the nemesis soak, a
// queue deleted and declared again while one of its member nodes was down
// got that node's stale member back when it restarted, the stale member won
// the next election, and the new queue's state (the consumer registered on
// it among the rest) was replaced by the old queue's; consume-ok had come,
// the channel stayed open, the queue reported no consumer and its messages
// waited. A rabbit_fifo cancel command does the same on purpose
// (TestLostConsumerIsConsumedAgain).
//
// Stalled: the queue reports messages ready and a consumer, but no
// delivery reached the consumer's workers from one check to the next while
// some of them waited for one. RabbitMQ 3.10 can check a quorum queue's
// messages out to a consumer and never deliver them to its channel (after
// leader changes, the soak found a consumed queue showing its whole
// prefetch unacknowledged while the channel held none): the consumer's
// credit is spent on deliveries it never gets, and the queue waits for
// acks that cannot come. Closing the channel returns them.
// (TestStalledConsumerIsConsumedAgain forces it with a hook that drops a
// prefetch of deliveries unseen.) Only the module's queue and its consumed
// queues report their flow; the channels serving its tools and taking its
// dead letters are checked for a lost consumer alone.
//
// Nothing else would notice either: the module looks healthy and its
// queue fills. A count of zero consumers with messages waiting is proof
// (the module's own queues have no other consumer, and a shared one with
// none has lost ours too); a count above zero on a shared queue cannot
// tell ours apart, so only our own flow says it stalled; an empty queue
// passes (see checkConsumersOnce).
func (m *Module) checkConsumers(ctx context.Context) {
	interval := m.node.cfg.ConsumerCheckInterval
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var suspect map[consumerKey]suspicion
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		suspect = m.checkConsumersOnce(suspect)
		m.checkMigration()
		if h := m.node.hook().checked; h != nil {
			h(m.def.Name)
		}
	}
}

// suspicion is what one check found wrong with a consumer: no consumer on
// the broker (lost), or none of its deliveries arriving (stalled), with
// how many had arrived by then.
type suspicion struct {
	lost     bool
	received uint64
	acted    bool // consumed again: its channel closes soon, not checked until then
}

// checkConsumersOnce checks every consumer once and returns those found
// lost or stalled (each acted on if it was found so at the check before).
func (m *Module) checkConsumersOnce(suspect map[consumerKey]suspicion) map[consumerKey]suspicion {
	s := m.node.session()
	if s == nil || s.isLost() || m.attachedOn.Load() != s {
		return nil // not attached now: the resume that attaches it makes new consumers
	}
	type consumer struct {
		consumerKey
		flow *consumerFlow
	}
	var cs []consumer
	m.mu.Lock()
	for _, c := range m.consumers {
		if c.ordered {
			continue // a waiting single active consumer is fed nothing, rightly
		}
		for _, q := range c.queues {
			cs = append(cs, consumer{consumerKey{c.ch, q}, c.flow})
		}
	}
	m.mu.Unlock()
	var check *amqp.Channel
	defer func() {
		if check != nil {
			_ = check.Close()
		}
	}()
	next := map[consumerKey]suspicion{}
	resumed := false
	for _, c := range cs {
		k := c.consumerKey
		if k.ch.IsClosed() || !m.consumes(k) {
			continue
		}
		if m.def.History != nil && k.queue == m.node.cfg.History.Stream {
			// A stream's passive declare counts no consumer of it, even
			// with one reading (RabbitMQ 3.10, measured): it would look
			// lost at every check. The history's reader has no stall of
			// its own to fear: it acknowledges a batch at a time.
			continue
		}
		if before := suspect[k]; before.acted {
			next[k] = before
			continue
		}
		if check == nil || check.IsClosed() {
			var err error
			if check, err = s.subConn.Channel(); err != nil {
				return next // the session is going
			}
		}
		q, err := check.QueueDeclarePassive(k.queue, false, false, false, false, nil)
		if err != nil || q.Messages == 0 {
			// Gone (its consumer's cancel says so) or nothing waits: a
			// quorum queue that cannot reach its leader answers 0 messages
			// and 0 consumers, which proves nothing. A lost or stalled
			// consumer shows once messages wait for it.
			continue
		}
		now := suspicion{lost: q.Consumers == 0, received: c.flow.received.Load()}
		if !now.lost && !c.flow.idle() {
			continue // every worker is handling a delivery: fed
		}
		before, seen := suspect[k]
		if !seen || before.lost != now.lost || !now.lost && before.received != now.received {
			next[k] = now
			continue
		}
		m.mu.Lock()
		stopped := m.stopped
		m.mu.Unlock()
		if stopped {
			return nil
		}
		m.node.stats.consumersLost.Add(1)
		why := fmt.Sprintf("the broker reports no consumer on queue %s on two checks %v apart, while the module's channel for it is open (the broker dropped the consumer without telling it)", k.queue, m.node.cfg.ConsumerCheckInterval)
		if !now.lost {
			why = fmt.Sprintf("the broker reports %d messages ready on queue %s and a consumer, but none reached the module's consumer for %v while its workers waited (the broker holds deliveries its channel never got)", q.Messages, k.queue, m.node.cfg.ConsumerCheckInterval)
		}
		m.holdMu.Lock()
		qc := m.queueConsumers[k.queue]
		m.holdMu.Unlock()
		next[k] = suspicion{acted: true}
		if qc != nil && qc.ch == k.ch {
			m.log.Error("a consumed queue's consumer is lost or stalled; consuming it again", "queue", k.queue, "why", why)
			m.queueDown(k.queue, why)
			m.reconsumeLater(s, qc.entry, k.ch, 1)
			continue
		}
		if !resumed {
			m.resumeLater(s, k.ch, why, nil) // every channel of the module attached again: once a round
			resumed = true
		}
	}
	return next
}

// consumes reports whether the module means to consume k now: a consumed
// queue that is held, or that a newer channel consumes, is not checked.
func (m *Module) consumes(k consumerKey) bool {
	if !m.setup.Consumes(k.queue) {
		return true
	}
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	qc := m.queueConsumers[k.queue]
	return qc != nil && qc.ch == k.ch && qc.consuming
}
