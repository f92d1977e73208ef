package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/dedup"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/filter"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Delivery: what the module's workers do with each delivery of its own
// queue (handle; consume.go's handleQueued and deadsub.go's handleDead do
// the same for consumed queues and dead letters): read it, refuse what
// breaks the contract, filter, de-duplicate, run the handler under its
// timeout, and settle it once, as the delivery policy (policy.go) decides.

// handle runs one delivery through validation, the handler and the
// failure policy. Every path ends in exactly one ack, reject or scheduled
// retry. It reports whether the handler overran its timeout, in which case
// the delivery was settled as failed and a new worker started in the
// calling worker's place.
func (m *Module) handle(d amqp.Delivery, deliveries <-chan amqp.Delivery, a *acker) (replaced bool) {
	return m.handleFrom(m.own(d, a), d, 0, func() { m.startWorker(deliveries, a) })
}

// handleFrom is handle of d from src, tried times before by its lane (an
// ordered partition's, which tries a failed event again in place), with
// replace, if not nil, starting a worker in the place of one whose handler
// overran its timeout.
func (m *Module) handleFrom(src source, d amqp.Delivery, tried int, replace func()) (replaced bool) {
	counts := m.from(d)
	if tried == 0 {
		counts.delivered.Add(1)
	}
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	// The runtime's own headers count only where the runtime put them
	// (owned.go): the type, the publisher and the attempts made.
	o, oerr := m.node.originOf(d)
	eventType := o.eventType
	if !o.own {
		meta.Attempt = 0
	}
	attempt := m.attempt(d, meta) + tried
	if err == nil {
		err = oerr
	}
	if err == nil {
		err = wire.ValidateEventType(eventType)
	}
	if err != nil {
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonMalformed, err)
		return false
	}
	// Its x-node against the broker user that published it, as the
	// node's identity rule names them (identity.go).
	if err := m.identity(d, "event", meta.ID, eventType, meta.Node, o.userID); err != nil {
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonIdentity, err)
		return false
	}
	ev := eventOf(d, meta, eventType, attempt)
	ev.UserID = o.userID
	if attempt == 1 {
		m.recordTimeInQueue(ev.Time, d.Headers)
	}
	sub, matched := m.subscriptionFor(ev)
	switch {
	case !matched:
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonNoHandler, fmt.Errorf("no handler of module %s matches %s", m.def.Name, eventType))
		return false
	case sub.handler == nil:
		m.filteredOut(src, d, counts, ev)
		return false
	}
	if err := m.contracts.Read(sub.pattern, ev.Schema); err != nil {
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonSchema, err)
		return false
	}
	release := func() {}
	var digest uint64
	if sub.dedup {
		digest = wire.Digest(eventType, meta, d.Body)
		var verdict dedup.Verdict
		var recorded uint64
		release, verdict, recorded = m.claim(meta.ID, digest)
		switch verdict {
		case dedup.Duplicate:
			m.node.stats.duplicates.Add(1)
			counts.duplicates.Add(1)
			m.log.Debug("event already handled; acknowledged without handling it again", "event_id", meta.ID, "event_type", eventType)
			if err := src.ack(d); err != nil {
				m.log.Warn("ack of a duplicate failed; it will be delivered again", "event_id", meta.ID, "err", err)
			}
			return false
		case dedup.Conflict:
			m.conflict(src, d, counts, meta.ID, eventType, attempt, recorded, digest)
			return false
		}
		defer release()
	}
	if m.policy(src.quorum).lostAttempt(d.Redelivered) {
		m.failed(src, d, eventType, attempt, errors.New("the consumer stopped before the handler finished"))
		return false
	}
	err, overran := m.call(sub.handler, ev, d, src.queue, func() {
		release() // settled as failed: a redelivery must not wait for the hung handler
		if replace != nil {
			replace()
		}
		m.failed(src, d, eventType, attempt, fmt.Errorf("handler timed out after %v", m.cfg.HandlerTimeout))
		// Settled outside any worker: the replacement may be waiting for
		// a delivery already, with no linger to send a held ack, so the
		// ack (after a dead letter, or of a classic queue's retried
		// original) goes now rather than with the next delivery.
		if src.acks != nil {
			if err := src.acks.flush(); err != nil {
				m.log.Warn("ack after a timed-out handler failed; the event will be delivered again", "event_id", ev.ID, "err", err)
			}
		}
	})
	switch {
	case overran:
		return true
	case err == nil:
		m.node.stats.handled.Add(1)
		counts.handled.Add(1)
		// Recorded before the ack: if the ack is lost (the connection
		// dropped), the redelivery is recognised.
		if sub.dedup && !m.record(d, ev.ID, digest) {
			return false // its channel closed unrecorded: the broker delivers it again
		}
		if err := src.ack(d); err != nil {
			m.log.Warn("ack failed; the event will be delivered again (and recognised as handled)", "event_id", ev.ID, "err", err)
		}
	default:
		m.failed(src, d, eventType, attempt, err)
	}
	return false
}

