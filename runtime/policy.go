package runtime

import (
	"time"

	"github.com/meshkit/mesh/internal/execute"
)

// settlement is what becomes of a delivery once a handling of it is over.
type settlement int

const (
	// settleAck acknowledges it: handled.
	settleAck settlement = iota
	// settleRequeue returns it to its queue after the verdict's delay by a
	// reject with requeue: a quorum queue counts the attempt itself
	// (x-delivery-count), on every version from 3.10 to 4.3.
	settleRequeue
	// settleCopy puts a copy at the back of its classic queue after the
	// verdict's delay, carrying the attempts made in x-mesh-attempt (a
	// classic queue counts nothing), and acknowledges it once the copy is
	// confirmed.
	settleCopy
	// settleSchedule acknowledges it once a copy carrying the attempts
	// made (x-mesh-attempt) is scheduled back to its queue through the
	// delay cascade, due after the verdict's delay: a long back-off
	// (ModuleConfig.Retry) holds no delivery (ADR 32).
	settleSchedule
	// settleDead gives up on it: dead-lettered with the verdict's reason
	// (a dead letter itself, under a DeadLetters handler, is dropped:
	// mesh.dead-letters keeps its copy).
	settleDead
)

// verdict is the policy's decision on one handling.
type verdict struct {
	settle settlement
	delay  time.Duration // before a requeue or a copy
	reason string        // of settleDead: a wire.DeadReason
}

// deliveryPolicy decides the fate of a handled delivery from what the
// handler came to and how many attempts were made: the whole of the retry
// policy, without a broker or a clock (the back-off is given), so it is
// tested alone (policy_test.go). The three consumers of a module (its own
// queue, its consumed queues, its dead letters) settle by it.
type deliveryPolicy struct {
	maxAttempts int                             // attempts before giving up on a failing event
	quorum      bool                            // the queue counts attempts itself
	backoff     func(attempt int) time.Duration // the delay before attempt+1
	// schedule reports whether a back-off goes through the delay cascade
	// (settleSchedule); nil: none does.
	schedule func(delay time.Duration) bool
}

// decide is the verdict on the attempt-th handling (1-based) that came to
// o: OK is acknowledged; Permanent dead-lettered at once; Failed tried
// again after the back-off while attempts remain, then dead-lettered as
// past the delivery limit (execute.Decide, which meshtest settles by too);
// the queue type, and the length of the back-off, say how a retry goes
// back.
func (p deliveryPolicy) decide(o execute.Outcome, attempt int) verdict {
	switch v, reason := execute.Decide(o, attempt, p.maxAttempts); v {
	case execute.Ack:
		return verdict{settle: settleAck}
	case execute.GiveUp:
		return verdict{settle: settleDead, reason: reason}
	}
	v := verdict{settle: settleCopy, delay: p.backoff(attempt)}
	switch {
	case p.schedule != nil && p.schedule(v.delay):
		v.settle = settleSchedule
	case p.quorum:
		v.settle = settleRequeue
	}
	return v
}

// lostAttempt reports whether a delivery arriving redelivered already
// used up an attempt the queue did not record: on a classic queue, the
// last delivery of it was never settled (its consumer stopped or
// crashed), so it is settled as a failed attempt, by copy, before any
// handler runs. A quorum queue counted it in x-delivery-count.
func (p deliveryPolicy) lostAttempt(redelivered bool) bool {
	return redelivered && !p.quorum
}
