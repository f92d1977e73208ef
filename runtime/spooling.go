package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/spool"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// How an emit the broker refuses (a negative confirm) is tried again: from
// refusedRetryMin, doubling up to refusedRetryMax, until the emit's
// deadline (EmitTimeout when its context has none).
const (
	refusedRetryMin = 20 * time.Millisecond
	refusedRetryMax = 2 * time.Second
	drainBatch      = 256
)

// publishEvent sends an emitted event. While the node is connected and
// its spool is empty it goes straight to the broker and returns once
// confirmed. Otherwise, or when the connection drops before the confirm,
// it is appended to the spool and returns once that is on disk: the event
// is then resent, in order, after the reconnect. So an emit never
// succeeds for an event that is neither confirmed nor on local disk.
func (n *Node) publishEvent(ctx context.Context, key string, msg amqp.Publishing) error {
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
			err = n.publishConfirmed(ctx, s, wire.ExchangeEvents, key, msg)
		}
		if errors.Is(err, errBlocked) {
			n.stats.backPressure.Add(1)
			return fmt.Errorf("%w: %w, and this node has no spool", sdk.ErrBackPressure, err)
		}
		return err
	}
	if s := n.session(); s != nil && !n.spooling.Load() && !s.isBlocked() {
		err := n.publishConfirmed(ctx, s, wire.ExchangeEvents, key, msg)
		if errors.Is(err, errBlocked) {
			// The broker blocked publishing before it confirmed: kept on
			// disk, the event goes again after the alarm (a copy that did
			// arrive is absorbed by the consumers' de-duplication).
			return n.spoolEvent(key, msg)
		}
		if !errors.Is(err, sdk.ErrConnectionLost) {
			if err == nil {
				n.stats.emitted.Add(1)
			}
			return err
		}
		n.log.Debug("connection lost before the confirm; spooling the event", "event_id", msg.MessageId)
	}
	return n.spoolEvent(key, msg)
}

