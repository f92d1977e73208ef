package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/spool"
	"github.com/meshkit/mesh/internal/wire"
)

// How an emit the broker refuses (a negative confirm) is tried again: from
// refusedRetryMin, doubling up to refusedRetryMax, until the emit's
// deadline (EmitTimeout when its context has none).
const (
	refusedRetryMin = 20 * time.Millisecond
	refusedRetryMax = 2 * time.Second
	drainBatch      = 256
	// gateHold bounds how long the drain holds new appends back while
	// the spool's last batch waits for its confirms: past it, emits are
	// appended again (after the batch, so in order), whatever the broker
	// does with the confirms.
	gateHold = 100 * time.Millisecond
)

// publishEvent sends an emitted event of type key, due at due (zero: now;
// else it goes through the delay cascade: route). While the node is connected and
// its spool is empty it goes straight to the broker and returns once
// confirmed. Otherwise, or when the connection drops before the confirm,
// it is appended to the spool and returns once that is on disk: the event
// is then resent, in order, after the reconnect. So an emit never
// succeeds for an event that is neither confirmed nor on local disk.
func (n *Node) publishEvent(ctx context.Context, key string, due time.Time, msg amqp.Publishing) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.EmitTimeout)
		defer cancel()
	}
	if n.spool == nil { // ephemeral: no spool, confirmed or failed
		s, err := n.awaitSession(ctx)
		if err != nil {
			return err
		}
		err = errBlocked
		if !s.isBlocked() {
			exchange, rk := n.route(key, due, time.Now())
			err = n.publishConfirmed(ctx, s, exchange, rk, msg)
		}
		if errors.Is(err, errBlocked) {
			n.stats.backPressure.Add(1)
			return fmt.Errorf("%w: %w, and this node has no spool", wire.ErrBackPressure, err)
		}
		return err
	}
	if s := n.session(); s != nil && !n.spooling.Load() && !s.isBlocked() {
		exchange, rk := n.route(key, due, time.Now())
		err := n.publishConfirmed(ctx, s, exchange, rk, msg)
		if errors.Is(err, errBlocked) {
			// The broker blocked publishing before it confirmed: kept on
			// disk, the event goes again after the alarm (a copy that did
			// arrive is absorbed by the consumers' de-duplication).
			return n.spoolEvent(key, due, msg)
		}
		if !errors.Is(err, wire.ErrConnectionLost) {
			if err == nil {
				n.countEmitted(due)
			}
			return err
		}
		n.log.Debug("connection lost before the confirm; spooling the event", "event_id", msg.MessageId)
	}
	return n.spoolEvent(key, due, msg)
}

// publishAtMostOnce sends an event emitted at most once (sdk.AtMostOnce):
// on the current session, without waiting for its confirm, never spooled.
// With no session, or while the broker blocks publishing, it fails at
// once: the event is not sent.
func (n *Node) publishAtMostOnce(key string, msg amqp.Publishing) error {
	s := n.session()
	switch {
	case s == nil:
		return fmt.Errorf("%w: not connected, and an event emitted at most once is not spooled", wire.ErrConnectionLost)
	case s.isBlocked():
		n.stats.backPressure.Add(1)
		return fmt.Errorf("%w: %w; an event emitted at most once is not spooled", wire.ErrBackPressure, errBlocked)
	}
	// Not mandatory: mesh.events' alternate exchange keeps what no queue
	// takes, and no return is waited for.
	if err := s.pub.ch.Publish(wire.ExchangeEvents, key, false, false, msg); err != nil {
		return fmt.Errorf("publish to %s with key %q: %w", wire.ExchangeEvents, key, errors.Join(s.pub.closedErr(), err))
	}
	n.stats.atMostOnce.Add(1)
	return nil
}

// countEmitted counts an event the broker confirmed when first sent, as
// scheduled if it was due later.
func (n *Node) countEmitted(due time.Time) {
	n.stats.emitted.Add(1)
	if !due.IsZero() {
		n.stats.scheduled.Add(1)
	}
}

