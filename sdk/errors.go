package sdk

import (
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
	// ErrAlreadyStarted is returned by On once the module consumes: its
	// patterns are fixed for this run.
	ErrAlreadyStarted = errors.New("module already started")
)

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
