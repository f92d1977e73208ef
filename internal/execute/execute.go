// Package execute is the execution policy every host applies to a
// module's handlers, written once: running one so that a panic is an
// error, classifying what it returned, and the back-off before a retry.
// The runtime in-process, a module process (sdk/process) and sdk/meshtest
// use it, so they cannot drift apart.
package execute

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// Outcome is what a handler's call comes to.
type Outcome int

// The outcomes.
const (
	// OK acknowledges the event.
	OK Outcome = iota
	// Failed retries it with back-off, up to the attempt limit.
	Failed
	// Permanent dead-letters it at once.
	Permanent
	// Forbidden dead-letters it at once: the handler's emit or call was
	// refused for want of a grant, which no retry can change.
	Forbidden
	// Conflict dead-letters it at once: the handler's own record (an
	// inbox) holds the event's id with other content.
	Conflict
)

// Of classifies what a handler returned: nil is OK, a refused grant
// (wire.ErrForbidden, sdk.ErrForbidden) Forbidden, a conflict
// (wire.ErrConflict, sdk.ErrConflict) Conflict, an error marked
// permanent (sdk.Permanent, a permanent ToolError) Permanent, any other
// Failed.
func Of(err error) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, wire.ErrForbidden):
		return Forbidden
	case errors.Is(err, wire.ErrConflict):
		return Conflict
	case errors.Is(err, wire.ErrPermanent):
		return Permanent
	}
	return Failed
}

// Safely calls f and returns its error, or, if f panicked, a *PanicError
// saying where, with panicked true: a handler's panic is a failed attempt
// (for a tool, a permanent "internal" error), and the host goes on.
func Safely(f func() error) (err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			err, panicked = panicErrorOf(r), true
		}
	}()
	return f(), false
}

// MaxPanicStack bounds the stack a PanicError keeps, in bytes.
const MaxPanicStack = 8 << 10

// PanicError is a handler's panic: its value, the file and line where it
// panicked (the innermost frame outside Go's runtime), and the goroutine's
// stack, at most MaxPanicStack bytes. Its text names the place, so a dead
// letter's error says where to look: "handler panicked at
// billing/billing.go:42: assignment to entry in nil map".
type PanicError struct {
	Value any
	At    string // dir/file.go:line, "" if unknown
	Stack string
}

// Error says where the handler panicked, and with what.
func (e *PanicError) Error() string {
	if e.At == "" {
		return fmt.Sprintf("handler panicked: %v", e.Value)
	}
	return fmt.Sprintf("handler panicked at %s: %v", e.At, e.Value)
}

// panicErrorOf is the PanicError of the panic r, called from the deferred
// recover.
func panicErrorOf(r any) *PanicError {
	e := &PanicError{Value: r}
	stack := debug.Stack()
	if len(stack) > MaxPanicStack {
		stack = append(stack[:MaxPanicStack:MaxPanicStack], "\n... (stack cut)"...)
	}
	e.Stack = string(stack)
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)]) // past Callers, panicErrorOf and the deferred func
	for {
		fr, more := frames.Next()
		if fr.Function != "" && !strings.HasPrefix(fr.Function, "runtime.") && !strings.HasPrefix(fr.Function, "internal/runtime/") {
			e.At = shortPath(fr.File) + ":" + strconv.Itoa(fr.Line)
			break
		}
		if !more {
			break
		}
	}
	return e
}

// shortPath is a source file's last directory and name.
func shortPath(file string) string {
	dir, name := path.Split(file)
	return path.Join(path.Base(dir), name)
}

// Verdict is what becomes of a delivery once its handling came to an
// outcome.
type Verdict int

// The verdicts.
const (
	// Ack acknowledges it: handled.
	Ack Verdict = iota
	// Retry tries it again after a back-off (Backoff).
	Retry
	// GiveUp dead-letters it (a dead letter itself is dropped), for the
	// reason Decide gives.
	GiveUp
)

// Decide is the failure policy every host settles by: the verdict on the
// attempt-th handling (1-based) of a delivery that came to o, with the
// reason when it gives up. OK is acknowledged; Permanent given up at once
// (wire.DeadReasonPermanent), Forbidden too (wire.DeadReasonForbidden),
// and Conflict (wire.DeadReasonConflict);
// Failed retried while attempts remain, then given up as past the limit
// (wire.DeadReasonDeliveryLimit).
func Decide(o Outcome, attempt, maxAttempts int) (Verdict, string) {
	switch {
	case o == OK:
		return Ack, ""
	case o == Permanent:
		return GiveUp, wire.DeadReasonPermanent
	case o == Forbidden:
		return GiveUp, wire.DeadReasonForbidden
	case o == Conflict:
		return GiveUp, wire.DeadReasonConflict
	case attempt >= maxAttempts:
		return GiveUp, wire.DeadReasonDeliveryLimit
	}
	return Retry, ""
}

// Backoff is the delay before attempt+1 of a failed handler: exponential
// from lo, doubling, capped at hi. With jitter (rand.Int64N), up to a fifth
// of it is taken off at random, so that the retries of a burst spread (a
// node); without (nil), it repeats exactly (meshtest).
func Backoff(attempt int, lo, hi time.Duration, jitter func(int64) int64) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if jitter != nil {
		d -= time.Duration(jitter(int64(d)/5 + 1))
	}
	return d
}

// ToolFailure is what a tool handler's error becomes for its caller when
// it is not a tool error of its own (an *sdk.ToolError, sent as it is):
// code "rejected" and permanent for an error marked permanent, a
// refused grant or a conflict, "failed" and transient for any other.
func ToolFailure(err error) (code string, permanent bool) {
	if o := Of(err); o == Permanent || o == Forbidden || o == Conflict {
		return wire.CodeRejected, true
	}
	return wire.CodeFailed, false
}
