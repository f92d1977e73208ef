// Package queuemove moves a live queue to settings that only its
// arguments carry (its type, its priorities; RabbitMQ cannot change them
// in place), without losing a message: its messages go to a temporary
// queue, the queue is declared anew, and they come back
// (docs/adr/0043-queue-settings-by-policy.md).
//
// The steps, each of which may be interrupted and run again (Migrate reads
// where it stands from the broker: the temporary queue's existence, the
// queue's arguments, the bindings of both):
//
//  1. declare the temporary queue (its existence tells the node's module to
//     stop consuming the queue: runtime.MigrationQueue);
//  2. bind it as the queue is bound, then unbind the queue: new messages go
//     to the temporary queue (one routed between the two goes to both: the
//     consumer's de-duplication by event id drops the second);
//  3. wait until the queue has no consumer;
//  4. move the queue's messages to the temporary queue, each acknowledged
//     on the queue only once the broker confirmed its copy;
//  5. delete the queue (only if it is empty and unused) and declare it with
//     the new arguments (its policy was set at step 1);
//  6. bind it, unbind the temporary queue, move the messages back;
//  7. delete the temporary queue: the module consumes again.
//
// A moved message is published to the queue through the default exchange,
// as meshctl's replays are, with its event type in x-mesh-routing-key and
// its original publisher's user in x-mesh-user-id (which the node honours
// only where the mover's user is its own: otherwise the event's user is
// the mover's, as for a replay); the broker's counts of its deliveries and
// the runtime's of its attempts start again.
package queuemove

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/wire"
)

// ErrConsumers is returned when the queue still has consumers after the
// wait: a node that does not know migrations (v0.1.0), or a consumer of
// the operator's.
var ErrConsumers = errors.New("the queue still has consumers")

// ErrNoQueue is returned when neither the queue nor a migration of it
// exists.
var ErrNoQueue = errors.New("no such queue")

// Plan is what a queue migrates to.
type Plan struct {
	// Queue is the queue to move.
	Queue string
	// Temp is the temporary queue that holds its messages meanwhile
	// (runtime.MigrationQueue).
	Temp string
	// Args are the arguments to declare the queue with.
	Args amqp.Table
	// Policy, if not nil, is set before the queue is declared (the
	// settings a policy carries for it, such as its attempt limit).
	Policy *brokerapi.Policy
}

// Mover migrates queues on one broker.
type Mover struct {
	// Conn is the connection to publish and consume on, as the operator's
	// user.
	Conn *amqp.Connection
	// API is the management API of the same virtual host, for bindings,
	// arguments and policies.
	API *brokerapi.Client
	// ConsumerWait bounds the wait for the queue's consumers to go
	// (default 2 minutes: a node lets go at its next consumer check).
	ConsumerWait time.Duration
	// Batch is how many messages are moved per confirmation (default 256).
	Batch int
	// Progress, if not nil, is told each step.
	Progress func(step string)
	// AfterBatch, if not nil, is called after each batch moved (from is
	// the queue it came from, moved the count so far); an error stops the
	// migration there. Tests interrupt a migration with it.
	AfterBatch func(from string, moved int) error
}

// Report is what a migration did.
type Report struct {
	Resumed  bool // a migration of the queue had begun before
	Already  bool // the queue had the new arguments and no migration was under way
	Bindings []brokerapi.Binding
	MovedOut int // messages moved from the queue to the temporary queue
	MovedIn  int // and back
}

func (m *Mover) say(format string, args ...any) {
	if m.Progress != nil {
		m.Progress(fmt.Sprintf(format, args...))
	}
}

