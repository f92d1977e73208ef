package runtime

import (
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/wire"
)

// TestDeliveryPolicy is the retry policy as a table: every outcome, on
// both queue types, at the first, a middle and the last attempt, and past
// it (a classic copy whose x-mesh-attempt a later limit no longer allows).
func TestDeliveryPolicy(t *testing.T) {
	backoff := func(attempt int) time.Duration { return time.Duration(attempt) * time.Second }
	for _, c := range []struct {
		name    string
		quorum  bool
		outcome execute.Outcome
		attempt int
		want    verdict
	}{
		{"ok first", false, execute.OK, 1, verdict{settle: settleAck}},
		{"ok last", true, execute.OK, 3, verdict{settle: settleAck}},
		{"ok past the limit", false, execute.OK, 9, verdict{settle: settleAck}},
		{"permanent first, classic", false, execute.Permanent, 1, verdict{settle: settleDead, reason: wire.DeadReasonPermanent}},
		{"permanent first, quorum", true, execute.Permanent, 1, verdict{settle: settleDead, reason: wire.DeadReasonPermanent}},
		{"permanent last", true, execute.Permanent, 3, verdict{settle: settleDead, reason: wire.DeadReasonPermanent}},
		{"failed first, classic", false, execute.Failed, 1, verdict{settle: settleCopy, delay: time.Second}},
		{"failed first, quorum", true, execute.Failed, 1, verdict{settle: settleRequeue, delay: time.Second}},
		{"failed second, quorum", true, execute.Failed, 2, verdict{settle: settleRequeue, delay: 2 * time.Second}},
		{"failed last, classic", false, execute.Failed, 3, verdict{settle: settleDead, reason: wire.DeadReasonDeliveryLimit}},
		{"failed last, quorum", true, execute.Failed, 3, verdict{settle: settleDead, reason: wire.DeadReasonDeliveryLimit}},
		{"failed past the limit", false, execute.Failed, 7, verdict{settle: settleDead, reason: wire.DeadReasonDeliveryLimit}},
	} {
		p := deliveryPolicy{maxAttempts: 3, quorum: c.quorum, backoff: backoff}
		if got := p.decide(c.outcome, c.attempt); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A back-off long enough waits in the delay cascade, on both queue
	// types; a shorter one is held; the last attempt is dead-lettered
	// still.
	long := deliveryPolicy{maxAttempts: 3, quorum: true, backoff: backoff, schedule: func(d time.Duration) bool { return d >= 2*time.Second }}
	for attempt, want := range map[int]verdict{
		1: {settle: settleRequeue, delay: time.Second},
		2: {settle: settleSchedule, delay: 2 * time.Second},
		3: {settle: settleDead, reason: wire.DeadReasonDeliveryLimit},
	} {
		if got := long.decide(execute.Failed, attempt); got != want {
			t.Errorf("scheduled from 2s, attempt %d: %+v, want %+v", attempt, got, want)
		}
		long.quorum = !long.quorum
		if got := long.decide(execute.Failed, attempt); attempt == 2 && got != want {
			t.Errorf("scheduled from 2s, classic, attempt %d: %+v, want %+v", attempt, got, want)
		}
		long.quorum = !long.quorum
	}
	// One attempt allowed: a failure is dead-lettered at once, never
	// retried.
	one := deliveryPolicy{maxAttempts: 1, backoff: backoff}
	if got := one.decide(execute.Failed, 1); got.settle != settleDead || got.reason != wire.DeadReasonDeliveryLimit {
		t.Errorf("max 1, failed: %+v", got)
	}
}

// TestLostAttempt: only a classic queue's redelivery is an attempt the
// queue did not count.
func TestLostAttempt(t *testing.T) {
	for _, c := range []struct{ quorum, redelivered, want bool }{
		{false, true, true}, {false, false, false}, {true, true, false}, {true, false, false},
	} {
		if got := (deliveryPolicy{quorum: c.quorum}).lostAttempt(c.redelivered); got != c.want {
			t.Errorf("quorum %v redelivered %v: %v, want %v", c.quorum, c.redelivered, got, c.want)
		}
	}
}
