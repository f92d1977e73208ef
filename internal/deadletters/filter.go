package deadletters

import (
	"fmt"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// Filter selects messages in a keeper queue. Every field set must match;
// the zero Filter matches every message.
type Filter struct {
	// Module is a module name. For a dead letter it is the module whose
	// queue gave up; for an unrouted event, the module that emitted it
	// (x-source).
	Module string
	// Node is a node name. For a dead letter it is the node of the queue
	// that gave up; for an unrouted event, the node that emitted it
	// (x-node).
	Node string
	// Type is an AMQP topic pattern the event type must match
	// ("module.billing.#").
	Type string
	// OlderThan, when positive, keeps messages whose Time is more than this
	// long ago.
	OlderThan time.Duration
	// NewerThan, when positive, keeps messages whose Time is less than this
	// long ago. A message whose Time is unknown matches neither age filter.
	NewerThan time.Duration
	// IDs, when not empty, keeps messages whose id (message id or
	// x-event-id) is one of these.
	IDs []string
	// Queue, when set, keeps the dead letters of that queue alone (the
	// queue that gave up on each): one event two modules dead-lettered
	// is two dead letters, and a console's group is one queue's. It
	// matches no unrouted event.
	Queue string
}

// Validate checks the filter; its errors wrap ErrBadFilter and name the
// field and the rule.
func (f Filter) Validate() error {
	if f.Module != "" {
		if err := wire.ValidateWord("module name", f.Module); err != nil {
			return fmt.Errorf("%w: Module: %w", ErrBadFilter, err)
		}
	}
	if f.Node != "" {
		if err := wire.ValidateWord("node name", f.Node); err != nil {
			return fmt.Errorf("%w: Node: %w", ErrBadFilter, err)
		}
	}
	if f.Type != "" {
		if err := wire.ValidateSubscription(f.Type); err != nil {
			return fmt.Errorf("%w: Type: %w", ErrBadFilter, err)
		}
	}
	if f.OlderThan < 0 {
		return fmt.Errorf("%w: OlderThan is %v, must not be negative", ErrBadFilter, f.OlderThan)
	}
	if f.NewerThan < 0 {
		return fmt.Errorf("%w: NewerThan is %v, must not be negative", ErrBadFilter, f.NewerThan)
	}
	if f.OlderThan > 0 && f.NewerThan > 0 && f.NewerThan <= f.OlderThan {
		return fmt.Errorf("%w: NewerThan (%v) must be longer than OlderThan (%v), or nothing can match", ErrBadFilter, f.NewerThan, f.OlderThan)
	}
	for i, id := range f.IDs {
		if id == "" {
			return fmt.Errorf("%w: IDs[%d] is empty", ErrBadFilter, i)
		}
	}
	return nil
}

// IsZero reports whether the filter selects every message.
func (f Filter) IsZero() bool {
	return f.Module == "" && f.Node == "" && f.Type == "" && f.OlderThan == 0 && f.NewerThan == 0 && len(f.IDs) == 0 && f.Queue == ""
}

// match reports whether m, read from the dead letters' queue when dead,
// passes the filter at now.
func (f Filter) match(m Message, dead bool, now time.Time) bool {
	if len(f.IDs) > 0 && !f.hasID(m) {
		return false
	}
	if f.Queue != "" && (!dead || m.Queue != f.Queue) {
		return false
	}
	if f.Module != "" && m.moduleFor(dead) != f.Module {
		return false
	}
	if f.Node != "" && m.nodeFor(dead) != f.Node {
		return false
	}
	if f.Type != "" && !wire.MatchPattern(f.Type, m.Type) {
		return false
	}
	if f.OlderThan > 0 || f.NewerThan > 0 {
		if m.Time.IsZero() {
			return false
		}
		age := now.Sub(m.Time)
		if f.OlderThan > 0 && age <= f.OlderThan {
			return false
		}
		if f.NewerThan > 0 && age >= f.NewerThan {
			return false
		}
	}
	return true
}

func (f Filter) hasID(m Message) bool {
	eventID := text(m.Headers[wire.HeaderEventID])
	for _, id := range f.IDs {
		if id == m.ID || id == eventID {
			return true
		}
	}
	return false
}