// route is where an event of type eventType due at due goes when sent at
// now: to mesh.events with its type when it is not delayed (due is zero),
// else into the delay cascade with the seconds left, rounded up (0 once
// due has passed, as for a spooled event resent late: the cascade hands it
// straight to the mover), to come due in the queue of the node that
// delivers it (dueNode).
func (n *Node) route(eventType string, due, now time.Time) (exchange, key string) {
	if due.IsZero() {
		return wire.ExchangeEvents, eventType
	}
	secs, err := delay.Seconds(due.Sub(now))
	if err != nil { // checked at emit (EmitOptions.CheckDue); a clock set back since
		secs, _ = delay.Seconds(delay.Max)
	}
	return delay.ExchangeIn, delay.RoutingKey(secs, n.dueNode())
}

// publishConfirmed publishes msg on s and waits for its confirm. A
// negative confirm (a queue at its length limit with overflow
// reject-publish) is logged, counted and tried again with back-off until
// ctx is done; it is never taken as sent. A lost connection gives an error
// wrapping wire.ErrConnectionLost.
func (n *Node) publishConfirmed(ctx context.Context, s *session, exchange, key string, msg amqp.Publishing) error {
	for attempt := 1; ; attempt++ {
		err := s.pub.publishUnlessBlocked(ctx, s.whenBlocked(), exchange, key, msg)
		if !errors.Is(err, wire.ErrRefused) || errors.Is(err, errUnroutable) {
			return err
		}
		n.stats.refused.Add(1)
		delay := jitter(expBackoff(refusedRetryMin, refusedRetryMax, attempt))
		n.logRefused(key, attempt, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return fmt.Errorf("%w %d times (is a queue bound to it at its length limit, with overflow reject-publish?); gave up: %w",
				wire.ErrRefused, attempt, ctx.Err())
		}
		if s.isLost() {
			return fmt.Errorf("retry a refused publish: %w", wire.ErrConnectionLost)
		}
	}
}

// logRefused warns about refused publishes, at most once a second.
func (n *Node) logRefused(key string, attempt int, delay time.Duration) {
	now := time.Now().UnixNano()
	last := n.stats.lastRefusedLog.Load()
	if now-last < int64(time.Second) || !n.stats.lastRefusedLog.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn("the broker refused an event (negative confirm); retrying with back-off",
		"event_type", key, "attempt", attempt, "retry_in", delay, "refused_total", n.stats.refused.Load())
}

// spooledEvent is how an event is kept in the spool. Headers are the
// event contract's, all strings; Expires is absolute so that a TTL keeps
// counting while the event waits.
type spooledEvent struct {
	Key      string            `json:"k"`
	Due      time.Time         `json:"d,omitzero"` // a delayed event's due time (route)
	ID       string            `json:"id"`
	Headers  map[string]string `json:"h"`
	Time     time.Time         `json:"t"`
	Expires  time.Time         `json:"x,omitzero"`
	Priority uint8             `json:"p,omitempty"`
	Body     []byte            `json:"b"` // base64: the body's bytes as emitted, not re-encoded
}

// spoolEvent appends an event to the spool, durably, and wakes the
// resend.
func (n *Node) spoolEvent(key string, due time.Time, msg amqp.Publishing) error {
	rec := spooledEvent{Key: key, Due: due, ID: msg.MessageId, Headers: make(map[string]string, len(msg.Headers)),
		Time: msg.Timestamp, Priority: msg.Priority, Body: msg.Body}
	for k, v := range msg.Headers {
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("spool: header %s is a %T, not a string", k, v)
		}
		rec.Headers[k] = str
	}
	if msg.Expiration != "" {
		ms, err := strconv.ParseInt(msg.Expiration, 10, 64)
		if err != nil {
			return fmt.Errorf("spool: expiration %q: %w", msg.Expiration, err)
		}
		rec.Expires = time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	n.spoolGate.RLock()
	_, err = n.spool.Append(data)
	if err == nil {
		n.spooling.Store(true)
	}
	n.spoolGate.RUnlock()
	switch {
	case errors.Is(err, spool.ErrFull):
		n.stats.backPressure.Add(1)
		return fmt.Errorf("%w: the broker is unreachable or slow to confirm and the spool holds %d events (%d bytes; spool_max_bytes is %d): %w",
			wire.ErrBackPressure, n.spool.Len(), n.spool.Bytes(), n.cfg.SpoolMaxBytes, err)
	case err != nil:
		return fmt.Errorf("spool: %w", err)
	}
	n.stats.spooled.Add(1)
	n.kickDrain()
	return nil
}

