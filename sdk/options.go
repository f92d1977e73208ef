package sdk

import (
	"fmt"
	"time"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
)

// EmitOption is a per-emit setting: WithSchema, WithKey, WithTTL,
// WithPriority, AsFullType, WithFreshID, After, At, AtMostOnce. A nil EmitOption is
// ignored.
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

// WithKey gives the event a key: a module group that keeps order by key
// (partitions: in its config) handles the events of one key one at a
// time, in the order the broker received them, and those of other keys in
// parallel. At most 256 bytes of UTF-8 without control characters, or
// the emit fails with ErrInvalid. An event without a key has the empty
// key, which orders every such event after the other.
func WithKey(key string) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if err := wire.CheckKey(key); err != nil {
			return err
		}
		o.Key, o.HasKey = key, true
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

// After delays the event by d: Emit returns once the broker holds it,
// durably, and it reaches the mesh d later, rounded up to the second (a
// delayed event is never early; it is late by a few milliseconds per power
// of two in d, and by the time the node takes to publish it). It keeps
// its id, type, source, headers and body, and gains the header x-due (when
// it was due, RFC 3339) that a handler sees in Event.Headers.
//
// A delayed event goes to the queues bound to its type when it comes due,
// not to those bound when it was emitted: it is an emit at a later time.
// A module loaded in between gets it; one unloaded in between does not.
//
// d ≤ 0 is a plain emit. A delay past 2^28−1 seconds (about 8.5 years)
// is refused with ErrInvalid, naming the bound; so are After with At and
// with AtMostOnce. The node emitting it needs delays on (its config's
// delays, on by default under meshd); a delayed emit on a node without
// them fails with ErrInvalid. Until it is due, the emitting node lists it
// and can cancel it by its id (meshctl delayed ls|cancel --via NODE).
func After(d time.Duration) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: delay %v is negative", ErrInvalid, d)
		}
		o.After = d
		return nil
	})
}

// At delays the event until t: After(time.Until(t)) as the emitting host
// reads its clock (meshtest's fake clock in tests). A t already passed is
// a plain emit.
func At(t time.Time) EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		if t.IsZero() {
			return fmt.Errorf("%w: At needs a time (it is zero)", ErrInvalid)
		}
		o.At = t
		return nil
	})
}

// AtMostOnce emits the event at most once, for what is worth less than its
// cost (telemetry, progress): not persistent, without waiting for the
// broker's confirm, never spooled. Emit returns once the event is handed
// to the connection; its id is the event's. It is lost if the connection
// drops before the broker routed it, if the broker restarts before a
// consumer takes it (classic queues), and while the broker is unreachable
// or blocks publishing (Emit then fails with ErrTransient at once, as it
// does when the node's connection is down); a quorum queue still writes
// it to disk. Every other emit is at least once: confirmed, persistent,
// spooled while the broker is away.
func AtMostOnce() EmitOption {
	return emitOption(func(o *wire.EmitOptions) error {
		o.AtMostOnce = true
		return nil
	})
}

func init() {
	wire.OutboxOption = func(ref causation.OutboxRef) any {
		return emitOption(func(o *wire.EmitOptions) error {
			o.Outbox = &ref
			return nil
		})
	}
}

// HandlerOption is a per-handler setting, given to On, Consume or Serve:
// AllowDuplicates, Filter. It is the host's, not a wrapper of the handler,
// so middleware around a handler keeps it. An option that does not apply
// where it is given is refused with ErrInvalid. A nil HandlerOption is
// ignored.
type HandlerOption interface {
	isHandlerOption()
}

// handlerOption is every HandlerOption; hosts apply it through
// wire.HandlerOptionApplier.
type handlerOption func(*wire.HandlerOptions) error

func (handlerOption) isHandlerOption() {}

// ApplyHandler sets what the option says on o.
func (f handlerOption) ApplyHandler(o *wire.HandlerOptions) error { return f(o) }

// AllowDuplicates says the handler is idempotent by itself. For On, the
// node then hands it every delivery, including one whose event id the
// module already handled: by default the node remembers the ids a module
// handled (for a retention window) and acknowledges a redelivery or a
// resend of the same event without running the handler again. For Serve,
// the tool runs again for a repeated request (a retried handler's call)
// instead of being answered from the stored answer. Consume refuses it:
// its messages are never de-duplicated.
func AllowDuplicates() HandlerOption {
	return handlerOption(func(o *wire.HandlerOptions) error {
		o.AllowDuplicates = true
		return nil
	})
}

// Filter hands the handler only the events the expression accepts; the
// host evaluates it before the handler runs, and acknowledges an event it
// rejects without running the handler, counting it (mesh.events.filtered)
// and costing it no attempt. An event several of the module's patterns
// match goes to the first of them whose filter accepts it. Given to On or
// Consume (Serve refuses it). A filter reads the event's attributes, its
// headers and its JSON body:
//
//	source = 'billing' and body.total >= 100
//	header.x-tenant in ('acme', 'globex') or not schema exists
//	not (node = 'edge-1' or body.order.status = "cancelled")
//
// Operands: type, source, node, schema, user (the publishing broker user),
// queue (a consumed queue), header.NAME (by its exact name) and body or
// body.PATH (dot-separated keys; a number indexes an array). Operators: =,
// !=, <, <=, >, >=, in (...), not in (...), exists; combined with and, or,
// not and parentheses. Literals: quoted strings ('...' or "...", a
// backslash escapes the quote), numbers, true, false, null. Comparisons are
// typed: a header or attribute compares as text with a string and as the
// number it spells with a number; a body field with a literal of its JSON
// type. A comparison with something missing (no such header or field, an
// empty attribute, a body that is not JSON) or of another type is false,
// for != and not in too; not inverts it. One Filter per handler: join
// conditions with and. At most 1024 bytes, 64 comparisons and 16
// levels of nesting.
//
// A bad expression makes On or Consume return ErrInvalid, saying where and
// what to write instead.
func Filter(expr string) HandlerOption {
	return handlerOption(func(o *wire.HandlerOptions) error {
		if o.Filter != nil {
			return fmt.Errorf("%w: a second Filter for one handler (%q beside %q): write one expression, joined with and", wire.ErrInvalid, expr, o.Filter.String())
		}
		f, err := wire.ParseFilter(expr)
		if err != nil {
			return err
		}
		o.Filter = f
		return nil
	})
}
