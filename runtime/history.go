package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/grant"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// The mesh's history (ADR 35): a RabbitMQ stream bound to # on
// mesh.events keeps every event the mesh routes, replicated over the
// cluster, append-only, read by offset. A module with a History handler
// (the audit logger) reads it in order, a batch at a time, from the
// offset it says it stored last; the node keeps no position of its own
// beyond the session (a stream keeps none for an AMQP 0.9.1 reader).
//
// On RabbitMQ 3.10 (measured, ADR 35): a consumer must set a prefetch
// (406 otherwise); x-stream-offset as a number starts exactly there,
// "first" at the oldest kept, a timestamp at the chunk holding that
// second; each delivery carries its offset in x-stream-offset (long); a
// nack or reject closes the channel (540), so a failed batch is handed to
// the module again from memory, never returned; acks only make room in
// the prefetch; an offset past the end waits for what comes.

// HistoryConfig is where the mesh keeps its history: a stream on the
// broker (ADR 35). Every node of a mesh that keeps one declares it alike
// (a different argument is refused by the broker on redeclare).
type HistoryConfig struct {
	// Stream is the stream's name; "" keeps no history (the default: the
	// audit logger reads its own queue, as the wire ADR says).
	Stream string
	// MaxAge drops what the stream holds past this age, a segment at a
	// time (x-max-age); 0 keeps it by age. Separate from the audit
	// logger's own retention of its index.
	MaxAge time.Duration
	// MaxBytes bounds the stream's size on each member, dropping the
	// oldest segments (x-max-length-bytes); 0: no bound.
	MaxBytes int64
	// SegmentBytes is the size of one segment file
	// (x-stream-max-segment-size-bytes); 0: the broker's (500 MB).
	// Retention drops whole segments, so a small stream wants small ones.
	SegmentBytes int64
	// Replicas is the number of broker nodes that hold the stream when it
	// is first declared (x-initial-cluster-size); 0: the broker's default,
	// every node of the cluster.
	Replicas int
}

// DefaultHistoryStream is the stream's usual name.
const DefaultHistoryStream = "mesh.history"

// streamQueueType is the x-queue-type of a stream.
const streamQueueType = "stream"

// historyBatch bounds the events of one History.Handle call, and
// historyLinger how long a batch waits for more after its first event.
const (
	historyBatch  = 256
	historyLinger = 2 * time.Millisecond
)

// validate checks the history's settings.
func (h HistoryConfig) validate() error {
	var errs []error
	if h.Stream != "" {
		if err := wire.ValidateQueueName(h.Stream); err != nil {
			errs = append(errs, fmt.Errorf("history.stream: %w", err))
		}
	}
	if h.MaxAge < 0 || (h.MaxAge > 0 && h.MaxAge < time.Second) {
		errs = append(errs, fmt.Errorf("history.max_age: %v: want 0 or at least 1s", h.MaxAge))
	}
	for _, n := range []struct {
		key string
		v   int64
	}{{"max_bytes", h.MaxBytes}, {"segment_bytes", h.SegmentBytes}, {"replicas", int64(h.Replicas)}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("history.%s: %d is negative", n.key, n.v))
		}
	}
	return errors.Join(errs...)
}

// historyArgs are the stream's declare arguments.
func (h HistoryConfig) historyArgs() amqp.Table {
	args := amqp.Table{"x-queue-type": streamQueueType}
	if h.MaxAge > 0 {
		args["x-max-age"] = strconv.FormatInt(int64(h.MaxAge/time.Second), 10) + "s"
	}
	if h.MaxBytes > 0 {
		args["x-max-length-bytes"] = h.MaxBytes
	}
	if h.SegmentBytes > 0 {
		args["x-stream-max-segment-size-bytes"] = h.SegmentBytes
	}
	if h.Replicas > 0 {
		args["x-initial-cluster-size"] = int64(h.Replicas)
	}
	return args
}

// HistoryObject is the history's stream as the nodes declare it, for the
// topology commands (the zero BrokerObject when h keeps none).
func HistoryObject(h HistoryConfig) BrokerObject {
	if h.Stream == "" {
		return BrokerObject{}
	}
	return BrokerObject{Kind: "queue", Name: h.Stream, Type: streamQueueType, Durable: true, Args: h.historyArgs(),
		Binds: wire.ExchangeEvents + ` with "#": every event the mesh routes`, Bindings: []Binding{{wire.ExchangeEvents, "#"}}, BindingsKnown: true}
}

// declareHistory declares the history's stream and binds it to # on
// mesh.events.
func declareHistory(ch *amqp.Channel, h HistoryConfig) error {
	if _, err := ch.QueueDeclare(h.Stream, true, false, false, false, h.historyArgs()); err != nil {
		return fmt.Errorf("declare the history stream %s (a stream declared with other arguments is refused: every node must say the same under history:, or change it with a policy): %w", h.Stream, err)
	}
	if err := ch.QueueBind(h.Stream, "#", wire.ExchangeEvents, false, nil); err != nil {
		return fmt.Errorf("bind the history stream %s to mesh.events: %w", h.Stream, err)
	}
	return nil
}

