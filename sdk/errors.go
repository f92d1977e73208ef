package sdk

import "github.com/meshkit/mesh/internal/wire"

// Errors callers branch on with errors.Is. A call that got no answer in
// time satisfies errors.Is(err, context.DeadlineExceeded).
var (
	// ErrPermanent marks an error that retrying cannot fix: the event is
	// dead-lettered at once. Wrap an error with Permanent to mark it.
	ErrPermanent = wire.ErrPermanent
	// ErrInvalid is wrapped by the error for what breaks the contract: an
	// event type, event name, pattern, tool key or module name against the
	// naming rules, a body that is not JSON or is over the node's limit, a
	// bad emit or handler option, a nil handler, a pattern or tool
	// subscribed twice; an Emit or Call during Setup (before the module
	// consumes), and an On, Consume, Exclusive or Serve after it. The
	// message says which rule and what to do instead; nothing is sent or
	// bound.
	ErrInvalid = wire.ErrInvalid
	// ErrForbidden is returned by Emit for an event type outside what the
	// module may emit, and by Serve for a tool its node config does not
	// grant (the tools key of the module in meshd's config).
	ErrForbidden = wire.ErrForbidden
	// ErrConflict marks a handler's error for an event whose id the
	// handler's own record (an inbox: sdk/outbox's Handler) holds with
	// other content: the same id with another type, body or headers of
	// its meaning. The event is dead-lettered at once with reason
	// "conflict", as one the node's own de-duplication finds, and
	// counted as a conflict. Wrap it with %w.
	ErrConflict = wire.ErrConflict
	// ErrClosed is returned once the mesh has been closed.
	ErrClosed = wire.ErrClosed
	// ErrNoServer is returned by Call at once when nobody serves the tool:
	// no server ever declared it, or none is running now.
	ErrNoServer = wire.ErrNoServer
	// ErrTransient is wrapped by the error of an emit or call that may
	// succeed if made again later; its message says which of these it is:
	// the broker refused the event (a negative confirm, for example a full
	// queue) or could neither route nor keep it; the broker connection
	// dropped while the emit or call was in flight (the event may or may
	// not have reached the broker: emit it again, and de-duplication
	// absorbs a copy); or the node can take no more events for now (the
	// broker is unreachable and the node's spool is full; nothing was
	// kept: slow down).
	ErrTransient = wire.ErrTransient
)

// ToolError is a tool's error: a server handler returns it to choose the
// code, and Call returns it with what the server sent.
//
// Besides a tool's own codes, the mesh gives these: "rejected" (the
// handler returned a Permanent error), "failed" (any other error),
// "internal" (the handler panicked or its response was not JSON),
// "invalid_request" (the request broke the wire contract, or the tool's
// declared request schema) and "invalid_response" (the handler's response
// broke the tool's declared response schema: the handler ran).
type ToolError struct {
	// Code is a short machine-readable word ("not_found", "rejected").
	Code string
	// Message says what went wrong, for people.
	Message string
	// Permanent is true when calling again with the same request cannot
	// succeed.
	Permanent bool
}

// Error says the code, whether the error is permanent, and the message.
func (e *ToolError) Error() string {
	kind := "transient"
	if e.Permanent {
		kind = "permanent"
	}
	return "tool error " + e.Code + " (" + kind + "): " + e.Message
}

// Is makes errors.Is(err, ErrPermanent) hold for a permanent ToolError.
func (e *ToolError) Is(target error) bool {
	return target == ErrPermanent && e.Permanent
}

type permanentError struct{ err error }

func (p permanentError) Error() string { return "permanent: " + p.err.Error() }
func (p permanentError) Unwrap() []error {
	return []error{p.err, ErrPermanent}
}

// Permanent marks err as permanent: a handler returning it has its event
// dead-lettered at once instead of retried. errors.Is(Permanent(err),
// ErrPermanent) and errors.Is(Permanent(err), err) both hold. Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}
