package plugin

import (
	"context"
	"errors"
	"strings"

	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
)

// errorKinds is the one table of the sentinel errors that cross the
// protocol, in the order KindOf tries them: an error that wraps several
// (wire.ErrNotStarted wraps wire.ErrInvalid) gets the first.
var errorKinds = []struct {
	kind pb.ErrorKind
	err  error
}{
	{pb.ErrorKind_NOT_STARTED, wire.ErrNotStarted},
	{pb.ErrorKind_ALREADY_STARTED, wire.ErrAlreadyStarted},
	{pb.ErrorKind_INVALID_NAME, wire.ErrInvalid}, // whatever broke the contract
	{pb.ErrorKind_REFUSED, wire.ErrRefused},
	{pb.ErrorKind_CLOSED, wire.ErrClosed},
	{pb.ErrorKind_CONNECTION_LOST, wire.ErrConnectionLost},
	{pb.ErrorKind_NO_SERVER, wire.ErrNoServer},
	{pb.ErrorKind_DEADLINE_EXCEEDED, context.DeadlineExceeded},
	{pb.ErrorKind_FORBIDDEN, wire.ErrForbidden},
	{pb.ErrorKind_BACK_PRESSURE, wire.ErrBackPressure},
}

// KindOf names the sentinel err wraps, for the other side of the
// protocol: NONE for nil, OTHER for none of them. (A tool's error is the
// host's to recognise: it is an sdk type; see pb.ErrorKind_TOOL.)
func KindOf(err error) pb.ErrorKind {
	if err == nil {
		return pb.ErrorKind_NONE
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return pb.ErrorKind_OTHER
}

// ErrorOf is the error the other side reported with kind and msg, which
// wraps the kind's sentinel, so that errors.Is works as it would
// in-process; an OTHER error (or one of a kind this build does not know)
// is msg alone.
func ErrorOf(kind pb.ErrorKind, msg string) error {
	switch kind {
	case pb.ErrorKind_NONE:
		return nil
	case pb.ErrorKind_BODY_TOO_LARGE, pb.ErrorKind_BODY_NOT_JSON: // kinds older hosts sent
		kind = pb.ErrorKind_INVALID_NAME
	case pb.ErrorKind_UNROUTABLE:
		kind = pb.ErrorKind_REFUSED
	}
	for _, k := range errorKinds {
		if k.kind == kind {
			if !strings.Contains(msg, k.err.Error()) {
				msg += ": " + k.err.Error()
			}
			return &reported{msg: msg, sentinel: k.err}
		}
	}
	return errors.New(msg)
}

// reported is an error from the other side: its message as sent, and the
// sentinel it wraps.
type reported struct {
	msg      string
	sentinel error
}

func (e *reported) Error() string { return e.msg }
func (e *reported) Unwrap() error { return e.sentinel }
