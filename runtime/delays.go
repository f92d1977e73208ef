package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Delayed events (sdk.After, sdk.At; ADR 32). A node with Config.Delays
// declares the delay cascade that internal/delay describes on every
// connect, with a due queue of its own, mesh.node.<node>.due, and runs a
// mover: a consumer of that queue that publishes each message to
// mesh.events as the event it carries, confirmed, and only then
// acknowledges it. A mover that dies before its ack leaves the message in
// the queue for the node's next session (at least once: the event keeps
// its id, so the consumers' de-duplication absorbs a second copy).
//
// What a node schedules comes due in its own queue (the routing key's last
// word is the node's name) and is published by the node itself, as its own
// broker user: the same credential, with the same topic permissions, as
// the emit would have had undelayed. A mover publishing for others would
// be a confused deputy, publishing as itself what a node with narrower
// permissions asked. So the mover honours the destination
// (x-mesh-routing-key) only on a message whose user-id, verified by the
// broker, is its own user or one of Config.DelayPublishers (the operator's,
// for meshctl emit --after). Anything else in its queue, or a message
// without a destination that is an event type, is dead-lettered as
// malformed to mesh.events.dead. While a node is down, what it scheduled
// and came due waits for it in its queue, as its spool would.
//
// The event's time to live (sdk.WithTTL) travels in x-mesh-ttl while it
// waits, since a per-message TTL in a level queue would end its wait
// early, and counts from when it comes due.

// headerDelayTTL carries a delayed event's time to live (ms) through the
// cascade; the mover makes it the expiration again.
const headerDelayTTL = "x-mesh-ttl"

// headerDelayQueue names, on a retry scheduled through the cascade
// (ModuleConfig.Retry), the queue the mover puts it back in (a module's
// event queue, or a queue it consumes), through the default exchange, with
// the event's type, attempts and original publisher in the runtime's
// headers (owned.go honours them on the node's own copies). The mover
// honours it only on a copy of its own user.
const headerDelayQueue = "x-mesh-delay-queue"

// moverPrefetch bounds the due messages a mover holds, each published
// concurrently (their confirms pipeline on the session's channel).
const moverPrefetch = 128

// DelayObjects are the mesh-wide broker objects of the delay cascade, as
// a node with delays on declares them (meshctl topology prints and checks
// them for such a node): the entry exchange, each level's queue and the
// exchange it dead-letters to (internal/delay: each routes by the bits
// left, straight to the queue of the next level to wait in), and the
// exchange of what came due, which routes it to the due queue of the node
// that scheduled it (NodeObjects) and keeps what no node's queue takes in
// mesh.events.unrouted.
func DelayObjects() []BrokerObject {
	var objs []BrokerObject
	for _, x := range delay.Exchanges() {
		what := "where a delayed event is published; routes it by its delay's bits"
		if x.Name != delay.ExchangeIn {
			what = fmt.Sprintf("where queue %s dead-letters; routes by the bits below %d", x.Name, x.Below)
		}
		objs = append(objs, BrokerObject{Kind: "exchange", Name: x.Name, Type: amqp.ExchangeTopic, Durable: true,
			Binds: fmt.Sprintf("%s: to %d level queues and %s", what, len(x.Bindings)-1, delay.ExchangeDue)})
	}
	bindings := map[string][]Binding{} // a level queue's bindings, from every exchange above it
	for _, x := range delay.Exchanges() {
		for _, b := range x.Bindings {
			if b.Queue != "" {
				bindings[b.Queue] = append(bindings[b.Queue], Binding{x.Name, b.Key})
			}
		}
	}
	for _, l := range delay.AllLevels() {
		objs = append(objs, BrokerObject{Kind: "queue", Name: l.Name, Type: QueueQuorum, Durable: true, Args: amqp.Table(l.QueueArg),
			Binds:    fmt.Sprintf("the exchanges above it, where bit %d is the highest set (waits %v, then dead-letters to exchange %s)", l.N, l.TTL, l.Name),
			Bindings: bindings[l.Name], BindingsKnown: true})
	}
	return append(objs, BrokerObject{Kind: "exchange", Name: delay.ExchangeDue, Type: amqp.ExchangeTopic, Durable: true,
		Args:  amqp.Table{"alternate-exchange": wire.ExchangeUnrouted},
		Binds: "to each node's mesh.node.NODE.due with \"#.NODE\"; what none takes goes to " + wire.ExchangeUnrouted})
}