// eventOf is what a handler sees of a delivery.
func eventOf(d amqp.Delivery, meta wire.Meta, eventType string, attempt int) sdk.Event {
	return sdk.Event{
		ID:          meta.ID,
		Type:        eventType,
		Source:      meta.Source,
		Node:        meta.Node,
		Time:        meta.Time,
		CausationID: meta.CausationID,
		Schema:      meta.Schema,
		Headers:     meta.Extra,
		Body:        d.Body,
		Attempt:     attempt,
		Redelivered: d.Redelivered,
		UserID:      d.UserId,
	}
}

// attempt is the 1-based number of this handling of d.
// The attempts a copy of the node's own carries (meta.Attempt: a classic
// queue's retry, or a retry scheduled through the delay cascade) count
// first; a quorum queue adds those it counted itself.
func (m *Module) attempt(d amqp.Delivery, meta wire.Meta) int {
	if m.cfg.QueueType == QueueQuorum {
		if n, ok := d.Headers["x-delivery-count"].(int64); ok && n >= 0 {
			return meta.Attempt + int(n) + 1
		}
	}
	return meta.Attempt + 1
}

// subscriptionFor is the subscription ev goes to: the first whose pattern
// matches its type and whose filter, if any, accepts it. matched is false
// when no pattern matches; a subscription with a nil handler, when some
// do and their filters reject it.
func (m *Module) subscriptionFor(ev sdk.Event) (sub subscription, matched bool) {
	var fe *filter.Event
	for _, s := range m.subs { // fixed since start: no lock needed
		if !wire.MatchPattern(s.pattern, ev.Type) {
			continue
		}
		matched = true
		if s.filter == nil {
			return s, true
		}
		if fe == nil {
			fe = filterEvent(ev)
		}
		if s.filter.Match(fe) {
			return s, true
		}
	}
	return subscription{}, matched
}

// filterEvent is what a filter reads of ev.
func filterEvent(ev sdk.Event) *filter.Event {
	return &filter.Event{Type: ev.Type, Source: ev.Source, Node: ev.Node, Schema: ev.Schema, User: ev.UserID, Queue: ev.Queue, Headers: ev.Headers, Body: ev.Body}
}

// filteredOut acknowledges a delivery the module's filters rejected,
// counting it: it costs no attempt and runs no handler.
func (m *Module) filteredOut(src source, d amqp.Delivery, counts *originCounts, ev sdk.Event) {
	m.node.stats.filtered.Add(1)
	counts.filtered.Add(1)
	m.log.Debug("event rejected by the handlers' filters; acknowledged without handling", "event_id", ev.ID, "event_type", ev.Type)
	if err := src.ack(d); err != nil {
		m.log.Warn("ack of a filtered event failed; it will be delivered again", "event_id", ev.ID, "err", err)
	}
}