// Migrate moves plan.Queue to plan.Args, or finishes a migration of it that
// was interrupted.
func (m *Mover) Migrate(ctx context.Context, plan Plan) (Report, error) {
	var rep Report
	q, qErr := m.API.Queue(ctx, plan.Queue)
	if qErr != nil && !errors.Is(qErr, brokerapi.ErrNotFound) {
		return rep, fmt.Errorf("read queue %s: %w", plan.Queue, qErr)
	}
	qExists := qErr == nil
	_, tErr := m.API.Queue(ctx, plan.Temp)
	if tErr != nil && !errors.Is(tErr, brokerapi.ErrNotFound) {
		return rep, fmt.Errorf("read queue %s: %w", plan.Temp, tErr)
	}
	rep.Resumed = tErr == nil
	switch {
	case !rep.Resumed && !qExists:
		return rep, fmt.Errorf("%w: %s", ErrNoQueue, plan.Queue)
	case !rep.Resumed && SameArgs(q.Arguments, plan.Args):
		rep.Already = true
		if plan.Policy != nil {
			if err := m.API.PutPolicy(ctx, *plan.Policy); err != nil {
				return rep, err
			}
		}
		rep.Bindings, _ = m.API.Bindings(ctx, plan.Queue)
		return rep, nil
	}
	ch, err := m.Conn.Channel()
	if err != nil {
		return rep, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()

	// 1. The temporary queue: durable, quorum, no consumer but ours.
	if _, err := ch.QueueDeclare(plan.Temp, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return rep, fmt.Errorf("declare the temporary queue %s: %w", plan.Temp, err)
	}
	m.say("temporary queue %s declared", plan.Temp)
	// The queue's policy before anything of the queue goes: between its
	// deletion and its declaration no call can fail.
	if plan.Policy != nil {
		if err := m.API.PutPolicy(ctx, *plan.Policy); err != nil {
			return rep, err
		}
	}

	// 2. Its bindings: the queue's and those it has from an earlier run.
	var qBindings, tBindings []brokerapi.Binding
	if qExists {
		if qBindings, err = m.API.Bindings(ctx, plan.Queue); err != nil {
			return rep, fmt.Errorf("read the bindings of %s: %w", plan.Queue, err)
		}
	}
	if tBindings, err = m.API.Bindings(ctx, plan.Temp); err != nil {
		return rep, fmt.Errorf("read the bindings of %s: %w", plan.Temp, err)
	}
	rep.Bindings = union(qBindings, tBindings)
	moving := qExists && !SameArgs(q.Arguments, plan.Args)
	if moving {
		for _, b := range rep.Bindings {
			if err := ch.QueueBind(plan.Temp, b.Key, b.Exchange, false, nil); err != nil {
				return rep, fmt.Errorf("bind %s to %s %q: %w", plan.Temp, b.Exchange, b.Key, err)
			}
		}
		for _, b := range qBindings {
			if err := ch.QueueUnbind(plan.Queue, b.Key, b.Exchange, nil); err != nil {
				return rep, fmt.Errorf("unbind %s from %s %q: %w", plan.Queue, b.Exchange, b.Key, err)
			}
		}
		m.say("new messages go to %s (%d bindings)", plan.Temp, len(rep.Bindings))

		// 3. No consumer on the queue.
		if err := m.waitNoConsumers(ctx, ch, plan.Queue); err != nil {
			return rep, err
		}
		// 4 and 5. Move out, delete, declare anew.
		for {
			n, err := m.move(ctx, plan.Queue, plan.Temp, &rep.MovedOut)
			if err != nil {
				return rep, err
			}
			m.say("moved %d messages to %s", n, plan.Temp)
			gone, err := m.deleteIfEmpty(plan.Queue)
			if err != nil {
				return rep, err
			}
			if gone {
				break
			}
			// A message or a consumer came meanwhile.
			if err := m.waitNoConsumers(ctx, ch, plan.Queue); err != nil {
				return rep, err
			}
		}
		m.say("queue %s deleted, empty", plan.Queue)
		qExists = false
	}
	if !qExists || !SameArgs(q.Arguments, plan.Args) {
		if _, err := ch.QueueDeclare(plan.Queue, true, false, false, false, plan.Args); err != nil {
			return rep, fmt.Errorf("declare queue %s with its new arguments: %w", plan.Queue, err)
		}
		m.say("queue %s declared with its new arguments", plan.Queue)
	}

	// 6. Bound as it was, the temporary queue unbound, messages back.
	for _, b := range rep.Bindings {
		if err := ch.QueueBind(plan.Queue, b.Key, b.Exchange, false, nil); err != nil {
			return rep, fmt.Errorf("bind %s to %s %q: %w", plan.Queue, b.Exchange, b.Key, err)
		}
	}
	for _, b := range rep.Bindings {
		if err := ch.QueueUnbind(plan.Temp, b.Key, b.Exchange, nil); err != nil {
			return rep, fmt.Errorf("unbind %s from %s %q: %w", plan.Temp, b.Exchange, b.Key, err)
		}
	}
	for {
		n, err := m.move(ctx, plan.Temp, plan.Queue, &rep.MovedIn)
		if err != nil {
			return rep, err
		}
		m.say("moved %d messages back to %s", n, plan.Queue)
		// 7. The temporary queue goes once empty.
		gone, err := m.deleteIfEmpty(plan.Temp)
		if err != nil {
			return rep, err
		}
		if gone {
			break
		}
	}
	m.say("temporary queue %s deleted: the module consumes again", plan.Temp)
	return rep, nil
}

// deleteIfEmpty deletes queue if it has no message and no consumer, and
// says whether it did. A quorum queue does not take the delete's if-empty
// and if-unused flags (RabbitMQ 3.10: 540 NOT_IMPLEMENTED), so its counts
// are read first; nothing routes to it by then (it is unbound, and the
// mover alone publishes to it), so none can come between.
func (m *Mover) deleteIfEmpty(queue string) (bool, error) {
	ch, err := m.Conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("read queue %s: %w", queue, err)
	}
	if q.Messages > 0 || q.Consumers > 0 {
		return false, nil
	}
	purged, err := ch.QueueDelete(queue, false, false, false)
	if err != nil {
		return false, fmt.Errorf("delete queue %s: %w", queue, err)
	}
	if purged > 0 {
		return true, fmt.Errorf("queue %s: %d messages came between its count and its deletion, and went with it", queue, purged)
	}
	return true, nil
}