// dueQueueObject is the due queue of node, where what it scheduled comes
// due.
func dueQueueObject(node string) BrokerObject {
	return BrokerObject{Kind: "queue", Name: delay.DueQueue(node), Type: QueueQuorum, Durable: true, Args: keeperQueueArgs(),
		Binds:    delay.ExchangeDue + fmt.Sprintf(" with %q: what the node scheduled, when due; its mover consumes it", delay.DueBinding(node)),
		Bindings: []Binding{{delay.ExchangeDue, delay.DueBinding(node)}}, BindingsKnown: true}
}

// declareDelays declares the delay cascade (DelayObjects) and its
// bindings, exchanges before what binds to them, and node's due queue
// unless node is "" (an ephemeral node, which schedules for another).
func declareDelays(ch *amqp.Channel, node string) error {
	objs := DelayObjects()
	if node != "" {
		objs = append(objs, dueQueueObject(node))
	}
	for _, o := range objs {
		if o.Kind == "exchange" {
			if err := ch.ExchangeDeclare(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args); err != nil {
				return fmt.Errorf("declare exchange %s: %w", o.Name, err)
			}
		}
	}
	for _, o := range objs {
		if o.Kind != "queue" {
			continue
		}
		if _, err := ch.QueueDeclare(o.Name, o.Durable, o.AutoDelete, o.Exclusive, false, o.Args); err != nil {
			return fmt.Errorf("declare queue %s (if it exists with other arguments, delete it: ADR 32): %w", o.Name, err)
		}
		for _, b := range o.Bindings {
			if err := ch.QueueBind(o.Name, b.Key, b.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s: %w", o.Name, b.Exchange, err)
			}
		}
	}
	for _, x := range delay.Exchanges() {
		for _, b := range x.Bindings {
			if b.Exchange != "" {
				if err := ch.ExchangeBind(b.Exchange, b.Key, x.Name, false, nil); err != nil {
					return fmt.Errorf("bind exchange %s to %s: %w", b.Exchange, x.Name, err)
				}
			}
		}
	}
	return nil
}

// delayedPublishing makes msg, an event of eventType due at due, one that
// waits in the cascade: its destination and due time in headers, its time
// to live kept for when it comes due.
func delayedPublishing(msg *amqp.Publishing, eventType string, due time.Time) {
	msg.Headers[wire.HeaderRoutingKey] = eventType
	msg.Headers[wire.HeaderDue] = due.UTC().Format(time.RFC3339Nano)
	if msg.Expiration != "" {
		msg.Headers[headerDelayTTL] = msg.Expiration
		msg.Expiration = ""
	}
}

// The book (internal/schedbook): what the node scheduled and has not
// delivered yet, for meshctl delayed ls and cancel, which reach it through
// the node's delays module (tools delays.<node>.ls and .cancel, callers:
// meshctl). It is written after the broker confirmed a schedule (or the
// spool took it) and crossed out when the mover delivered or dropped it;
// a node whose book fails to write logs it and goes on: the event waits
// on the broker all the same.

// openBook opens the node's book in its state dir.
func (n *Node) openBook() error {
	path := filepath.Join(n.cfg.StateDir, "delays.db")
	b, remade, err := schedbook.Open(path)
	if err != nil {
		return fmt.Errorf("node %s: open the book of scheduled events: %w", n.cfg.Node, err)
	}
	if remade {
		n.log.Warn("delays: the book of scheduled events did not open and was made again (the old one is kept beside it); "+
			"what it listed is still delivered, but not listed nor cancellable", "path", path)
	}
	n.book = b
	entries, _, err := b.List(schedbook.Filter{}, -1)
	if err != nil {
		n.log.Warn("delays: the book of scheduled events could not be read; each module's schedules count from now", "path", path, "err", err)
	}
	n.sched.fill(entries)
	return nil
}

