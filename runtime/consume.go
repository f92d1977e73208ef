package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/cloudevents"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/filter"
	"github.com/meshkit/mesh/internal/setup"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// A module may consume existing broker queues that other systems fill
// (sdk.Mesh.Consume): the node consumes each passively on a channel of its
// own, never declaring, binding or deleting it, with the prefetch the
// module asked for and as many workers. Failed messages are retried and
// dead-lettered by the module's rules (attempts, back-off, mesh.events.dead
// naming the queue); a quorum queue counts attempts itself
// (x-delivery-count), any other gets a copy with x-mesh-attempt, as the
// module's own classic queue does. The runtime's own headers on a message
// count by the same rules as on a module's queue (owned.go): a message
// sent straight to the queue without a user-id that claims a type in
// x-mesh-routing-key is dead-lettered as malformed.

// consumeQueues starts consuming every queue the module asked for. A
// queue that cannot be consumed now, with an error later accepts, does not
// fail the rest: it is reported (QueuesDown) and tried again on its own
// (reconsumeLater).
func (m *Module) consumeQueues(ctx context.Context, s *session, queues []setup.Entry, later func(error) bool) error {
	for _, q := range queues {
		if err := m.consumeQueue(ctx, s, q); err != nil {
			if !later(err) || s.isLost() || errors.Is(err, sdk.ErrClosed) {
				return err
			}
			m.queueDown(q.Key, err.Error())
			m.log.Error("a consumed queue cannot be consumed now; the module's other queues go on, and it is tried again", "queue", q.Key, "err", err)
			m.reconsumeLater(s, q, nil, 1)
		}
	}
	return nil
}

// queueDown records that the module cannot consume queue now, and why
// ("" when it consumes it again).
func (m *Module) queueDown(queue, why string) {
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	if why == "" {
		delete(m.queuesDown, queue)
		return
	}
	m.queuesDown[queue] = why
}

// QueuesDown returns the consumed queues the module cannot consume now,
// each with why (the node's Ready reports them).
func (m *Module) QueuesDown() map[string]string {
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	return maps.Clone(m.queuesDown)
}

// watchQueue is watch for a consumed queue's channel ch: the broker
// cancelling its consumer (the queue was deleted) or closing ch with an
// error ends only this queue's consumer. The module's own queue and its
// other consumed queues go on, what the workers of this one are handling
// is settled on ch as usual, and the queue is consumed again when it can
// be (reconsumeLater).
func (m *Module) watchQueue(s *session, q setup.Entry, ch *amqp.Channel, closed <-chan *amqp.Error, cancelled <-chan string) {
	var why string
	select {
	case err, ok := <-closed:
		if !ok || err == nil {
			return // closed by the node: Stop, resume, or a reconsume
		}
		why = "its channel closed: " + err.Error()
	case _, ok := <-cancelled:
		if !ok {
			return
		}
		why = "the broker cancelled its consumer (was the queue deleted?)"
	}
	if s.isLost() {
		return // the connection went: the supervisor resumes the whole module
	}
	m.holdMu.Lock()
	qc := m.queueConsumers[q.Key]
	current := qc != nil && qc.ch == ch
	if current {
		delete(m.queueConsumers, q.Key)
		m.queuesDown[q.Key] = why
	}
	m.holdMu.Unlock()
	if !current {
		return
	}
	m.log.Error("a consumed queue is not consumed any more; the module's other queues go on, and it is tried again", "queue", q.Key, "why", why)
	m.reconsumeLater(s, q, ch, 1)
}