// publishConfirmed publishes msg on s and waits for its confirm. A
// negative confirm (a queue at its length limit with overflow
// reject-publish) is logged, counted and tried again with back-off until
// ctx is done; it is never taken as sent. A lost connection gives an error
// wrapping sdk.ErrConnectionLost.
func (n *Node) publishConfirmed(ctx context.Context, s *session, exchange, key string, msg amqp.Publishing) error {
	for attempt := 1; ; attempt++ {
		err := s.pub.publishUnlessBlocked(ctx, s.whenBlocked(), exchange, key, msg)
		if !errors.Is(err, sdk.ErrRefused) || errors.Is(err, errUnroutable) {
			return err
		}
		n.stats.refused.Add(1)
		delay := jitter(expBackoff(refusedRetryMin, refusedRetryMax, attempt))
		n.logRefused(key, attempt, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return fmt.Errorf("%w %d times (is a queue bound to it at its length limit, with overflow reject-publish?); gave up: %w",
				sdk.ErrRefused, attempt, ctx.Err())
		}
		if s.isLost() {
			return fmt.Errorf("retry a refused publish: %w", sdk.ErrConnectionLost)
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
	ID       string            `json:"id"`
	Headers  map[string]string `json:"h"`
	Time     time.Time         `json:"t"`
	Expires  time.Time         `json:"x,omitzero"`
	Priority uint8             `json:"p,omitempty"`
	Body     []byte            `json:"b"` // base64: the body's bytes as emitted, not re-encoded
}

// spoolEvent appends an event to the spool, durably, and wakes the
// resend.
func (n *Node) spoolEvent(key string, msg amqp.Publishing) error {
	rec := spooledEvent{Key: key, ID: msg.MessageId, Headers: make(map[string]string, len(msg.Headers)),
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
			sdk.ErrBackPressure, n.spool.Len(), n.spool.Bytes(), n.cfg.SpoolMaxBytes, err)
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
// the broker again), the session is lost or the node closes. A refused
// event is tried again with back-off before anything after it.
//
// Under a steady stream of emits the spool would never be seen empty, so
// the last batch is sent with new appends held back (they wait a few
// milliseconds); the spool then empties and the fast path returns.
func (n *Node) drain(s *session) {
	refusals := 0
	for !s.isLost() && !n.isClosing() && !s.isBlocked() {
		recs, err := n.spool.Oldest(drainBatch)
		if err != nil {
			n.log.Error("read the spool", "err", err)
			return
		}
		locked := len(recs) < drainBatch
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
		}
		done, refused := n.resend(s, recs)
		delErr := n.spool.Delete(done...)
		if locked {
			if delErr == nil && n.spool.Len() == 0 {
				n.spooling.Store(false)
			}
			n.spoolGate.Unlock()
		}
		if delErr != nil {
			n.log.Error("delete resent events from the spool; they will be sent again", "err", delErr)
			return
		}
		if !n.spooling.Load() {
			return
		}
		if refused {
			refusals++
			delay := jitter(expBackoff(refusedRetryMin, refusedRetryMax, refusals))
			n.logRefused("(spooled)", refusals, delay)
			select {
			case <-time.After(delay):
			case <-s.lost:
			case <-n.closing:
			}
			continue
		}
		refusals = 0
	}
}

// resend publishes recs in order on s and returns the sequence numbers
// that are done with (confirmed, expired or undecodable) and whether the
// broker refused one; it stops at the first event not confirmed, so
// nothing overtakes it.
func (n *Node) resend(s *session, recs []spool.Record) (done []uint64, refused bool) {
	type sent struct {
		seq uint64
		dc  *amqp.DeferredConfirmation
		id  string
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
		dc, err := s.pub.ch.PublishWithDeferredConfirm(wire.ExchangeEvents, ev.Key, true, false, msg)
		if err != nil {
			break // the channel is gone: the rest waits for the next session
		}
		batch = append(batch, sent{seq: r.Seq, dc: dc, id: ev.ID})
	}
	blocked := s.whenBlocked()
	for _, b := range batch {
		select {
		case <-b.dc.Done():
		case <-s.lost:
			return done, false
		case <-n.closing: // what is not deleted is sent again on the next start
			return done, false
		case <-blocked:
			// No confirm comes while the broker blocks publishing: stop
			// waiting (and holding new emits back); what was sent but not
			// confirmed stays in the spool and goes again after the alarm
			// (the consumers' de-duplication absorbs a second copy).
			return done, false
		}
		if !b.dc.Acked() {
			if s.pub.ch.IsClosed() {
				return done, false
			}
			n.stats.refused.Add(1)
			return done, true
		}
		if s.pub.wasReturned(b.id) {
			n.log.Warn("a resent event was unroutable and not kept by the broker", "event_id", b.id)
		}
		n.stats.resent.Add(1)
		done = append(done, b.seq)
	}
	return done, false
}

// counters are the node's running totals; Stats reads them.
type counters struct {
	emitted, spooled, resent, refused, expired, backPressure atomic.Uint64
	blocks, serverChecks                                     atomic.Uint64
	disconnects, reconnects                                  atomic.Uint64
	handled, failed, deadLettered, duplicates                atomic.Uint64
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
	// Emitted counts events confirmed by the broker when first sent.
	Emitted uint64
	// Spooled counts events written to the spool; Resent those sent from
	// it and confirmed; Expired those whose TTL passed in it.
	Spooled, Resent, Expired uint64
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
}

// Stats returns the node's counters now.
func (n *Node) Stats() Stats {
	st := Stats{
		Connected:    n.Connected(),
		Blocked:      n.Blocked(),
		Blocks:       n.stats.blocks.Load(),
		ServerChecks: n.stats.serverChecks.Load(),
		Disconnects:  n.stats.disconnects.Load(),
		Reconnects:   n.stats.reconnects.Load(),
		Emitted:      n.stats.emitted.Load(),
		Spooled:      n.stats.spooled.Load(),
		Resent:       n.stats.resent.Load(),
		Expired:      n.stats.expired.Load(),
		Refused:      n.stats.refused.Load(),
		BackPressure: n.stats.backPressure.Load(),
		Handled:      n.stats.handled.Load(),
		Failed:       n.stats.failed.Load(),
		DeadLettered: n.stats.deadLettered.Load(),
		Duplicates:   n.stats.duplicates.Load(),
	}
	if n.spool != nil {
		st.SpoolEvents, st.SpoolBytes = n.spool.Len(), n.spool.Bytes()
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