func (n *Node) kickDrain() {
	select {
	case n.drainKick <- struct{}{}:
	default:
	}
}

// drainLoop resends the spool whenever it is kicked (after an append or a
// reconnect) and the node is connected, until the node closes.
func (n *Node) drainLoop() {
	defer close(n.drained)
	for {
		select {
		case <-n.drainKick:
		case <-n.closing:
			return
		}
		if s := n.session(); s != nil && n.spooling.Load() && !s.isBlocked() {
			n.drain(s) // kicked again when the alarm clears
		}
	}
}

// drain resends the spool, oldest first, in batches published in order
// and deleted once confirmed, until it is empty (emits then go straight to
// the broker again), the session is lost or the node closes.
//
// An event the broker refuses (a negative confirm) is tried again with
// back-off before anything after it, as a direct emit is, for up to
// EmitTimeout from its first refusal; past that it is moved to the dead
// letters with reason "refused" and the events behind it go on (ADR 16).
// An event the broker returns (unroutable even by mesh.events' alternate
// exchange) is put in mesh.unrouted, as a direct emit with no queue bound
// for it would be.
//
// Under a steady stream of emits the spool would never be seen empty, so
// the last batch is sent with new appends held back (they wait a few
// milliseconds); the spool then empties and the fast path returns.
func (n *Node) drain(s *session) {
	refusals, lateRounds := 0, 0
	refusedAt := make(map[uint64]time.Time) // spooled events the broker refused, and when it first did
	var stuck *stuckEvent                   // the oldest of them, tried again alone
	for !s.isLost() && !n.isClosing() && !s.isBlocked() {
		recs, err := n.spool.Oldest(drainBatch)
		if err != nil {
			n.log.Error("read the spool", "err", err)
			return
		}
		locked := len(recs) < drainBatch
		var release *time.Timer
		var unlock sync.Once
		if locked {
			n.spoolGate.Lock()
			if recs, err = n.spool.Oldest(drainBatch); err != nil {
				n.spoolGate.Unlock()
				n.log.Error("read the spool", "err", err)
				return
			}
			if len(recs) == 0 {
				n.spooling.Store(false)
				n.spoolGate.Unlock()
				return
			}
			// Held back for gateHold at most: a confirm the broker
			// withholds (a quorum queue without a majority) must not hold
			// the node's emits.
			release = time.AfterFunc(gateHold, func() { unlock.Do(n.spoolGate.Unlock) })
		}
		if stuck != nil && recs[0].Seq == stuck.seq {
			recs = recs[:1] // what is behind it has been sent once already
		}
		done, refused, late := n.resend(s, recs)
		if locked && !release.Stop() {
			// The timer fired: the gate is released, by it or (if its
			// function has not run yet) here; appends went on meanwhile,
			// so the spool is not seen empty now.
			unlock.Do(n.spoolGate.Unlock)
			locked = false
		}
		delErr := n.spool.Delete(done...)
		if locked {
			if delErr == nil && n.spool.Len() == 0 {
				n.spooling.Store(false)
			}
			unlock.Do(n.spoolGate.Unlock)
		}
		if delErr != nil {
			n.log.Error("delete resent events from the spool; they will be sent again", "err", delErr)
			return
		}
		for _, seq := range done {
			delete(refusedAt, seq)
		}
		now := time.Now()
		for _, e := range refused {
			if _, ok := refusedAt[e.seq]; !ok {
				refusedAt[e.seq] = now
			}
		}
		if late {
			// Confirms withheld for EmitTimeout: what was not confirmed
			// stays in the spool and is sent again, after a back-off that
			// grows to minutes, so a long outage of a queue's majority
			// does not fill it with copies.
			lateRounds++
			delay := jitter(expBackoff(n.cfg.EmitTimeout, 5*time.Minute, lateRounds))
			n.log.Warn("the broker has not confirmed spooled events for emit_timeout; sending them again", "events", len(recs)-len(done), "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-s.lost:
			case <-n.closing:
			}
			continue
		}
		lateRounds = 0
		if len(refused) == 0 {
			stuck, refusals = nil, 0
			if !n.spooling.Load() {
				return
			}
			continue
		}
		if stuck == nil || stuck.seq != refused[0].seq {
			refusals = 0
		}
		stuck = &refused[0]
		if since := now.Sub(refusedAt[stuck.seq]); since >= n.cfg.EmitTimeout && n.giveUpSpooled(s, stuck, since) {
			delete(refusedAt, stuck.seq)
			stuck, refusals = nil, 0
			continue
		}
		refusals++
		delay := jitter(expBackoff(refusedRetryMin, refusedRetryMax, refusals))
		n.logRefused("(spooled) "+stuck.key, refusals, delay)
		select {
		case <-time.After(delay):
		case <-s.lost:
		case <-n.closing:
		}
	}
}