// writeDown enters e in the node's book, if it keeps one.
func (n *Node) writeDown(e schedbook.Entry) {
	if n.book == nil {
		return
	}
	if err := n.book.Put(e); err != nil {
		n.log.Warn("delays: a schedule could not be written in the node's book; it is delivered when due but not listed nor cancellable", "event_id", e.ID, "err", err)
	}
	n.record(wire.NodeDelayScheduled, e)
}

// record tells the mesh, and so the audit log, what became of a schedule
// (wire.NodeDelayScheduled, wire.NodeDelayCancelled): an event of the
// node's, caused by the scheduled one, its body the book's entry, emitted
// at most once (no confirm waited for, no spool: the record of a schedule
// is a report; the schedule itself is at least once, and its delivery is
// in the audit log as the event, with x-due).
func (n *Node) record(what string, e schedbook.Entry) {
	ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
	defer cancel()
	eventType := wire.NodeDelayEvent(n.cfg.Node, what)
	raw, err := json.Marshal(e)
	if err == nil {
		_, err = n.emit(ctx, n.cfg.Node, eventType, raw, wire.EmitOptions{AtMostOnce: true, CausationID: e.ID}, "")
	}
	if err != nil {
		n.log.Debug("delays: the record of a schedule was not sent", "event_type", eventType, "event_id", e.ID, "err", err)
	}
}

// DelayedList is the answer of the tool delays.<node>.ls.
type DelayedList struct {
	// Total is how many entries the filter selects; Entries the first
	// of them (the limit), soonest due first.
	Total   int               `json:"total"`
	Entries []schedbook.Entry `json:"entries"`
}

