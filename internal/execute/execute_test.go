package execute

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

func TestOf(t *testing.T) {
	for err, want := range map[error]Outcome{
		nil:                                    OK,
		errors.New("x"):                        Failed,
		fmt.Errorf("y: %w", wire.ErrPermanent): Permanent,
		errors.Join(errors.New("z"), fmt.Errorf("%w", wire.ErrPermanent)): Permanent,
		fmt.Errorf("call x: %w: add it to calls:", wire.ErrForbidden):     Forbidden,
		fmt.Errorf("both: %w, %w", wire.ErrPermanent, wire.ErrForbidden):  Forbidden,
		wire.ErrTransient:                                                  Failed,
		fmt.Errorf("inbox: %w", wire.ErrConflict):                          Conflict,
		errors.Join(wire.ErrPermanent, fmt.Errorf("%w", wire.ErrConflict)): Conflict,
	} {
		if got := Of(err); got != want {
			t.Errorf("Of(%v) = %v, want %v", err, got, want)
		}
	}
}

func TestSafely(t *testing.T) {
	if err, p := Safely(func() error { return nil }); err != nil || p {
		t.Errorf("nil: %v %v", err, p)
	}
	boom := errors.New("boom")
	if err, p := Safely(func() error { return boom }); err != boom || p {
		t.Errorf("error: %v %v", err, p)
	}
	if err, p := Safely(func() error { panic("at the disco") }); err == nil || !strings.HasPrefix(err.Error(), "handler panicked at execute/execute_test.go:") || !strings.HasSuffix(err.Error(), ": at the disco") || !p {
		t.Errorf("panic: %v %v", err, p)
	}
	var m map[string]int
	err, _ := Safely(func() error {
		m["x"] = 1 // the line the error must name
		return nil
	})
	var pe *PanicError
	if !errors.As(err, &pe) || !strings.Contains(pe.Stack, "execute_test.go") || len(pe.Stack) > MaxPanicStack+32 {
		t.Fatalf("nil map: %v, want a *PanicError with its stack", err)
	}
	_, file, line, _ := runtime.Caller(0)
	if want := fmt.Sprintf("handler panicked at execute/%s:%d: assignment to entry in nil map", filepath.Base(file), line-7); err.Error() != want {
		t.Errorf("nil map: %q, want %q", err, want)
	}
}

func TestBackoff(t *testing.T) {
	lo, hi := 200*time.Millisecond, time.Second
	for attempt, want := range map[int]time.Duration{1: lo, 2: 400 * time.Millisecond, 3: 800 * time.Millisecond, 4: hi, 40: hi} {
		if got := Backoff(attempt, lo, hi, nil); got != want {
			t.Errorf("attempt %d: %v, want %v", attempt, got, want)
		}
		most := func(n int64) int64 { return n - 1 }
		if got := Backoff(attempt, lo, hi, most); got < want*4/5 || got > want {
			t.Errorf("attempt %d with jitter: %v, want within a fifth under %v", attempt, got, want)
		}
	}
}

// TestDecide: the failure policy as a table, at the first, the last and
// past the last attempt.
func TestDecide(t *testing.T) {
	for _, c := range []struct {
		o       Outcome
		attempt int
		want    Verdict
		reason  string
	}{
		{OK, 1, Ack, ""},
		{OK, 9, Ack, ""},
		{Permanent, 1, GiveUp, wire.DeadReasonPermanent},
		{Permanent, 3, GiveUp, wire.DeadReasonPermanent},
		{Forbidden, 1, GiveUp, wire.DeadReasonForbidden},
		{Conflict, 1, GiveUp, wire.DeadReasonConflict},
		{Failed, 1, Retry, ""},
		{Failed, 2, Retry, ""},
		{Failed, 3, GiveUp, wire.DeadReasonDeliveryLimit},
		{Failed, 4, GiveUp, wire.DeadReasonDeliveryLimit},
	} {
		if v, reason := Decide(c.o, c.attempt, 3); v != c.want || reason != c.reason {
			t.Errorf("Decide(%v, %d, 3) = %v %q, want %v %q", c.o, c.attempt, v, reason, c.want, c.reason)
		}
	}
}