// stuckEvent is a spooled event the broker would not take: it refused it,
// or returned it and mesh.unrouted would not keep it either.
type stuckEvent struct {
	seq uint64
	key string
	msg amqp.Publishing
	why error
}

// giveUpSpooled moves a spooled event the broker has refused for the
// whole of EmitTimeout to the dead letters, with reason "refused", and
// deletes it from the spool. It reports whether it did; if the dead
// letter could not be published either, the event stays and is tried
// again.
func (n *Node) giveUpSpooled(s *session, e *stuckEvent, since time.Duration) bool {
	msg := e.msg
	msg.Headers = maps.Clone(e.msg.Headers)
	msg.Expiration = "" // a dead letter is kept until someone looks
	// The node emitted it and dead-letters it, as its broker user, like
	// every dead letter the runtime makes (original user in x-mesh-user-id).
	msg.Headers[wire.HeaderUserID] = msg.UserId
	msg.UserId = n.userID
	msg.Headers[wire.HeaderDeadReason] = wire.DeadReasonRefused
	msg.Headers[wire.HeaderDeadAttempts] = int64(1)
	msg.Headers[wire.HeaderDeadError] = truncateText(fmt.Sprintf("node %s gave up resending it from its spool after %v: %v",
		n.cfg.Node, since.Round(time.Millisecond), e.why), 4096)
	msg.Headers[wire.HeaderDeadTime] = time.Now().UTC().Format(time.RFC3339Nano)
	ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
	defer cancel()
	if err := s.pub.publishUnlessBlocked(ctx, s.whenBlocked(), wire.ExchangeDead, e.key, msg); err != nil {
		n.log.Error("a spooled event the broker keeps refusing could not be dead-lettered either; it stays in the spool",
			"event_id", msg.MessageId, "event_type", e.key, "err", err)
		return false
	}
	if err := n.spool.Delete(e.seq); err != nil {
		// Sent again later: a second dead letter, or a late delivery the
		// consumers' de-duplication absorbs.
		n.log.Error("delete a dead-lettered event from the spool", "event_id", msg.MessageId, "err", err)
		return false
	}
	n.stats.spoolDeadLettered.Add(1)
	n.log.Error("the broker refused a spooled event until emit_timeout; it is in the dead letters (reason refused) and the events behind it go on",
		"event_id", msg.MessageId, "event_type", e.key, "refused_for", since.Round(time.Millisecond), "err", e.why)
	return true
}

// keepUnrouted puts an event the broker returned (no queue and no
// alternate exchange would take it) straight into mesh.unrouted, with its
// routing key in x-mesh-routing-key, where the unrouted tooling and
// replays read it. They honour the header because the event came through
// the default exchange with a user-id, the node's (msg is one the node
// resent as itself); on one that came through mesh.events they take the
// routing key, whatever its headers say (deadletters.Message.Type).
func (n *Node) keepUnrouted(s *session, key string, msg amqp.Publishing) error {
	msg.Headers = maps.Clone(msg.Headers)
	msg.Headers[wire.HeaderRoutingKey] = key
	ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
	defer cancel()
	if err := s.pub.publishUnlessBlocked(ctx, s.whenBlocked(), "", wire.QueueUnrouted, msg); err != nil {
		return fmt.Errorf("the broker returned it as unroutable, and it could not be kept in %s either: %w", wire.QueueUnrouted, err)
	}
	n.stats.spoolUnrouted.Add(1)
	n.log.Warn("a resent event was returned as unroutable (is mesh.events' alternate exchange missing?); it is kept in "+wire.QueueUnrouted,
		"event_id", msg.MessageId, "event_type", key)
	return nil
}

