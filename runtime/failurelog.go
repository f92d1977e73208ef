package runtime

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/meshkit/mesh/internal/execute"
)

// A handler's failed attempt is a warning in the node's log, with the
// event's id, type, attempt and error (and a panic's stack), so that an
// operator at the default level sees a module failing before its events
// reach the dead letters. A module failing every event would flood the
// log: each module may log failureBurst such lines per failureWindow, and
// the first line after a quiet spell says how many were left out.

const (
	failureBurst  = 10
	failureWindow = 10 * time.Second
)

// failureBudget rate-limits one module's failure warnings.
type failureBudget struct {
	mu         sync.Mutex
	start      time.Time // of the current window
	used       int       // lines logged in it
	suppressed int       // lines left out since the last logged one
}

// take reports whether a line may be logged at now, and how many were
// left out before it.
func (b *failureBudget) take(now time.Time) (ok bool, suppressed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.start) >= failureWindow {
		b.start, b.used = now, 0
	}
	if b.used >= failureBurst {
		b.suppressed++
		return false, 0
	}
	b.used++
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// warnFailed logs a failed attempt of the handling of event id of
// eventType, tried again after retryIn (0: not again), within the module's
// budget.
func (m *Module) warnFailed(msg, eventType, id string, attempt int, retryIn time.Duration, cause error) {
	ok, suppressed := m.failures.take(time.Now())
	if !ok {
		return
	}
	attrs := []any{"event_id", id, "event_type", eventType, "attempt", attempt, "err", cause}
	if retryIn > 0 {
		attrs = append(attrs, "retry_in", retryIn)
	}
	attrs = append(attrs, panicStack(cause)...)
	if suppressed > 0 {
		attrs = append(attrs, "failures_not_logged", suppressed)
	}
	m.log.Warn(msg, attrs...)
}

// panicStack is the log attribute of a handler's panic's stack, if cause
// is one.
func panicStack(cause error) []any {
	var pe *execute.PanicError
	if errors.As(cause, &pe) && pe.Stack != "" {
		return []any{slog.String("stack", pe.Stack)}
	}
	return nil
}