// historyFrom asks the module where it reads from, once, at load.
func (m *Module) historyFrom(ctx context.Context) error {
	if m.def.History == nil {
		return nil
	}
	if m.def.History.Handle == nil || m.def.History.From == nil {
		return fmt.Errorf("module %s: %w: its History needs both From and Handle", m.def.Name, sdk.ErrInvalid)
	}
	if m.node.cfg.History.Stream == "" {
		return fmt.Errorf("module %s: %w: it reads the mesh's history, and this node keeps none (history.stream in the node config)", m.def.Name, sdk.ErrInvalid)
	}
	if m.cfg.DenyHistory {
		return grant.History(m.def.Name)
	}
	var from int64
	err, _ := execute.Safely(func() error {
		var err error
		from, err = m.def.History.From(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("module %s: ask where it reads the history from: %w", m.def.Name, err)
	}
	m.setHistoryNext(from)
	return nil
}

// setHistoryNext sets the offset the module reads the history from next
// (negative: the start).
func (m *Module) setHistoryNext(from int64) {
	if from < 0 {
		from = -1
	}
	m.historyNext.Store(from)
}

// RewindHistory has the module read the history from offset from (the
// start if negative) on: the channel it reads on is closed, so the module
// attaches again there. A module process that starts again says where it
// resumes (its store may have been lost), and its host rewinds to that.
func (m *Module) RewindHistory(from int64) {
	if m.def.History == nil {
		return
	}
	// Before the process that said from is sent anything: a batch the
	// reader on ch still holds, or retries, is not sent to it.
	ch := m.stopHistoryReader()
	m.setHistoryNext(from) // the reader on ch moves it no more
	if ch != nil {
		_ = ch.Close() // watch sees no error: resume it ourselves
		if s := m.node.session(); s != nil {
			go m.resume(s, true)
		}
	}
}

// stopHistoryReader ends the reader on the current history channel,
// which it returns (nil: none): the reader's context ends, and it
// acknowledges and moves the offset no more. Call it before that channel
// is closed: an ack racing the close reaches the broker on a channel it
// closed, a connection error (504) that ends the node's session.
func (m *Module) stopHistoryReader() *amqp.Channel {
	m.historyAckMu.Lock()
	defer m.historyAckMu.Unlock()
	m.mu.Lock()
	ch, cancel := m.historyCh, m.historyCancel
	m.historyCh, m.historyCancel = nil, nil
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return ch
}

// readHistory starts reading the history on s from where the module left
// it.
func (m *Module) readHistory(ctx context.Context, s *session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stream := m.node.cfg.History.Stream
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := m.track(ch); err != nil {
		return err
	}
	// A stream reader must have a prefetch (406 otherwise). Twice a batch:
	// while the module handles one, the next arrives whole, and each
	// batch is a full one (one transaction in the audit logger).
	prefetch := max(m.cfg.Prefetch, 2*historyBatch)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	var offset any = "first"
	if next := m.historyNext.Load(); next >= 0 {
		offset = next
	}
	tag := m.consumerTag(".history")
	deliveries, err := ch.Consume(stream, tag, false, false, false, false, amqp.Table{"x-stream-offset": offset})
	if err != nil {
		return fmt.Errorf("read the history stream %s: %w", stream, err)
	}
	m.addTag(ch, tag, stream)
	readCtx, cancel := context.WithCancel(m.handleCtx)
	m.mu.Lock()
	if m.historyCancel != nil {
		m.historyCancel() // the reader of an earlier session or channel
	}
	m.historyCh, m.historyCancel = ch, cancel
	m.mu.Unlock()
	go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	m.workers.Add(1)
	go func() {
		defer m.workers.Done()
		m.historyLoop(readCtx, ch, deliveries)
	}()
	m.log.Info("reading the mesh's history", "stream", stream, "from", offset)
	return nil
}

// historyLoop hands the module the history a batch at a time, in order,
// until the channel closes: a batch is what has arrived, up to
// historyBatch events. A batch the module fails is handed again after a
// back-off; the node acknowledges a batch (one multiple ack: acks only
// make room in the prefetch) once the module took it.
//
// Only the current reader (ch is historyCh) moves the offset the module
// reads from next; one replaced (a resume, RewindHistory) has its ctx
// cancelled, and its batch in hand is not handed on.
func (m *Module) historyLoop(ctx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery) {
	linger := time.NewTimer(0)
	defer linger.Stop()
	for d := range deliveries {
		batch := []amqp.Delivery{d}
		// amqp091-go hands deliveries over one at a time from a goroutine
		// of its own: a batch takes what comes within historyLinger, not
		// only what is there this instant (which is one, measured).
		linger.Reset(historyLinger)
	fill:
		for len(batch) < historyBatch {
			select {
			case more, ok := <-deliveries:
				if !ok {
					break fill
				}
				batch = append(batch, more)
			case <-linger.C:
				break fill
			}
		}
		if !linger.Stop() {
			select {
			case <-linger.C:
			default:
			}
		}
		// The batch's last offset, read before historyEvent takes the
		// header out of the deliveries' headers.
		last, _ := batch[len(batch)-1].Headers[wire.HeaderStreamOffset].(int64)
		events := make([]sdk.Event, 0, len(batch))
		for _, d := range batch {
			if amqpmsg.IsHistoryMarker(d) {
				continue // a replay's cutoff (meshctl audit replay --history), not an event
			}
			events = append(events, m.historyEvent(d))
		}
		m.from(d).delivered.Add(uint64(len(events)))
		if len(events) > 0 && !m.handleHistory(ctx, ch, events) {
			return // stopping, or replaced: resumed from historyNext
		}
		m.from(d).handled.Add(uint64(len(events)))
		m.historyAckMu.Lock()
		if ctx.Err() != nil {
			m.historyAckMu.Unlock()
			return // replaced (stopHistoryReader): its channel is being closed
		}
		m.mu.Lock()
		if m.historyCh == ch {
			m.historyNext.Store(last + 1)
		}
		m.mu.Unlock()
		err := batch[len(batch)-1].Ack(true)
		m.historyAckMu.Unlock()
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			m.log.Warn("ack of history deliveries failed", "err", err)
		}
	}
}

// handleHistory runs Handle on events until it succeeds, with back-off
// between failures; false when the module stops, or the reader is
// replaced (readCtx ends) or its channel closes, first. Handle runs for
// one reader at a time (historyMu): a reader being replaced finishes its
// call before the next one's starts.
func (m *Module) handleHistory(readCtx context.Context, ch *amqp.Channel, events []sdk.Event) bool {
	h := m.def.History.Handle
	for attempt := 1; ; attempt++ {
		m.historyMu.Lock()
		if readCtx.Err() != nil {
			m.historyMu.Unlock()
			return false
		}
		ctx, cancel := context.WithTimeout(readCtx, m.cfg.HandlerTimeout)
		start := time.Now()
		err, _ := execute.Safely(func() error { return h(ctx, events) })
		cancel()
		m.historyMu.Unlock()
		m.recordHandler(start, outcomeOf(err, false))
		if err == nil {
			return true
		}
		delay := m.backoff(attempt)
		m.log.Error("the module failed a batch of the history; it gets the same batch again", "from", events[0].Offset,
			"to", events[len(events)-1].Offset, "attempt", attempt, "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-m.stopping:
			t.Stop()
			return false
		case <-readCtx.Done():
			t.Stop()
			return false
		}
		if ch.IsClosed() {
			return false
		}
	}
}

// historyEvent is what a History handler sees of a delivery from the
// stream: the event as a handler of mesh.events would get it, with its
// offset, or, for a message that breaks the wire contract, what can be
// read of it with DeadReason "malformed", as a dead letter of it would be.
func (m *Module) historyEvent(d amqp.Delivery) sdk.Event {
	return historyEventOf(m.node, d)
}

// HistoryEvent is what a History handler gets of a delivery d read from
// the history's stream on a plain connection (meshctl audit verify
// --history compares the audit logger's rows with it); ok is false for a
// replay's marker, which a handler never gets. d's headers lose
// x-stream-offset.
func HistoryEvent(d amqp.Delivery) (ev sdk.Event, ok bool) {
	if amqpmsg.IsHistoryMarker(d) {
		return sdk.Event{}, false
	}
	return historyEventOf(&Node{}, d), true
}

// historyEventOf is historyEvent, the runtime's own headers read as node
// n reads them.
func historyEventOf(n *Node, d amqp.Delivery) sdk.Event {
	offset, _ := d.Headers[wire.HeaderStreamOffset].(int64)
	delete(d.Headers, wire.HeaderStreamOffset) // the stream's, not the event's
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	o, oerr := n.originOf(d)
	if err == nil {
		err = oerr
	}
	if d.Exchange == "" {
		// Every event reaches the stream through its binding to
		// mesh.events; a message sent straight into it (any node's user
		// may, through the default exchange) is no event of the mesh,
		// whatever its headers say, and no consumer ever saw it.
		err = &wire.MalformedError{Reason: fmt.Sprintf("sent straight into the history's stream (by user %q), not through %s: no event of the mesh", d.UserId, wire.ExchangeEvents)}
	}
	if err == nil {
		err = wire.ValidateEventType(o.eventType)
	}
	if err != nil {
		ev := deadEventOf(d)
		ev.Type = o.eventType
		ev.DeadQueue, ev.DeadReason, ev.DeadError, ev.DeadAttempts, ev.DeadTime = "", wire.DeadReasonMalformed, err.Error(), 0, time.Time{}
		ev.Attempt, ev.Offset = 1, offset
		return ev
	}
	ev := eventOf(d, meta, o.eventType, 1)
	ev.UserID = o.userID
	ev.Offset = offset
	return ev
}