// resend publishes recs in order on s and returns the sequence numbers
// that are done with (confirmed, kept in mesh.unrouted, expired or
// undecodable) and, in spool order, the events the broker would not take;
// those stay in the spool. It waits for every confirm of the batch, so an
// event confirmed behind a refused one is not sent twice.
func (n *Node) resend(s *session, recs []spool.Record) (done []uint64, refused []stuckEvent, late bool) {
	type sent struct {
		seq      uint64
		dc       *amqp.DeferredConfirmation
		exchange string // mesh.events, or the delay cascade for a delayed event
		key      string // the event type
		rk       string // the routing key it was published with (the type, or a delay's)
		msg      amqp.Publishing
		due      time.Time
	}
	var batch []sent
	for _, r := range recs {
		var ev spooledEvent
		if err := json.Unmarshal(r.Data, &ev); err != nil {
			n.log.Error("dropping an undecodable spool record", "seq", r.Seq, "err", err)
			done = append(done, r.Seq)
			continue
		}
		msg := amqp.Publishing{
			Headers:      make(amqp.Table, len(ev.Headers)),
			ContentType:  wire.ContentTypeJSON,
			DeliveryMode: amqp.Persistent,
			UserId:       n.userID, // this connection's user: the broker checks it
			MessageId:    ev.ID,
			Timestamp:    ev.Time,
			Priority:     ev.Priority,
			Body:         ev.Body,
		}
		for k, v := range ev.Headers {
			msg.Headers[k] = v
		}
		if !ev.Expires.IsZero() {
			left := time.Until(ev.Expires)
			if left <= 0 {
				n.stats.expired.Add(1)
				n.log.Warn("a spooled event expired (its TTL passed) before it could be resent", "event_id", ev.ID, "event_type", ev.Key)
				done = append(done, r.Seq)
				continue
			}
			msg.Expiration = strconv.FormatInt(max(left.Milliseconds(), 1), 10)
		}
		due := ev.Due
		if !due.IsZero() && !n.delaysOn() {
			// Spooled while the node could not know its delays would be
			// off (it started without the broker, or its config changed):
			// the cascade would refuse it, closing the channel, at every
			// resend. One not due yet is dead-lettered now, saying why; one
			// due already goes as it is.
			if time.Now().Before(due) {
				e := stuckEvent{seq: r.Seq, key: ev.Key, msg: msg, why: fmt.Errorf("it is delayed until %s, and delays are off on this node (%v)",
					due.UTC().Format(time.RFC3339), n.delaysOffReason())}
				if !n.giveUpSpooled(s, &e, 0) {
					refused = append(refused, e)
				}
				continue
			}
			due = time.Time{}
		}
		exchange, key := n.route(ev.Key, due, time.Now())
		dc, err := s.pub.ch.PublishWithDeferredConfirm(exchange, key, true, false, msg)
		if err != nil {
			break // the channel is gone: the rest waits for the next session
		}
		batch = append(batch, sent{seq: r.Seq, dc: dc, exchange: exchange, key: ev.Key, rk: key, msg: msg, due: due})
	}
	blocked := s.whenBlocked()
	if hook := n.hook().drainWaits; hook != nil && len(batch) > 0 {
		hook()
	}
	wait := time.NewTimer(n.cfg.EmitTimeout)
	defer wait.Stop()
	for _, b := range batch {
		select {
		case <-b.dc.Done():
		case <-s.lost:
			return done, refused, false
		case <-n.closing: // what is not deleted is sent again on the next start
			return done, refused, false
		case <-blocked:
			// No confirm comes while the broker blocks publishing: stop
			// waiting (and holding new emits back); what was sent but not
			// confirmed stays in the spool and goes again after the alarm
			// (the consumers' de-duplication absorbs a second copy).
			return done, refused, false
		case <-wait.C:
			// The wait for confirms is bounded too: what was not confirmed
			// goes again (a second copy is absorbed the same way).
			return done, refused, true
		}
		if !b.dc.Acked() {
			if s.pub.ch.IsClosed() {
				return done, refused, false
			}
			s.pub.confirmed(false, b.exchange, b.rk, b.msg)
			n.stats.refused.Add(1)
			refused = append(refused, stuckEvent{seq: b.seq, key: b.key, msg: b.msg,
				why: fmt.Errorf("%w (is a queue bound to it at its length limit, with overflow reject-publish?)", wire.ErrRefused)})
			continue
		}
		s.pub.confirmed(true, b.exchange, b.rk, b.msg)
		if s.pub.wasReturned(b.msg.MessageId) {
			if err := n.keepUnrouted(s, b.key, b.msg); err != nil {
				if s.isLost() || n.isClosing() {
					return done, refused, false
				}
				refused = append(refused, stuckEvent{seq: b.seq, key: b.key, msg: b.msg, why: err})
				continue
			}
		} else {
			n.stats.resent.Add(1)
			if !b.due.IsZero() {
				n.stats.scheduled.Add(1)
			}
		}
		done = append(done, b.seq)
	}
	return done, refused, false
}