// claim reports whether the event id was already handled by the module,
// and if so whether with the content of digest (dedup.Duplicate) or other
// content (dedup.Conflict, with the digest recorded). If not
// (dedup.New), the caller holds the id until it calls release: a second
// delivery of the same id meanwhile (a duplicate from a fan-out retry, a
// resend) waits for the first one's outcome instead of running alongside
// it.
func (m *Module) claim(id string, digest uint64) (release func(), v dedup.Verdict, recorded uint64) {
	for {
		m.mu.Lock()
		if busy, held := m.claimed[id]; held {
			m.mu.Unlock()
			<-busy
			continue
		}
		mine := make(chan struct{})
		m.claimed[id] = mine
		m.mu.Unlock()
		release = sync.OnceFunc(func() {
			m.mu.Lock()
			delete(m.claimed, id)
			m.mu.Unlock()
			close(mine)
		})
		// Checked under the claim: a handling of id records it before it
		// lets go of its claim, so one that ended before this claim is
		// seen here.
		v, recorded, err := m.dedup.Check(id, digest)
		if err != nil {
			m.log.Warn("could not check whether the event was handled; handling it", "event_id", id, "err", err)
			return release, dedup.New, dedup.NoDigest
		}
		if v != dedup.New {
			release()
			return nil, v, recorded
		}
		return release, dedup.New, dedup.NoDigest
	}
}

// conflict settles a delivery of event id, which the module handled with
// other content: not handled, dead-lettered with reason conflict naming
// both digests (deadLetter logs it), and counted. Dropping it as a
// duplicate would lose the other content without a trace (a producer
// that reuses ids, or a forgery of a handled id).
func (m *Module) conflict(src source, d amqp.Delivery, counts *originCounts, id, eventType string, attempt int, recorded, digest uint64) {
	m.node.stats.conflicts.Add(1)
	counts.conflicts.Add(1)
	err := errors.New(wire.ConflictError(id, recorded, digest))
	m.deadLetter(src, d, eventType, attempt, wire.DeadReasonConflict, err)
}

// call runs the handler in the calling worker, with the event as the
// context's cause (unless its id is no ULID: a dead letter that breaks the
// contract) and the handler timeout as its deadline, turning a panic
// into an error. If the deadline passes first, overran runs at once (from
// another goroutine) to settle the event and replace the worker, and call
// reports overran=true when the handler finally returns; its result is then
// ignored. Running inline, rather than on a goroutine per event, spares
// every event a goroutine start and stack growth.
func (m *Module) call(h sdk.Handler, ev sdk.Event, d amqp.Delivery, queue string, overran func()) (err error, timedOut bool) {
	// A module process's suspect waits for the process to be its alone,
	// and other events for the suspects (isolation.go): before its
	// deadline starts.
	leave, err := m.isolate(d)
	if err != nil {
		return err, false
	}
	defer leave()
	traced, span := m.node.startProcess(m.handleCtx, d, queue, ev.Type, m.def.Name)
	defer func() {
		if timedOut {
			endSpan(span, fmt.Errorf("handler timed out after %v", m.cfg.HandlerTimeout))
			return
		}
		endSpan(span, err)
	}()
	traced = handlerlog.Event(traced, m.log, ev.ID, ev.Type, tracecontext.IDs)
	ctx, cancel := context.WithTimeout(causation.HandlingEvent(traced, ev.ID, ev.Time), m.cfg.HandlerTimeout)
	defer cancel()
	var settled atomic.Bool
	overranDone := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && settled.CompareAndSwap(false, true) {
			defer close(overranDone)
			overran()
		}
	})
	start := time.Now()
	err = safeHandle(ctx, h, ev)
	stopWatch()
	if !settled.CompareAndSwap(false, true) {
		// Wait until the replacement worker is counted, so that the
		// module's worker count never drops to zero in between.
		<-overranDone
		m.recordHandler(start, outcomeTimeout)
		return nil, true
	}
	// A handler in a module process reports its deadline from its own
	// timer, which may fire before ctx's here: past the deadline, the
	// failure is a timeout either way.
	late := false
	if deadline, _ := ctx.Deadline(); err != nil && (errors.Is(ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(deadline)) {
		err, late = fmt.Errorf("handler timed out after %v: %w", m.cfg.HandlerTimeout, err), true
	}
	m.recordHandler(start, outcomeOf(err, late))
	return err, false
}

func safeHandle(ctx context.Context, h sdk.Handler, ev sdk.Event) error {
	err, _ := execute.Safely(func() error { return h.HandleEvent(ctx, ev) })
	return err
}