// DelayedListRequest is the request of the tool delays.<node>.ls: a type
// pattern and a source to select by ("": any), and how many to return
// (0: 1000).
type DelayedListRequest struct {
	Type   string `json:"type,omitempty"`
	Source string `json:"source,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// DelayedCancelRequest is the request of the tool delays.<node>.cancel.
type DelayedCancelRequest struct {
	ID string `json:"id"`
}

// DelaysModule is the name of the module a node with delays on runs
// in-process to answer for its book: it serves DelayedTool(node, "ls"),
// "cancel" and "note" (an entry for what meshctl scheduled for the node)
// to meshctl alone.
const DelaysModule = "mesh-delays"

// DelayedTool is the key of the tool of node's delays module that does
// what ("ls", "cancel").
func DelayedTool(node, what string) string { return "delays." + node + "." + what }

// delaysModule is the module that answers for the node's book.
func (n *Node) delaysModule() sdk.Module {
	return sdk.Module{Name: DelaysModule, Callers: map[string][]string{"delays.#": {OperatorSource}}, Setup: func(m sdk.Mesh) error {
		if err := m.Serve(DelayedTool(n.cfg.Node, "ls"), sdk.TypedTool(func(ctx context.Context, _ sdk.Request, r DelayedListRequest) (DelayedList, error) {
			if r.Type != "" {
				if err := wire.ValidateSubscription(r.Type); err != nil {
					return DelayedList{}, sdk.Permanent(err)
				}
			}
			limit := r.Limit
			if limit <= 0 || limit > 100_000 {
				limit = 1000
			}
			entries, total, err := n.book.List(schedbook.Filter{Type: r.Type, Source: r.Source}, limit)
			return DelayedList{Total: total, Entries: entries}, err
		})); err != nil {
			return err
		}
		if err := m.Serve(DelayedTool(n.cfg.Node, "note"), sdk.TypedTool(func(ctx context.Context, _ sdk.Request, e schedbook.Entry) (bool, error) {
			// What meshctl scheduled for this node's mover (emit --after
			// --via): entered in the book so that it is listed and
			// cancellable, unless it is as good as due (its delivery may
			// be under way: an entry then would never be crossed out).
			switch {
			case e.ID == "" || len(e.ID) > wire.MaxCausationBytes:
				return false, sdk.Permanent(fmt.Errorf("%w: an entry needs an id of at most %d bytes", sdk.ErrInvalid, wire.MaxCausationBytes))
			case wire.ValidateEventType(e.Type) != nil || e.Queue != "":
				return false, sdk.Permanent(fmt.Errorf("%w: an entry names an event type, and no queue", sdk.ErrInvalid))
			case time.Until(e.Due) < time.Second:
				return false, nil
			}
			e.Cancelled = false
			n.writeDown(e)
			return true, nil
		})); err != nil {
			return err
		}
		return m.Serve(DelayedTool(n.cfg.Node, "cancel"), sdk.TypedTool(func(ctx context.Context, _ sdk.Request, r DelayedCancelRequest) (schedbook.Entry, error) {
			e, err := n.book.Cancel(r.ID)
			if errors.Is(err, schedbook.ErrNotFound) {
				return e, &sdk.ToolError{Code: "not_found", Permanent: true,
					Message: fmt.Sprintf("node %s holds no delayed event %s: delivered already, scheduled by another node, or never", n.cfg.Node, truncateText(r.ID, 100))}
			}
			if err == nil {
				n.log.Info("delays: a delayed event is cancelled; its mover drops it when due", "event_id", e.ID, "event_type", e.Type, "due", e.Due)
				n.record(wire.NodeDelayCancelled, e)
			}
			return e, err
		}))
	}}
}

// startMover runs the node's mover on s, if the node has delays on and is
// no ephemeral client.
func (n *Node) startMover(s *session) {
	if n.delaysOn() && !n.cfg.Ephemeral {
		go n.runMover(s)
	}
}

// dueNode is the node whose mover delivers what this node schedules: its
// own (Config.DelayNode for an ephemeral node).
func (n *Node) dueNode() string {
	if n.cfg.DelayNode != "" {
		return n.cfg.DelayNode
	}
	return n.cfg.Node
}

// declaredDueQueue is the node whose due queue this node declares: its own,
// or none for an ephemeral node.
func (n *Node) declaredDueQueue() string {
	if n.cfg.Ephemeral {
		return ""
	}
	return n.cfg.Node
}

// CheckDueQueue tells whether node has a due queue on the broker, so that
// what this node schedules for it (Config.DelayNode) is delivered: a node
// that never ran with delays on has none, and what came due for it would
// go to mesh.events.unrouted.
func (n *Node) CheckDueQueue(ctx context.Context, node string) error {
	if err := wire.ValidateWord("node", node); err != nil {
		return err
	}
	s, err := n.awaitSession(ctx)
	if err != nil {
		return err
	}
	ch, err := s.pubConn.Channel()
	if err != nil {
		return fmt.Errorf("check the due queue of node %s: %w", node, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(delay.DueQueue(node), true, false, false, false, nil); err != nil {
		if isAMQPCode(err, amqp.NotFound) {
			return fmt.Errorf("%w: node %s has no due queue (%s): it has not run with delays on, so nothing would deliver a delayed event for it",
				wire.ErrInvalid, node, delay.DueQueue(node))
		}
		return fmt.Errorf("check the due queue of node %s: %w", node, err)
	}
	return nil
}

// runMover moves what comes due on s until s is lost or the node closes,
// consuming the node's due queue again after a pause if the broker cancels
// the consumer (the queue deleted: it is declared again first).
func (n *Node) runMover(s *session) {
	for pause, again := time.Second, false; ; again = true {
		err := n.moveDue(s, again)
		if s.isLost() || n.isClosing() {
			return
		}
		n.log.Warn("delays: the mover stopped consuming its due queue; consuming again", "queue", delay.DueQueue(n.cfg.Node), "err", err, "retry_in", pause)
		select {
		case <-time.After(pause):
		case <-s.lost:
			return
		case <-n.closing:
			return
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// moveDue consumes the node's due queue on a channel of its own and moves each
// message, up to moverPrefetch at once, until the consumer ends. Consuming
// again, it declares the cascade first (the session's connect did the
// first time).
func (n *Node) moveDue(s *session, declare bool) error {
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if declare {
		if err := declareDelays(ch, n.cfg.Node); err != nil {
			return err
		}
	}
	if err := ch.Qos(moverPrefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	queue := delay.DueQueue(n.cfg.Node)
	deliveries, err := ch.Consume(queue, "mover."+n.cfg.Node, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", queue, err)
	}
	var wg sync.WaitGroup
	for d := range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.move(s, d)
		}()
	}
	wg.Wait()
	return errors.New("the broker ended the consumer")
}

// move publishes one due message to where it goes, then acknowledges it.
// A message that breaks the rules above is dead-lettered as malformed; one
// that cannot be published now goes back to the queue after a pause.
func (n *Node) move(s *session, d amqp.Delivery) {
	exchange, key, msg, err := n.dueMessage(d)
	if err != nil {
		n.deadLetterDue(s, d, err)
		return
	}
	entry := schedbook.Key(d.MessageId, headerString(d.Headers, headerDelayQueue))
	var booked schedbook.Entry // what the book says of it (zero if nothing)
	if n.book != nil {
		e, err := n.book.Get(entry)
		if err == nil {
			booked = e
		}
		if err == nil && e.Cancelled {
			if err := d.Ack(false); err != nil {
				return // delivered again, and dropped again
			}
			_ = n.book.Delete(entry)
			n.releaseSchedule(e)
			n.stats.delaysCancelled.Add(1)
			n.log.Info("delays: a cancelled event came due and is dropped", "event_id", e.ID, "event_type", e.Type)
			return
		}
	}
	if _, isRetry := d.Headers[headerDelayQueue]; !isRetry && d.UserId == n.userID {
		if why := n.whyNotDue(headerString(d.Headers, wire.HeaderSource), key); why != "" {
			// Not delivered, and not lost either: set aside in the dead
			// letters, where the operator sees why and may replay it.
			if !n.setAsideDue(s, d, key, msg, why) {
				return // back in the due queue, judged again
			}
			if n.book != nil {
				_ = n.book.Delete(entry)
				n.releaseSchedule(booked)
			}
			n.stats.delaysDropped.Add(1)
			n.log.Warn("delays: a due event is not delivered but dead-lettered (reason "+wire.DeadReasonRevoked+"; meshctl dlq replay delivers it): "+why, "event_id", d.MessageId, "event_type", key)
			e := booked
			if e.ID == "" {
				e = schedbook.Entry{ID: d.MessageId, Type: key, Source: headerString(d.Headers, wire.HeaderSource)}
			}
			n.record(wire.NodeDelayDropped, e)
			return
		}
	}
	ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
	defer cancel()
	if d.UserId != n.userID {
		// Another user's schedule (delay_publishers) may name a type the
		// node's own user may not publish (topic permissions): the broker
		// would close the channel it is published on, so it goes on a
		// channel of its own, and a refusal is a dead letter, not a loop.
		err = publishAlone(ctx, s, exchange, key, msg)
		if isAMQPCode(err, amqp.AccessRefused) {
			n.deadLetterDue(s, d, fmt.Errorf("scheduled by broker user %q, but node %s's own user may not publish it: %w", truncateText(d.UserId, 100), n.cfg.Node, err))
			return
		}
	} else {
		err = n.publishConfirmed(ctx, s, exchange, key, msg)
	}
	if errors.Is(err, errUnroutable) {
		// No alternate exchange on mesh.events, or a retry's module queue
		// that is gone: kept with its type in mesh.unrouted.
		err = n.keepUnrouted(s, headerString(d.Headers, wire.HeaderRoutingKey), msg)
	}
	if err != nil {
		n.log.Warn("delays: a due event could not be published; it goes back to the due queue", "event_id", d.MessageId, "event_type", key, "err", err)
		select {
		case <-time.After(time.Second):
		case <-s.lost:
			return // its channel is gone: the broker delivers it again
		case <-n.closing:
		}
		_ = d.Nack(false, true)
		return
	}
	if err := d.Ack(false); err != nil {
		n.log.Warn("delays: ack of a moved event failed; it will be published again (its consumers de-duplicate it)", "event_id", d.MessageId, "err", err)
		return
	}
	if n.book != nil {
		if err := n.book.Delete(entry); err != nil {
			n.log.Warn("delays: a delivered event could not be crossed out of the node's book; it stays listed", "event_id", d.MessageId, "err", err)
		}
		n.releaseSchedule(booked)
	}
	n.stats.delivered.Add(1) // after the book: whoever sees it counted sees it crossed out
	if due, err := time.Parse(time.RFC3339Nano, headerString(d.Headers, wire.HeaderDue)); err == nil {
		n.telemetry.delayLateness.Record(context.Background(), time.Since(due).Seconds())
	}
}

// publishAlone publishes msg on a channel of its own on s, not mandatory
// (mesh.events keeps what no queue takes), and waits for its confirm; the
// broker's refusal to let the node's user publish it closes only that
// channel, and comes back as the amqp.Error.
func publishAlone(ctx context.Context, s *session, exchange, key string, msg amqp.Publishing) error {
	ch, err := s.pubConn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Confirm(false); err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, msg)
	if err != nil {
		return err
	}
	select {
	case <-dc.Done():
		if dc.Acked() {
			return nil
		}
		select {
		case e := <-closed: // a close is why it was not confirmed: it follows at once
			if e != nil {
				return e
			}
		case <-time.After(time.Second):
		}
		return wire.ErrRefused
	case e := <-closed:
		if e != nil {
			return e
		}
		return wire.ErrConnectionLost
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dueMessage is the publishing of the event d carries, to mesh.events with
// its type, as the node's broker user; or why d breaks the rules.
func (n *Node) dueMessage(d amqp.Delivery) (exchange, key string, msg amqp.Publishing, err error) {
	switch {
	case d.UserId == "":
		return "", "", msg, errors.New("a delayed message without a user-id: the mover publishes only what a publisher the broker verified scheduled")
	case d.UserId != n.userID && !slices.Contains(n.cfg.DelayPublishers, d.UserId):
		return "", "", msg, fmt.Errorf("scheduled by broker user %q, for whom node %s does not deliver: its mover publishes what its own user (%q) scheduled, and what the users of delay_publishers did",
			truncateText(d.UserId, 100), n.cfg.Node, n.userID)
	}
	v, ok := d.Headers[wire.HeaderRoutingKey]
	eventType, isText := v.(string)
	switch {
	case !ok:
		return "", "", msg, fmt.Errorf("a delayed message without %s: it names no event type to deliver", wire.HeaderRoutingKey)
	case !isText:
		return "", "", msg, fmt.Errorf("header %s is %T, want a string", wire.HeaderRoutingKey, v)
	}
	queue, isRetry := d.Headers[headerDelayQueue]
	switch {
	case !isRetry: // an event for mesh.events
		if err := wire.ValidateEventType(eventType); err != nil {
			return "", "", msg, fmt.Errorf("header %s: %w", wire.HeaderRoutingKey, err)
		}
	case len(eventType) > wire.MaxNameBytes: // a retry's routing key, of an event or a consumed queue's message
		return "", "", msg, fmt.Errorf("header %s of %d bytes is longer than a routing key", wire.HeaderRoutingKey, len(eventType))
	}
	msg = amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = n.userID
	if ttl := headerString(d.Headers, headerDelayTTL); ttl != "" {
		if ms, err := strconv.ParseInt(ttl, 10, 64); err == nil && ms > 0 {
			msg.Expiration = ttl
		}
	}
	if !isRetry {
		if msg.Headers == nil {
			msg.Headers = amqp.Table{}
		}
		msg.Headers[wire.HeaderScheduledBy] = d.UserId
		return wire.ExchangeEvents, eventType, msg, nil
	}
	// A retry back to the queue a module of the node took it from: its own
	// event queue, or one it consumes. Only the node's own copies.
	q, _ := queue.(string)
	attempts, _ := d.Headers[wire.HeaderAttempt].(int64)
	user, _ := d.Headers[wire.HeaderUserID].(string)
	switch {
	case d.UserId != n.userID:
		return "", "", msg, fmt.Errorf("a retry (header %s) scheduled by broker user %q: node %s's mover puts back only the retries of its own user", headerDelayQueue, truncateText(d.UserId, 100), n.cfg.Node)
	case q == "" || wire.ValidateQueueName(q) != nil:
		return "", "", msg, fmt.Errorf("header %s %q names no queue", headerDelayQueue, truncateText(fmt.Sprint(queue), 300))
	case attempts < 1 || attempts >= 1<<31:
		return "", "", msg, fmt.Errorf("a retry whose header %s is %v, not a count of attempts", wire.HeaderAttempt, d.Headers[wire.HeaderAttempt])
	}
	msg.Headers[wire.HeaderRoutingKey] = eventType
	msg.Headers[wire.HeaderAttempt] = attempts
	msg.Headers[wire.HeaderUserID] = user
	if n, ok := d.Headers[wire.HeaderSuspect].(int64); ok && n >= 0 {
		msg.Headers[wire.HeaderSuspect] = n // still handled alone (isolation.go)
	}
	delete(msg.Headers, wire.HeaderDue) // a retry, not a delayed event
	return "", q, msg, nil
}

// deadLetterDue puts a due message that breaks the rules in the dead
// letters (reason malformed, the node's due queue), then acknowledges it;
// if that fails, it goes back to the queue after a pause.
func (n *Node) deadLetterDue(s *session, d amqp.Delivery, why error) {
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = n.userID
	msg.Headers[wire.HeaderUserID] = d.UserId
	msg.Headers[wire.HeaderDeadQueue] = delay.DueQueue(n.cfg.Node)
	msg.Headers[wire.HeaderDeadAttempts] = int64(1)
	msg.Headers[wire.HeaderDeadReason] = wire.DeadReasonMalformed
	msg.Headers[wire.HeaderDeadError] = truncateText(why.Error(), 4096)
	msg.Headers[wire.HeaderDeadTime] = time.Now().UTC().Format(time.RFC3339Nano)
	key := headerString(d.Headers, wire.HeaderRoutingKey)
	if wire.ValidateEventType(key) != nil {
		key = d.RoutingKey
	}
	if n.settleDueAsDead(s, d, key, msg, "malformed due message") {
		n.log.Warn("delays: a malformed due message was dead-lettered", "message_id", d.MessageId, "err", why)
	}
}

// setAsideDue dead-letters a due event that must not be delivered (its
// module was removed from the node's configuration, or lost the grant of
// its type): msg as the mover would have published it, with reason
// revoked and why, and no x-mesh-dead-queue (no queue gave up on it), so
// that a replay sends it to mesh.events. It reports whether d was
// settled; if the dead letter could not be published, d goes back to the
// due queue after a pause.
func (n *Node) setAsideDue(s *session, d amqp.Delivery, key string, msg amqp.Publishing, why string) bool {
	msg.Headers = maps.Clone(msg.Headers)
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Expiration = "" // a dead letter is kept until someone looks
	msg.Headers[wire.HeaderUserID] = d.UserId
	msg.Headers[wire.HeaderDeadAttempts] = int64(1)
	msg.Headers[wire.HeaderDeadReason] = wire.DeadReasonRevoked
	msg.Headers[wire.HeaderDeadError] = truncateText(why, 4096)
	msg.Headers[wire.HeaderDeadTime] = time.Now().UTC().Format(time.RFC3339Nano)
	return n.settleDueAsDead(s, d, key, msg, "revoked due event")
}

// settleDueAsDead publishes msg, the dead letter of due message d (what it
// is, for the log), to mesh.events.dead with key, confirmed, then
// acknowledges d, and reports whether d was settled. If the publish
// fails, d goes back to the due queue after a pause; if the ack does, the
// broker delivers d again, to be dead-lettered again with the same id.
func (n *Node) settleDueAsDead(s *session, d amqp.Delivery, key string, msg amqp.Publishing, what string) bool {
	ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
	defer cancel()
	if err := s.pub.publish(ctx, wire.ExchangeDead, key, msg); err != nil {
		n.log.Error("delays: a "+what+" could not be dead-lettered; it goes back to the due queue", "message_id", d.MessageId, "err", err)
		select {
		case <-time.After(time.Second):
		case <-s.lost:
			return false
		case <-n.closing:
		}
		_ = d.Nack(false, true)
		return false
	}
	return d.Ack(false) == nil
}

// headerString is h[name] if it is a string, else "".
func headerString(h amqp.Table, name string) string {
	s, _ := h[name].(string)
	return s
}
