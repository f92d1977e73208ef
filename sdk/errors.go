package sdk

import (
	"context"
	"errors"

	"github.com/meshkit/mesh/internal/wire"
)

// Errors callers branch on with errors.Is.
var (
	// ErrPermanent marks an error that retrying cannot fix: the event is
	// dead-lettered at once. Wrap an error with Permanent to mark it.
	ErrPermanent = errors.New("permanent")
	// ErrInvalidName is wrapped by the error for an event type, event name,
	// pattern, module or node name that breaks the naming rules; the message
	// says which rule. Nothing is sent or bound.
	ErrInvalidName = wire.ErrInvalid
	// ErrBodyTooLarge is returned by Emit for a body over the node's limit.
	ErrBodyTooLarge = errors.New("event body too large")
	// ErrBodyNotJSON is returned by Emit for a body that is not valid JSON
	// or cannot be marshalled to it.
	ErrBodyNotJSON = errors.New("event body is not JSON")
	// ErrForbidden is returned by Emit for an event type outside what the
	// module may emit.
	ErrForbidden = errors.New("forbidden")
	// ErrRefused is returned by Emit when the broker refused the event (a
	// negative confirm, for example a full queue). It is transient.
	ErrRefused = errors.New("refused by the broker")
	// ErrUnroutable is returned by Emit when the broker could not route the
	// event and could not keep it either.
	ErrUnroutable = errors.New("unroutable")
	// ErrClosed is returned once the mesh has been closed.
	ErrClosed = errors.New("mesh closed")
	// ErrAlreadyStarted is returned by On and Serve once the module
	// consumes: its patterns and tools are fixed for this run.
	ErrAlreadyStarted = errors.New("module already started")
	// ErrNoServer is returned by Call at once when nobody serves the tool:
	// no server ever declared it, or none is running now.
	ErrNoServer = errors.New("no server for this tool")
	// ErrDeadlineExceeded is returned by Call when no answer came before
	// the deadline. It is transient; errors.Is(err,
	// context.DeadlineExceeded) holds as well.
	ErrDeadlineExceeded error = deadlineExceeded{}
	// ErrConnectionLost is returned by Call and Emit when the broker
	// connection dropped while the call or the publish was in flight. It is
	// transient.
	ErrConnectionLost = errors.New("broker connection lost")
	// ErrBackPressure is returned by Emit when the node can take no more
	// events for now: the broker is unreachable and the node's local spool
	// is full. Nothing was kept; emit again later. It is transient.
	ErrBackPressure = errors.New("back-pressure: the node's spool is full")
)

// Tool error codes the mesh itself uses. A tool may use its own.
const (
	CodeRejected       = "rejected"        // the handler returned a Permanent error
	CodeFailed         = "failed"          // the handler returned another error
	CodeInternal       = "internal"        // the handler panicked or its response could not be encoded
	CodeInvalidRequest = "invalid_request" // the request broke the wire contract
)

// ToolError is a tool's error: a server handler returns it to choose the
// code, and Call returns it with what the server sent.
type ToolError struct {
	// Code is a short machine-readable word ("not_found", "rejected").
	Code string
	// Message says what went wrong, for people.
	Message string
	// Permanent is true when calling again with the same request cannot
	// succeed.
	Permanent bool
}

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

type deadlineExceeded struct{}

func (deadlineExceeded) Error() string        { return "call deadline exceeded" }
func (deadlineExceeded) Is(target error) bool { return target == context.DeadlineExceeded }

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