// reconsumeLater consumes q again after a back-off (closing old, the
// channel it was consumed on, first), until it works, s is lost (the
// supervisor resumes the whole module then), or the module stops.
func (m *Module) reconsumeLater(s *session, q setup.Entry, old *amqp.Channel, attempt int) {
	delay := jitter(expBackoff(time.Second, 30*time.Second, attempt))
	time.AfterFunc(delay, func() {
		if hook := m.node.hook().reconsume; hook != nil {
			hook(q.Key, attempt)
		}
		m.resumeMu.Lock()
		defer m.resumeMu.Unlock()
		m.mu.Lock()
		stopped := m.stopped
		m.mu.Unlock()
		if stopped {
			return // Stop drains and closes the module's channels, old among them
		}
		if old != nil {
			m.untrack(old)
		}
		if s.isLost() || m.node.session() != s {
			return
		}
		m.holdMu.Lock()
		qc := m.queueConsumers[q.Key]
		m.holdMu.Unlock()
		if qc != nil && !qc.ch.IsClosed() {
			return // a resume of the module consumed it meanwhile
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.consumeQueue(ctx, s, q); err != nil {
			if s.isLost() || errors.Is(err, sdk.ErrClosed) {
				return
			}
			m.queueDown(q.Key, err.Error())
			m.log.Warn("a consumed queue still cannot be consumed; trying again", "queue", q.Key, "err", err, "attempt", attempt+1)
			m.reconsumeLater(s, q, nil, attempt+1)
			return
		}
		m.queueDown(q.Key, "")
		m.log.Info("consuming a queue again", "queue", q.Key)
	})
}

// queueConsumer is the node's side of one consumed queue on the current
// session: its channel, and whether it consumes (not held).
type queueConsumer struct {
	entry     setup.Entry
	ch        *amqp.Channel
	tag       string
	consuming bool
}

func (m *Module) consumeQueue(ctx context.Context, s *session, q setup.Entry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if q.Exclusive {
		if err := checkQueue(s, q.Key); err != nil {
			return err
		}
		m.queueDown(q.Key, "") // it exists: standBy takes it when it can
		go m.standBy(s, q)
		return nil
	}
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := m.track(ch); err != nil {
		return err
	}
	info, err := ch.QueueDeclarePassive(q.Key, false, false, false, false, nil)
	if err != nil {
		m.untrack(ch)
		return queueError(q.Key, err)
	}
	if err := ch.Qos(q.Prefetch, 0, false); err != nil {
		m.untrack(ch)
		return fmt.Errorf("set prefetch: %w", err)
	}
	qc := &queueConsumer{entry: q, ch: ch, tag: m.queueTag(q.Key)}
	go m.watchQueue(s, q, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	m.queueConsumers[q.Key] = qc
	delete(m.queuesDown, q.Key) // consumed (or held) on this channel from now on
	if m.held[q.Key] {
		m.log.Info("a consumed queue is held: not consuming it", "queue", q.Key, "messages", info.Messages)
		return nil
	}
	if err := m.startConsuming(qc); err != nil {
		return err
	}
	m.log.Info("consuming a queue", "queue", q.Key, "prefetch", q.Prefetch, "messages", info.Messages)
	return nil
}

// queueTag is the consumer tag of a consumed queue.
func (m *Module) queueTag(queue string) string { return m.consumerTag(".queue." + queue) }

// consumerTag is the tag of one of the module's consumers: "mesh.", the
// node, the module and what it consumes (suffix), cut to the 255 bytes of
// an AMQP short string, a long one then ending in a digest of the whole,
// so that every consumer has a tag of its own that Stop can cancel.
func (m *Module) consumerTag(suffix string) string {
	tag := "mesh." + m.node.cfg.Node + "." + m.def.Name + suffix
	if len(tag) <= 255 {
		return tag
	}
	sum := sha256.Sum256([]byte(tag))
	return tag[:255-17] + "." + hex.EncodeToString(sum[:8])
}

// queueError says why a consumed queue could not be consumed.
func queueError(queue string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound && !unavailable(err) {
		return fmt.Errorf("consume queue %s: it does not exist (the module consumes it as it is and never declares it): %w", queue, err)
	}
	return fmt.Errorf("consume queue %s: %w", queue, err)
}

// checkQueue checks, on a channel of its own, that queue exists.
func checkQueue(s *session, queue string) error {
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
		return queueError(queue, err)
	}
	return nil
}

// standByEvery is how often a module waiting for a queue another consumer
// has exclusively tries to take it: the broker says nothing when it frees.
const standByEvery = time.Second

// standBy consumes q exclusively (sdk.Mesh.Exclusive) as soon as no other
// consumer has it, trying every standByEvery while the session lasts and
// the module runs; it returns once it consumes. Until then its channel is
// not the module's: a refusal (403) closes only it.
func (m *Module) standBy(s *session, q setup.Entry) {
	tag := m.queueTag(q.Key)
	waiting := false
	for {
		m.mu.Lock()
		stopped := m.stopped
		m.mu.Unlock()
		if stopped || s.isLost() {
			return
		}
		m.holdMu.Lock()
		held := m.held[q.Key]
		m.holdMu.Unlock()
		if !held {
			ch, err := s.subConn.Channel()
			if err != nil {
				return // the session is going: the supervisor resumes the module
			}
			var deliveries <-chan amqp.Delivery
			if err = ch.Qos(q.Prefetch, 0, false); err == nil {
				deliveries, err = ch.Consume(q.Key, tag, false, true, false, false, nil)
			}
			if err == nil {
				if m.track(ch) != nil {
					return // stopped meanwhile; track closed it
				}
				m.addTag(ch, tag, q.Key)
				go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
				m.holdMu.Lock()
				m.queueConsumers[q.Key] = &queueConsumer{entry: q, ch: ch, tag: tag, consuming: true}
				h := q.Handler.(sdk.Handler)
				f := m.flowOf(ch)
				for range q.Prefetch {
					m.startQueueWorker(q.Key, h, deliveries, f)
				}
				m.holdMu.Unlock()
				m.log.Info("consuming a queue exclusively", "queue", q.Key, "prefetch", q.Prefetch)
				return
			}
			_ = ch.Close()
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
				m.log.Warn("consuming a queue exclusively failed; trying again", "queue", q.Key, "err", err)
			} else if !waiting {
				m.log.Info("another consumer has the queue exclusively; standing by to take it over", "queue", q.Key)
				waiting = true
			}
		}
		time.Sleep(standByEvery)
	}
}

