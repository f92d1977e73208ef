package sdk

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// EmitOption is a per-emit setting: WithSchema, WithCausation, WithTTL,
// WithPriority.
type EmitOption func(*wire.EmitOptions) error

// WithSchema records the version of the body's shape (x-schema).
func WithSchema(version string) EmitOption {
	return func(o *wire.EmitOptions) error {
		if version == "" {
			return errors.New("schema version is empty")
		}
		o.Schema = version
		return nil
	}
}

// WithCausation sets the causation id explicitly, overriding the one taken
// from the handled event in the context.
func WithCausation(id string) EmitOption {
	return func(o *wire.EmitOptions) error {
		if id == "" {
			return errors.New("causation id is empty")
		}
		o.CausationID = id
		return nil
	}
}

// WithTTL gives the event a time to live: a copy still waiting in a
// module's queue when ttl runs out is not handled; the broker sets it aside
// in the dead letters with the reason "expired".
func WithTTL(ttl time.Duration) EmitOption {
	return func(o *wire.EmitOptions) error {
		if ttl < time.Millisecond {
			return fmt.Errorf("time to live %v is under 1ms", ttl)
		}
		o.TTL = ttl
		return nil
	}
}

// WithPriority sets the event's priority, 0 to 9. Only queues declared with
// a maximum priority (classic queues) honour it; quorum queues accept and
// ignore it.
func WithPriority(p uint8) EmitOption {
	return func(o *wire.EmitOptions) error {
		if p > 9 {
			return fmt.Errorf("priority %d is over 9", p)
		}
		o.Priority, o.HasPriority = p, true
		return nil
	}
}

// AsFullType makes Emit take the name as a full event type
// ("mesh.delivery.deployed", "node.anchor.drained") instead of one under the
// module's own namespace. A module may emit under module.<its name>. and,
// under mesh. or node., only the types its node config grants it; anything
// else is refused with ErrForbidden.
func AsFullType() EmitOption {
	return func(o *wire.EmitOptions) error {
		o.FullType = true
		return nil
	}
}

// ApplyEmitOptions folds opts into one set of settings. Implementations of
// Mesh call it; module authors do not need to.
func ApplyEmitOptions(opts ...EmitOption) (wire.EmitOptions, error) {
	var o wire.EmitOptions
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return o, fmt.Errorf("emit option: %w", err)
		}
	}
	return o, nil
}
