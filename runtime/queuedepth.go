package runtime

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// The depth of the modules' queues, for the metrics mesh.queue.depth and
// mesh.queue.consumers: a goroutine of the node asks the broker (a passive
// queue.declare, on a channel of its own on the consuming connection,
// which the broker does not block during an alarm) every heartbeat
// interval, and keeps what it answered in each module's counts; the
// metrics callback reads that and never waits for the broker. It runs only
// on a node with a MeterProvider: nobody would read what it learns.

// queueStat is a module's queue as the broker last described it.
type queueStat struct {
	messages  int64 // ready, not counting those delivered and unacknowledged
	consumers int64 // on every node
}

// defaultQueueLookEvery is how often a node without membership (no
// HeartbeatInterval) looks at its modules' queues.
const defaultQueueLookEvery = DefaultHeartbeatInterval

// queueLookEvery is how often the node looks at its modules' queues: every
// heartbeat interval.
func (n *Node) queueLookEvery() time.Duration {
	if n.cfg.HeartbeatInterval > 0 {
		return n.cfg.HeartbeatInterval
	}
	return defaultQueueLookEvery
}

// watchQueueDepths looks at the modules' queues every queueLookEvery until
// the node closes, then closes n.depthsDone.
func (n *Node) watchQueueDepths() {
	defer close(n.depthsDone)
	var look queueLook
	defer look.close()
	t := time.NewTicker(n.queueLookEvery())
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.life.Done():
			return
		}
		look.modules(n)
		if h := n.hook().lookedAt; h != nil {
			h()
		}
	}
}

// queueLook is the channel the node looks at queues on, and the session
// it is on; watchQueueDepths is its one user.
type queueLook struct {
	s  *session
	ch *amqp.Channel
}

// modules records the queue of every module of n attached on its current
// session (with its group's, for a member of a group), and forgets that of the others (not attached: its queue may not
// be declared yet; the node not connected: it cannot know).
func (l *queueLook) modules(n *Node) {
	s := n.session()
	mods, _ := n.loaded()
	for _, m := range mods {
		if s == nil || n.life.Err() != nil || m.attachedOn.Load() != s || !m.hasQueue() {
			m.counts.queue.Store(nil)
			continue
		}
		q, err := l.inspect(s, m.queue)
		if err != nil {
			m.counts.queue.Store(nil)
			m.log.Debug("could not read the depth of the module's queue", "queue", m.queue, "err", err)
			continue
		}
		stat := &queueStat{messages: int64(q.Messages), consumers: int64(q.Consumers)}
		if m.cfg.Partitions > 0 {
			// An ordered group's: its partitions and its intake, whose
			// consumers are each partition's active one.
			queues := []string{wire.GroupIntake(m.cfg.Group, m.def.Name)}
			e := m.currentEpoch()
			for i := range e.Count {
				queues = append(queues, wire.PartitionQueueOf(m.cfg.Group, m.def.Name, e.Number, i))
			}
			stat.consumers = 0
			for _, pq := range queues {
				g, err := l.inspect(s, pq)
				if err != nil {
					stat = nil
					m.log.Debug("could not read the depth of the module's group partition", "queue", pq, "err", err)
					break
				}
				stat.messages += int64(g.Messages)
				if pq != queues[0] {
					stat.consumers += int64(g.Consumers)
				}
			}
			m.counts.queue.Store(stat)
			continue
		}
		if m.groupQueue != "" {
			// A group's member: the events wait in the group's queue,
			// which every member consumes; its own holds its retries.
			g, err := l.inspect(s, m.groupQueue)
			if err != nil {
				m.counts.queue.Store(nil)
				m.log.Debug("could not read the depth of the module's group queue", "queue", m.groupQueue, "err", err)
				continue
			}
			stat.messages += int64(g.Messages)
			stat.consumers = int64(g.Consumers)
		}
		m.counts.queue.Store(stat)
	}
}

// inspect asks the broker for queue (a passive declare), on l's channel,
// opened again on s if it is another session's or closed (a passive
// declare of a queue that is gone closes it).
func (l *queueLook) inspect(s *session, queue string) (amqp.Queue, error) {
	if l.s != s || l.ch == nil || l.ch.IsClosed() {
		l.close()
		ch, err := s.subConn.Channel()
		if err != nil {
			return amqp.Queue{}, err
		}
		l.s, l.ch = s, ch
	}
	return l.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// close closes l's channel, if open.
func (l *queueLook) close() {
	if l.ch != nil {
		_ = l.ch.Close()
	}
	l.s, l.ch = nil, nil
}

// hasQueue says whether m has a queue of its own: once Setup returned,
// when it subscribed a pattern.
func (m *Module) hasQueue() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.running.Load() && len(m.subs) > 0
}