// counters are the node's running totals; Stats reads them.
type counters struct {
	emitted, spooled, resent, refused, expired, backPressure atomic.Uint64
	scheduled, atMostOnce, delivered, retriesScheduled       atomic.Uint64
	delaysCancelled                                          atomic.Uint64
	delaysDropped                                            atomic.Uint64
	spoolDeadLettered, spoolUnrouted                         atomic.Uint64
	blocks, serverChecks                                     atomic.Uint64
	disconnects, reconnects, refusingChannels                atomic.Uint64
	handled, failed, deadLettered, duplicates, filtered      atomic.Uint64
	conflicts                                                atomic.Uint64
	consumersLost                                            atomic.Uint64
	heartbeatsSkipped                                        atomic.Uint64
	lastRefusedLog                                           atomic.Int64
}

// Stats is a snapshot of what a node has done since it started, for
// metrics and tests.
type Stats struct {
	// Connected says whether the node has its broker connections now.
	Connected bool
	// Blocked says whether the broker blocks the node's publishing now (a
	// memory or disk alarm); Blocks counts the times it did.
	Blocked bool
	Blocks  uint64
	// ServerChecks counts the times the node asked the broker whether a
	// tool has a server (a passive declare of its serve queue).
	ServerChecks uint64
	// Disconnects and Reconnects count lost and regained sessions.
	Disconnects, Reconnects uint64
	// RefusingChannels counts sessions made again because, just after a
	// failover, the broker refused every publish on their channel.
	RefusingChannels uint64
	// Emitted counts events confirmed by the broker when first sent.
	Emitted uint64
	// Scheduled counts delayed events (sdk.After, sdk.At) the broker
	// confirmed into the delay cascade, sent first or resent from the
	// spool; they are in Emitted or Resent too.
	Scheduled uint64
	// AtMostOnce counts events emitted at most once (sdk.AtMostOnce):
	// handed to the connection, never confirmed; not in Emitted.
	AtMostOnce uint64
	// DelaysDelivered counts delayed events this node's mover published
	// when due (its lateness is the metric mesh.delays.lateness), and the
	// retries it put back in module queues.
	DelaysDelivered uint64
	// RetriesScheduled counts failed events acknowledged once their retry
	// was confirmed into the delay cascade (ModuleConfig.Retry).
	RetriesScheduled uint64
	// DelaysCancelled counts delayed events that came due cancelled
	// (meshctl delayed cancel) and were dropped.
	DelaysCancelled uint64
	// HeartbeatsSkipped counts heartbeats the node did not send because
	// it was cut off from the broker or blocked by it (none is spooled to
	// arrive late).
	HeartbeatsSkipped uint64
	// DelaysDropped counts delayed events that came due from a module no
	// longer in the node's configuration or no longer granted their type
	// (Node.SetModules), and were set aside in the dead letters (reason
	// revoked) instead of delivered.
	DelaysDropped uint64
	// DelaysWaiting is what the node's book holds now: what it scheduled
	// (delayed events and retries) and has not delivered yet.
	DelaysWaiting int
	// Spooled counts events written to the spool; Resent those sent from
	// it and confirmed; Expired those whose TTL passed in it.
	Spooled, Resent, Expired uint64
	// SpoolDeadLettered counts spooled events the broker refused for the
	// whole of EmitTimeout, moved to the dead letters (reason refused);
	// SpoolUnrouted those it returned as unroutable, kept in mesh.unrouted.
	SpoolDeadLettered, SpoolUnrouted uint64
	// SpoolEvents and SpoolBytes are what the spool holds now.
	SpoolEvents int
	SpoolBytes  int64
	// Refused counts negative confirms from the broker (each retried).
	Refused uint64
	// BackPressure counts emits refused because the spool was full.
	BackPressure uint64
	// Handled counts events whose handler succeeded; Failed failed
	// attempts; DeadLettered events given up on.
	Handled, Failed, DeadLettered uint64
	// Duplicates counts deliveries acknowledged without running the
	// handler, because the module had handled the same event id.
	Duplicates uint64
	// Conflicts counts deliveries of a handled event id with other
	// content (wire.Digest): dead-lettered with reason conflict, not
	// handled.
	Conflicts uint64
	// Filtered counts deliveries acknowledged without running a handler,
	// because no filter of the handlers their type matches accepted them
	// (sdk.Filter).
	Filtered uint64
	// ConsumersLost counts consumers the broker dropped, or stopped
	// feeding, without telling the node (checkConsumers found them gone
	// or stalled), each consumed again.
	ConsumersLost uint64
}