// startConsuming starts the consumer of qc and its workers. holdMu is
// held.
func (m *Module) startConsuming(qc *queueConsumer) error {
	deliveries, err := qc.ch.Consume(qc.entry.Key, qc.tag, false, qc.entry.Exclusive, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume queue %s: %w", qc.entry.Key, err)
	}
	m.addTag(qc.ch, qc.tag, qc.entry.Key)
	qc.consuming = true
	h := qc.entry.Handler.(sdk.Handler)
	f := m.flowOf(qc.ch)
	for range qc.entry.Prefetch {
		m.startQueueWorker(qc.entry.Key, h, deliveries, f)
	}
	return nil
}

// hold stops or starts consuming a consumed queue (sdk.Mesh.Hold). Before
// the module consumes, it only records the wish.
func (m *Module) hold(queue string, held bool) error {
	if !m.setup.Consumes(queue) {
		return fmt.Errorf("hold %q: %w: module %s does not consume that queue", queue, sdk.ErrInvalid, m.def.Name)
	}
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	m.held[queue] = held
	qc := m.queueConsumers[queue]
	if qc == nil || qc.ch.IsClosed() || qc.consuming == !held {
		return nil // applied when the queue is consumed (again)
	}
	if !held {
		if err := m.startConsuming(qc); err != nil {
			return err
		}
		m.log.Info("consuming a held queue again", "queue", queue)
		return nil
	}
	// The workers finish what was delivered; the broker delivers no more
	// once the cancel is confirmed, and the rest stays in the queue.
	if err := qc.ch.Cancel(qc.tag, false); err != nil {
		return fmt.Errorf("hold %q: cancel its consumer: %w", queue, err)
	}
	qc.consuming = false
	m.log.Info("holding a consumed queue", "queue", queue)
	return nil
}

// startQueueWorker is startWorker for a consumed queue.
func (m *Module) startQueueWorker(queue string, h sdk.Handler, deliveries <-chan amqp.Delivery, f *consumerFlow) {
	m.workers.Add(1)
	f.workers.Add(1)
	go func() {
		defer m.workers.Done()
		defer f.workers.Add(-1)
		for d := range deliveries {
			if unseen := m.node.hook().unseen; unseen != nil && unseen(queue) {
				continue
			}
			f.take()
			replaced := m.handleQueued(queue, h, d, deliveries, f)
			f.done()
			if replaced {
				return
			}
		}
	}()
}

// handleQueued runs one message of a consumed queue through h and
// settles it: acked, retried, or dead-lettered naming the queue.
func (m *Module) handleQueued(queue string, h sdk.Handler, d amqp.Delivery, deliveries <-chan amqp.Delivery, f *consumerFlow) (replaced bool) {
	m.from(d).delivered.Add(1)
	src := source{queue: queue}
	// The runtime's own headers count only where the runtime put them
	// (owned.go), as on the module's own queue.
	o, oerr := m.node.originOf(d)
	// The attempts a copy of the node's own carries (a classic retry, or a
	// retry scheduled through the delay cascade) count first; a quorum
	// queue adds those it counted.
	attempt := 1
	if n, ok := d.Headers[wire.HeaderAttempt].(int64); ok && n > 0 && n < 1<<31 && o.own {
		attempt = int(n) + 1
	}
	if n, ok := d.Headers["x-delivery-count"].(int64); ok && n >= 0 {
		src.quorum, attempt = true, attempt+int(n)
	}
	ev := queuedEventOf(d, queue, attempt, o)
	if oerr == nil {
		oerr = fromCloudEvent(&ev, d)
	}
	if oerr != nil {
		m.deadLetter(src, d, ev.Type, attempt, wire.DeadReasonMalformed, oerr)
		return false
	}
	if attempt == 1 {
		m.recordTimeInQueue(ev.Time, d.Headers)
	}
	if deadline, expired := wire.Expired(ev.Headers[wire.HeaderDeadline], time.Now()); expired {
		m.deadLetter(src, d, ev.Type, attempt, wire.DeadReasonExpired, fmt.Errorf("its deadline %s passed before a handler took it", deadline.Format(time.RFC3339Nano)))
		return false
	}
	if f := m.queueFilter(queue); f != nil && !f.Match(filterEvent(ev)) {
		m.filteredOut(src, d, m.from(d), ev)
		return false
	}
	if m.policy(src.quorum).lostAttempt(d.Redelivered) {
		m.failed(src, d, ev.Type, attempt, errors.New("the consumer stopped before the handler finished"))
		return false
	}
	err, overran := m.call(h, ev, d, queue, func() {
		m.startQueueWorker(queue, h, deliveries, f)
		m.failed(src, d, ev.Type, attempt, fmt.Errorf("handler timed out after %v", m.cfg.HandlerTimeout))
	})
	switch {
	case overran:
		return true
	case err == nil:
		m.node.stats.handled.Add(1)
		m.from(d).handled.Add(1)
		if err := d.Ack(false); err != nil {
			m.log.Warn("ack failed; the message will be delivered again", "queue", queue, "message_id", ev.ID, "err", err)
		}
	default:
		m.failed(src, d, ev.Type, attempt, err)
	}
	return false
}

