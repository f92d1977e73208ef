package runtime

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A queue is moved to settings only arguments carry (its type, its
// priorities) by meshctl queue migrate (internal/queuemove), which moves
// its messages out to a temporary queue, declares it anew and moves them
// back. While the temporary queue exists, the module that consumes the
// queue must not: the queue is deleted and declared again under it. The
// temporary queue is the sign: a module whose queue has one does not
// attach (it is tried again with the usual back-off), and a module
// attached when one appears lets its queue go at its next consumer check
// (Config.ConsumerCheckInterval), its deliveries in flight returned to
// the queue, so that the migration may move them.

// MigrationQueue is the temporary queue of a migration of queue, which
// holds its messages meanwhile.
func MigrationQueue(queue string) string { return queue + ".migrating" }

// errMigrating is why a module does not attach while its queue migrates.
var errMigrating = errors.New("its queue is being moved to new settings (meshctl queue migrate); the module consumes it again once the move is done")

// migrating is errMigrating if queue's migration queue exists, checked on
// a channel of its own on s.
func (n *Node) migrating(s *session, queue string) error {
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(MigrationQueue(queue), true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return fmt.Errorf("queue %s: %w", queue, errMigrating)
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return nil
	default:
		return fmt.Errorf("check for a migration of queue %s: %w", queue, err)
	}
}

// checkMigration lets the module's queue go if a migration of it began:
// resume closes its channels (what they held goes back to the queue) and
// attaches it again, which waits for the migration's end.
func (m *Module) checkMigration() {
	s := m.node.session()
	if s == nil || s.isLost() || m.attachedOn.Load() != s || len(m.subs) == 0 { // subs are fixed since start
		return
	}
	// attachedOn is cleared first, so that later checks during the
	// migration start no other resume: the one started here tries again
	// with its back-off until the migration ends.
	if err := m.node.migrating(s, m.queue); errors.Is(err, errMigrating) && m.attachedOn.CompareAndSwap(s, nil) {
		m.log.Warn("the module stops consuming while its queue migrates", "queue", m.queue)
		go m.resume(s, true)
	}
}