// Stats returns the node's counters now.
func (n *Node) Stats() Stats {
	st := Stats{
		Connected:         n.Connected(),
		Blocked:           n.Blocked(),
		Blocks:            n.stats.blocks.Load(),
		ServerChecks:      n.stats.serverChecks.Load(),
		Disconnects:       n.stats.disconnects.Load(),
		Reconnects:        n.stats.reconnects.Load(),
		RefusingChannels:  n.stats.refusingChannels.Load(),
		Emitted:           n.stats.emitted.Load(),
		HeartbeatsSkipped: n.stats.heartbeatsSkipped.Load(),
		Scheduled:         n.stats.scheduled.Load(),
		AtMostOnce:        n.stats.atMostOnce.Load(),
		DelaysDelivered:   n.stats.delivered.Load(),
		RetriesScheduled:  n.stats.retriesScheduled.Load(),
		DelaysCancelled:   n.stats.delaysCancelled.Load(),
		DelaysDropped:     n.stats.delaysDropped.Load(),
		Spooled:           n.stats.spooled.Load(),
		Resent:            n.stats.resent.Load(),
		Expired:           n.stats.expired.Load(),
		SpoolDeadLettered: n.stats.spoolDeadLettered.Load(),
		SpoolUnrouted:     n.stats.spoolUnrouted.Load(),
		Refused:           n.stats.refused.Load(),
		BackPressure:      n.stats.backPressure.Load(),
		Handled:           n.stats.handled.Load(),
		Failed:            n.stats.failed.Load(),
		DeadLettered:      n.stats.deadLettered.Load(),
		Duplicates:        n.stats.duplicates.Load(),
		Conflicts:         n.stats.conflicts.Load(),
		Filtered:          n.stats.filtered.Load(),
		ConsumersLost:     n.stats.consumersLost.Load(),
	}
	if n.spool != nil {
		st.SpoolEvents, st.SpoolBytes = n.spool.Len(), n.spool.Bytes()
	}
	if n.book != nil {
		st.DelaysWaiting = n.book.Len()
	}
	return st
}

// Blocked reports whether the broker blocks the node's publishing
// connection now (a memory or disk alarm): emits are spooled, consuming
// goes on.
func (n *Node) Blocked() bool {
	s := n.session()
	return s != nil && s.isBlocked()
}