// waitNoConsumers waits until queue has no consumer, checking every 200 ms
// (the broker says when a consumer goes only to its channel), for
// ConsumerWait at most.
func (m *Mover) waitNoConsumers(ctx context.Context, ch *amqp.Channel, queue string) error {
	wait := m.ConsumerWait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	said := false
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("read queue %s: %w", queue, err)
		}
		if q.Consumers == 0 {
			return nil
		}
		if !said {
			m.say("waiting for the %d consumers of %s to go (a node lets go at its next consumer check)", q.Consumers, queue)
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%w: %s has %d after %v: a node of v0.1.0 does not let go of it (stop its module, then run the migration again: it resumes)", ErrConsumers, queue, q.Consumers, wait)
		case <-tick.C:
		}
	}
}

// move moves every message of from to to, a batch at a time: each batch
// is published with confirms and acknowledged on from only once every
// copy is confirmed. A copy confirmed but not acknowledged (an interrupted
// move) is moved again by the next run: a duplicate that the consumer's
// de-duplication drops. It adds what it moved to *total and returns it.
func (m *Mover) move(ctx context.Context, from, to string, total *int) (int, error) {
	batch := m.Batch
	if batch <= 0 {
		batch = 256
	}
	ch, err := m.Conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, fmt.Errorf("confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, batch))
	user := amqpmsg.ConnUser(m.Conn)
	moved := 0
	for {
		var confs []*amqp.DeferredConfirmation
		var last uint64
		for len(confs) < batch {
			d, ok, err := ch.Get(from, false)
			if err != nil {
				return moved, fmt.Errorf("get from %s: %w", from, err)
			}
			if !ok {
				break
			}
			conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", to, true, false, Copy(d, user))
			if err != nil {
				return moved, fmt.Errorf("publish to %s: %w", to, err)
			}
			confs, last = append(confs, conf), d.DeliveryTag
		}
		if len(confs) == 0 {
			return moved, nil
		}
		for _, c := range confs {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return moved, err
			}
			if !ok {
				return moved, fmt.Errorf("the broker refused a copy for %s (nack): nothing of this batch is taken from %s", to, from)
			}
		}
		select {
		case r := <-returns:
			return moved, fmt.Errorf("a copy for %s came back (%s): nothing of this batch is taken from %s", to, r.ReplyText, from)
		default:
		}
		if err := ch.Ack(last, true); err != nil {
			return moved, fmt.Errorf("acknowledge on %s: %w", from, err)
		}
		moved += len(confs)
		*total += len(confs)
		if m.AfterBatch != nil {
			if err := m.AfterBatch(from, *total); err != nil {
				return moved, err
			}
		}
	}
}

// Copy is d as the mover publishes it to a queue through the default
// exchange, as user: its properties, body and headers, without the
// broker's and the runtime's bookkeeping, with its event type in
// x-mesh-routing-key (so the runtime reads it, the broker having verified
// the publisher) and its original publisher in x-mesh-user-id.
func Copy(d amqp.Delivery, user string) amqp.Publishing {
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = user
	eventType, origUser := d.RoutingKey, d.UserId
	if d.Exchange == "" {
		// Sent straight to the queue (a retry copy, a replay): its own
		// headers say what it is, its publisher having been verified.
		eventType = ""
		if rk, ok := d.Headers[wire.HeaderRoutingKey].(string); ok && d.UserId != "" {
			eventType = rk
		}
		// The publisher it names counts only if the broker verified the
		// copy's sender as the mover's own user (the runtime's rule for
		// its own retry copies: runtime/owned.go), so no one who may write
		// to the queue gets a user of their choosing through the move.
		if u, ok := d.Headers[wire.HeaderUserID].(string); ok && d.UserId != "" && d.UserId == user {
			origUser = u
		}
	}
	if eventType != "" {
		msg.Headers[wire.HeaderRoutingKey] = eventType
	}
	msg.Headers[wire.HeaderUserID] = origUser
	return msg
}

// SameArgs says whether a queue's arguments as the management API shows
// them (numbers as float64) are want.
func SameArgs(have map[string]any, want amqp.Table) bool {
	if len(have) != len(want) {
		return false
	}
	for k, w := range want {
		h, ok := have[k]
		if !ok || fmt.Sprint(h) != fmt.Sprint(w) {
			return false
		}
	}
	return true
}

// union is a and b without repeats, in order.
func union(a, b []brokerapi.Binding) []brokerapi.Binding {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(x, y brokerapi.Binding) int {
		return strings.Compare(x.Exchange+" "+x.Key, y.Exchange+" "+y.Key)
	})
	return out
}
