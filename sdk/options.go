package sdk

import (
	"fmt"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// EmitOption is a per-emit setting: WithSchema, WithTTL, WithPriority,
// AsFullType, WithFreshID. A nil EmitOption is ignored.
type EmitOption interface {
	isEmitOption()
}

// emitOption is every EmitOption; hosts apply it through
// wire.EmitOptionApplier.
type emitOption func(*wire.EmitOptions) error

func (emitOption) isEmitOption() {}

// ApplyEmit sets what the option says on o.
func (f emitOption) ApplyEmit(o *wire.EmitOptions) error { return f(o) }

// WithSchema records the version of the body's shape (x-schema): at most
// 128 bytes, without control characters, or the emit fails with
// ErrInvalid.
func WithSchema(version string) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if err := wire.CheckSchema(version); err != nil {
			return err
		}
		o.Schema = version
		return nil
	})
}

// WithTTL gives the event a time to live: a copy still waiting in a
// module's queue when ttl runs out is not handled; the broker sets it aside
// in the dead letters with the reason "expired".
func WithTTL(ttl time.Duration) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if ttl < time.Millisecond {
			return fmt.Errorf("%w: time to live %v is under 1ms", ErrInvalid, ttl)
		}
		o.TTL = ttl
		return nil
	})
}

// WithPriority sets the event's priority, 0 to 9. Only queues declared with
// a maximum priority (classic queues) honour it; quorum queues accept and
// ignore it.
func WithPriority(p uint8) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if p > 9 {
			return fmt.Errorf("%w: priority %d is over 9", ErrInvalid, p)
		}
		o.Priority, o.HasPriority = p, true
		return nil
	})
}

// AsFullType makes Emit take the name as a full event type
// ("mesh.delivery.deployed", "node.anchor.drained") instead of one under the
// module's own namespace. A module may emit under module.<its name>. and,
// under mesh. or node., only the types its node config grants it
// (emit_grants); anything else is refused with ErrForbidden.
func AsFullType() EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		o.FullType = true
		return nil
	})
}

// WithFreshID gives an event emitted inside a handler a new random id. By
// default such an event's id is derived from the handled event, so that a
// retried handler emitting the same thing again sends the same id and the
// consumers' de-duplication absorbs the copy. Ask for a fresh id when each
// attempt's emit is a distinct event (a "attempt failed" notice, say).
func WithFreshID() EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		o.FreshID = true
		return nil
	})
}