// source is the queue a delivery came from, for settling it: the
// module's own, or one it consumes (Consume).
type source struct {
	queue  string
	quorum bool   // a failed attempt goes back by reject, which counts attempts
	acks   *acker // the acker of the delivery's channel; nil: settled one by one
	// back, if not queue, is where the node's copies of the delivery go
	// (a classic queue's retry, a retry through the delay cascade, a
	// suspect): a group's event is retried in the node's own queue, whose
	// copies the node alone takes and trusts (owned.go).
	back string
	// lane, if not nil, is the ordered partition's lane of the delivery's
	// key (partitions.go): a failed attempt is tried again in the lane,
	// holding the key's later events, never requeued or copied.
	lane laneOf
}

// laneOf is what settling a delivery of an ordered partition tells its
// lane: it is settled (acknowledged, dead-lettered), or to be tried again
// after delay.
type laneOf interface {
	settled()
	retry(delay time.Duration)
}

// copiesTo is the queue the node's copies of a delivery from src go to.
func (src source) copiesTo() string {
	if src.back != "" {
		return src.back
	}
	return src.queue
}

// own is the queue d came from, the module's own event queue or its
// group's, as a source.
func (m *Module) own(d amqp.Delivery, a *acker) source {
	src := source{queue: m.queue, quorum: m.cfg.QueueType == QueueQuorum, acks: a}
	if m.groupTag != "" && d.ConsumerTag == m.groupTag {
		src.queue, src.back = m.groupQueue, m.queue
	}
	return src
}

// policy is the module's delivery policy for a queue of that type.
func (m *Module) policy(quorum bool) deliveryPolicy {
	return deliveryPolicy{maxAttempts: m.cfg.MaxAttempts, quorum: quorum, backoff: m.backoff}
}

// retryPolicy is the policy of the queues the module's handlers take
// events and messages from (its own queue, the queues it consumes), whose
// long retries may wait in the delay cascade: a dispatcher's triggers, on
// either, retry their tool calls so.
func (m *Module) retryPolicy(quorum bool) deliveryPolicy {
	p := m.policy(quorum)
	if len(m.cfg.Retry) > 0 {
		p.schedule = m.node.scheduled
	}
	return p
}

// backoff is the delay before attempt+1: the module's Retry, the last
// repeated, or the node's exponential back-off.
func (m *Module) backoff(attempt int) time.Duration {
	if r := m.cfg.Retry; len(r) > 0 {
		return r[min(max(attempt, 1), len(r))-1]
	}
	return m.node.backoff(attempt)
}

// failed settles a handling that did not succeed as the policy decides:
// a permanent failure or a last attempt is dead-lettered; any other
// attempt is tried again after a back-off (a requeue, or a copy on a
// classic queue). A Permanent failure is no failed attempt in the counts.
// cause is never nil (a nil is OK: acknowledged by the caller).
func (m *Module) failed(src source, d amqp.Delivery, eventType string, attempt int, cause error) {
	if c, ok := isCrash(cause); ok && src.lane == nil {
		m.crashed(src, d, eventType, attempt, c)
		return
	}
	o := execute.Of(cause)
	switch o {
	case execute.Failed:
		m.node.stats.failed.Add(1)
		m.from(d).failed.Add(1)
	case execute.Conflict: // the handler's inbox found it, not the node's record: counted as one
		m.node.stats.conflicts.Add(1)
		m.from(d).conflicts.Add(1)
	}
	v := m.retryPolicy(src.quorum).decide(o, attempt)
	switch {
	case v.settle == settleDead:
		m.deadLetter(src, d, eventType, attempt, v.reason, cause)
		return
	case src.lane != nil:
		// An ordered partition's: tried again in its lane, its key's
		// later events waiting behind it.
		m.warnFailed("handler failed; will retry, holding its key's later events", eventType, d.MessageId, attempt, v.delay, cause)
		src.lane.retry(v.delay)
		return
	case v.settle == settleSchedule:
		m.warnFailed("handler failed; its retry is scheduled", eventType, d.MessageId, attempt, v.delay, cause)
		m.scheduleRetry(src, d, eventType, attempt, v.delay, -1)
		return
	}
	m.warnFailed("handler failed; will retry", eventType, d.MessageId, attempt, v.delay, cause)
	m.later(v.delay, func() {
		if v.settle == settleRequeue {
			if err := src.reject(d); err != nil {
				m.log.Warn("requeue failed; the event returns when the channel closes", "err", err)
			}
			return
		}
		m.copyBack(src, d, eventType, attempt, -1)
	})
}

