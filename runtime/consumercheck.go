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
// module runs, whether each of its consumers is still there, and consumes
// again a queue that reports no consumer on two checks in a row while the
// module's channel for it is open. RabbitMQ 3.10 can lose a quorum queue's
// consumer without a word to the channel: in the nemesis soak, a queue
// deleted and declared again while one of its member nodes was down got
// that node's stale member back when it restarted, the stale member won
// the next election, and the new queue's state (the consumer registered
// on it among the rest) was replaced by the old queue's; consume-ok had
// come, the channel stayed open, the queue reported no consumer and its
// messages waited. A rabbit_fifo cancel command does the same on purpose
// (TestLostConsumerIsConsumedAgain). Nothing else would notice: the
// module looks healthy and its queue fills.
//
// A count of zero with messages waiting is proof (the module's own queues
// have no other consumer, and a shared one with none has lost ours too);
// a count above zero on a shared queue (a tool served by other nodes, a
// consumed queue with other consumers) cannot tell ours apart and passes,
// and so does an empty queue (see checkConsumersOnce).
func (m *Module) checkConsumers(ctx context.Context) {
	interval := m.node.cfg.ConsumerCheckInterval
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var suspect map[consumerKey]bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		suspect = m.checkConsumersOnce(suspect)
	}
}

// checkConsumersOnce checks every consumer once and returns those that
// reported none (each acted on if it had at the check before, too).
func (m *Module) checkConsumersOnce(suspect map[consumerKey]bool) map[consumerKey]bool {
	s := m.node.session()
	if s == nil || s.isLost() || m.attachedOn.Load() != s {
		return nil // not attached now: the resume that attaches it makes new consumers
	}
	var keys []consumerKey
	m.mu.Lock()
	for _, c := range m.consumers {
		for _, q := range c.queues {
			keys = append(keys, consumerKey{c.ch, q})
		}
	}
	m.mu.Unlock()
	var check *amqp.Channel
	defer func() {
		if check != nil {
			_ = check.Close()
		}
	}()
	next := map[consumerKey]bool{}
	resumed := false
	for _, k := range keys {
		if k.ch.IsClosed() || !m.consumes(k) {
			continue
		}
		if check == nil || check.IsClosed() {
			var err error
			if check, err = s.subConn.Channel(); err != nil {
				return next // the session is going
			}
		}
		q, err := check.QueueDeclarePassive(k.queue, false, false, false, false, nil)
		if err != nil || q.Consumers > 0 || q.Messages == 0 {
			// Gone (its consumer's cancel says so), consumed, or nothing
			// waits: a quorum queue that cannot reach its leader answers 0
			// messages and 0 consumers, which proves nothing. A lost
			// consumer shows once messages wait for it.
			continue
		}
		if !suspect[k] {
			next[k] = true
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
		m.holdMu.Lock()
		qc := m.queueConsumers[k.queue]
		m.holdMu.Unlock()
		if qc != nil && qc.ch == k.ch {
			m.log.Error("a consumed queue lost its consumer; consuming it again", "queue", k.queue, "why", why)
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