// queueFilter is the filter of a consumed queue's handler (sdk.Filter), or
// nil.
func (m *Module) queueFilter(queue string) *filter.Filter {
	for _, q := range m.queues { // fixed since start: no lock needed
		if q.Key == queue {
			return q.Options.Filter
		}
	}
	return nil
}

// queuedEventOf is what a Consume handler sees of a message: read as far
// as it can be, every header as text; its type and publisher as o says
// (originOf: the routing key and user-id, unless the node put it back
// for a retry or meshctl replayed it straight to the queue).
// fromCloudEvent reads a CloudEvent (binary or structured mode) into ev:
// its id, source, type, time, dataschema (as Schema), data (as Body) and
// data content type. A message with mesh's identity (x-event-id) is
// mesh's, whatever else it carries (ADR 34); one that says it is a
// CloudEvent and breaks the specification is an error, to dead-letter as
// malformed.
func fromCloudEvent(ev *sdk.Event, d amqp.Delivery) error {
	if _, mesh := d.Headers[wire.HeaderEventID]; mesh {
		return nil
	}
	ce, ok, err := cloudevents.Read(d.Headers, d.ContentType, d.Body)
	if err != nil || !ok {
		return err
	}
	if len(ce.Type) > wire.MaxNameBytes {
		// Its type is the key it would be dead-lettered or retried with.
		return fmt.Errorf("%w: type of %d bytes is over %d, the longest routing key", cloudevents.ErrMalformed, len(ce.Type), wire.MaxNameBytes)
	}
	ev.Type = ce.Type
	setCloudEvent(ev, ce)
	return nil
}

// setCloudEvent sets ev's id, source, schema, body, time and content type
// from ce (its type is the caller's: a dead letter keeps its key).
func setCloudEvent(ev *sdk.Event, ce cloudevents.Event) {
	ev.ID, ev.Source, ev.Schema, ev.Body = ce.ID, ce.Source, ce.DataSchema, ce.Data
	if !ce.Time.IsZero() {
		ev.Time = ce.Time
	}
	if ce.DataContentType != "" {
		ev.Headers["content-type"] = ce.DataContentType
	} else {
		delete(ev.Headers, "content-type") // application/cloudevents+json was the envelope's
	}
}

func queuedEventOf(d amqp.Delivery, queue string, attempt int, o origin) sdk.Event {
	text := func(k string) string { return deadletters.HeaderText(d.Headers[k]) }
	ev := sdk.Event{
		ID: d.MessageId, Type: o.eventType, Source: text(wire.HeaderSource), Node: text(wire.HeaderNode),
		CausationID: text(wire.HeaderCausationID), Schema: text(wire.HeaderSchema),
		Body: d.Body, Attempt: attempt, Redelivered: d.Redelivered, UserID: o.userID, Queue: queue,
	}
	if ev.ID == "" {
		ev.ID = text(wire.HeaderEventID)
	}
	if t, err := time.Parse(time.RFC3339Nano, text(wire.HeaderTime)); err == nil {
		ev.Time = t.UTC()
	} else if !d.Timestamp.IsZero() {
		ev.Time = d.Timestamp.UTC()
	}
	ev.Headers = make(map[string]string, len(d.Headers)+1)
	for k, v := range d.Headers {
		if strings.HasPrefix(k, "x-mesh-") || deadBookkeeping(k) {
			continue
		}
		ev.Headers[k] = deadletters.HeaderText(v)
	}
	if d.ContentType != "" {
		ev.Headers["content-type"] = d.ContentType
	}
	return ev
}