// scheduleRetry acknowledges d once a copy of it, carrying the attempts
// made, is confirmed into the delay cascade, due back in the module's
// queue after delay (the node's mover puts it there: delays.go). Until the
// copy is confirmed d stays unacknowledged; if the copy cannot be made, d
// goes back to its queue as a held retry would, after the delay's first
// step. The copy is the node's, as copyBack's is.
func (m *Module) scheduleRetry(src source, d amqp.Delivery, eventType string, attempts int, delay time.Duration, suspect int) {
	o, _ := m.node.originOf(d)
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = m.node.userID
	msg.Expiration = "" // an event's TTL does not end its retry's wait
	msg.Headers[wire.HeaderAttempt] = int64(attempts)
	msg.Headers[wire.HeaderUserID] = o.userID
	msg.Headers[headerDelayQueue] = src.copiesTo()
	if suspect >= 0 {
		msg.Headers[wire.HeaderSuspect] = int64(suspect)
	}
	delayedPublishing(&msg, eventType, time.Now().Add(delay))
	s, ok := m.liveSession(d)
	if !ok {
		return // the delivery's channel is gone: the broker delivers it again
	}
	exchange, key := m.node.route(eventType, time.Now().Add(delay), time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.node.publishConfirmed(ctx, s, exchange, key, msg); err != nil {
		retryIn := m.node.backoff(attempts)
		m.log.Warn("scheduling a retry failed; the event goes back to its queue", "event_id", d.MessageId, "err", err, "retry_in", retryIn)
		m.later(retryIn, func() { _ = src.reject(d) })
		return
	}
	m.node.stats.retriesScheduled.Add(1)
	source, _ := d.Headers[wire.HeaderSource].(string)
	m.node.writeDown(schedbook.Entry{ID: d.MessageId, Type: eventType, Source: source, Due: time.Now().Add(delay), Scheduled: time.Now(),
		Queue: src.copiesTo(), Attempts: attempts})
	if err := src.ack(d); err != nil {
		m.log.Warn("ack after scheduling a retry failed; the event may be handled an extra time", "err", err)
	}
	if src.acks != nil {
		if err := src.acks.flush(); err != nil {
			m.log.Warn("ack after scheduling a retry failed; the event may be handled an extra time", "err", err)
		}
	}
}

// copyBack puts a copy of d at the back of its queue with the attempts
// made so far (a classic queue's retry; on either queue type, an event
// that was in flight when its module process exited, marked a suspect with
// the times the process exited handling it alone, unless suspect < 0:
// isolation.go), then acknowledges d. Until the copy is confirmed d
// stays unacknowledged, so nothing is lost if either step fails. The copy
// is the node's: published as its broker user (the broker checks it),
// with the type in x-mesh-routing-key and the original publisher's user
// in x-mesh-user-id, which the node honours on its own copies only
// (owned.go).
func (m *Module) copyBack(src source, d amqp.Delivery, eventType string, attempts, suspect int) {
	o, _ := m.node.originOf(d)
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = m.node.userID
	msg.Headers[wire.HeaderAttempt] = int64(attempts)
	msg.Headers[wire.HeaderRoutingKey] = eventType
	msg.Headers[wire.HeaderUserID] = o.userID
	if suspect >= 0 {
		msg.Headers[wire.HeaderSuspect] = int64(suspect)
	}
	s, ok := m.liveSession(d)
	if !ok {
		return // the delivery's channel is gone: the broker delivers it again
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.pub.publish(ctx, "", src.copiesTo(), msg); err != nil {
		m.log.Warn("requeue failed; the event will be delivered again", "err", err)
		_ = src.reject(d)
		return
	}
	if err := src.ack(d); err != nil {
		m.log.Warn("ack after requeue failed; the event may be handled twice", "err", err)
	}
	// Settled outside any worker (a scheduled retry): sent now, not
	// with the next delivery.
	if src.acks != nil {
		if err := src.acks.flush(); err != nil {
			m.log.Warn("ack after requeue failed; the event may be handled twice", "err", err)
		}
	}
}

// deadLetter publishes d to the dead-letter exchange with its original
// routing key, id, headers and body plus why, where and after how many
// attempts, waits for the confirm, then acknowledges d. The dead letter is
// the node's: published as its broker user (the broker checks it, so the
// dead letter says which node's user made it), with the event type as its
// routing key, only the runtime headers the node sets (none carried over
// from d, which may have come with forged ones), and the original
// publisher's user in x-mesh-user-id.
func (m *Module) deadLetter(src source, d amqp.Delivery, eventType string, attempts int, reason string, cause error) {
	o, _ := m.node.originOf(d)
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = m.node.userID
	msg.Headers[wire.HeaderUserID] = o.userID
	msg.Headers[wire.HeaderDeadQueue] = src.queue
	msg.Headers[wire.HeaderDeadAttempts] = int64(attempts)
	msg.Headers[wire.HeaderDeadReason] = reason
	msg.Headers[wire.HeaderDeadError] = truncateText(cause.Error(), 4096)
	msg.Headers[wire.HeaderDeadTime] = time.Now().UTC().Format(time.RFC3339Nano)
	key := eventType
	if len(key) > wire.MaxNameBytes {
		key = d.RoutingKey // an x-mesh-routing-key too long for a type; the broker's own key always fits
	}
	s, ok := m.liveSession(d)
	if !ok {
		return // the delivery's channel is gone: the broker delivers it again
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.pub.publish(ctx, wire.ExchangeDead, key, msg); err != nil {
		delay := m.node.backoff(attempts)
		m.log.Error("dead-lettering failed; the event goes back to the queue", "err", err, "retry_in", delay)
		m.later(delay, func() { _ = src.reject(d) })
		return
	}
	m.node.stats.deadLettered.Add(1)
	m.from(d).deadLettered.Add(1)
	m.log.Warn("event dead-lettered", append([]any{"event_type", eventType, "event_id", d.MessageId, "reason", reason, "attempts", attempts, "err", cause}, panicStack(cause)...)...)
	if err := src.ack(d); err != nil {
		m.log.Warn("ack after dead-lettering failed; the event may be dead-lettered twice", "err", err)
	}
}

// liveSession returns the session to republish d on (to the dead letters,
// or back to a classic queue), if d's channel is still open: a delivery
// whose channel closed is back in its queue and must not be copied.
func (m *Module) liveSession(d amqp.Delivery) (*session, bool) {
	if ch, ok := d.Acknowledger.(*amqp.Channel); ok && ch.IsClosed() {
		return nil, false
	}
	s := m.node.session()
	return s, s != nil
}

// record records id as handled (in memory at once; on disk with the next
// flush of d's acker, before its ack: writeRecords), trying again with
// back-off while it cannot: the delivery d is acknowledged only once its
// id is recorded, so a record that failed never leaves an acked event
// that a redelivery would run again. It gives up, unrecorded and unacked,
// when d's channel closes (the broker delivers it again).
func (m *Module) record(d amqp.Delivery, id string, digest uint64) bool {
	for attempt := 1; ; attempt++ {
		err := m.dedup.Add(id, digest)
		if hook := m.node.hook().record; hook != nil {
			err = hook(id, err)
		}
		if err == nil {
			return true
		}
		if ch, ok := d.Acknowledger.(*amqp.Channel); ok && ch.IsClosed() {
			return false
		}
		delay := expBackoff(100*time.Millisecond, 5*time.Second, attempt)
		m.log.Error("could not record the event as handled; its ack waits until it is recorded", "event_id", id, "err", err, "attempt", attempt, "retry_in", delay)
		time.Sleep(delay)
	}
}

// writeRecords writes down the ids recorded as handled since the last
// write (dedup.Set.Add), with one write: an acker calls it before it sends
// acks, so that no delivery is acknowledged before its record is on disk
// (docs/adr/0036-what-the-mesh-costs-the-broker.md).
func (m *Module) writeRecords() error {
	err := m.dedup.Flush()
	if hook := m.node.hook().writeRecords; hook != nil {
		err = hook(err)
	}
	return err
}

// later runs f after delay unless the module stops first.
func (m *Module) later(delay time.Duration, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return // the event returns to the queue when the channel closes
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		m.mu.Lock()
		_, live := m.retries[t]
		delete(m.retries, t)
		m.mu.Unlock()
		if live {
			f()
		}
	})
	m.retries[t] = struct{}{}
}
