package runtime

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/cloudevents"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// A module with a DeadLetters handler (sdk.Module.DeadLetters) receives
// the mesh's dead letters on its own queue <node>.<module>.dead, bound to
// mesh.events.dead with "#". That queue has no dead-letter exchange: a
// dead letter is never dead-lettered again, or a failing handler would
// loop it through mesh.events.dead forever. Past the attempt limit, or on
// a Permanent error, the dead letter is dropped with an error in the log;
// the operator's queue mesh.dead-letters keeps its own copy.

// deadQueueArgs are the arguments of a module's dead-letter queue: quorum,
// like the keeper queues, with the module's attempt limit and no
// dead-letter exchange, so a consumer that crashes on every attempt ends
// with the broker dropping the copy rather than looping it.
func deadQueueArgs(mc ModuleConfig) amqp.Table {
	return amqp.Table{"x-queue-type": QueueQuorum, "x-delivery-limit": int64(mc.MaxAttempts - 1)}
}

// consumeDead declares the module's dead-letter queue, binds it and
// starts its workers.
func (m *Module) consumeDead(ctx context.Context, s *session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	queue := wire.ModuleDeadQueue(m.node.cfg.Node, m.def.Name)
	ch, err := m.node.declareQueue(ctx, s, m.openTracked(s), m.untrack, queue, deadQueueArgs(m.cfg))
	if err != nil {
		return fmt.Errorf("declare the dead-letter queue %s (if it exists with another attempt limit, the broker refuses it: delete the queue or keep the limit): %w", queue, err)
	}
	patterns, err := m.deadLetterPatterns()
	if err != nil {
		return err
	}
	if err := m.reconcileDeadBindings(ch, queue, patterns); err != nil {
		return err
	}
	if err := ch.Qos(m.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	tag := m.consumerTag(".dead")
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", queue, err)
	}
	m.addTag(ch, tag, queue)
	go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	for range m.cfg.Concurrency {
		m.startDeadWorker(deliveries)
	}
	return nil
}

// reconcileDeadBindings binds the module's dead-letter queue to exactly
// the patterns of its grant: those recorded for it earlier and no longer
// granted, and # when not granted (every earlier node bound it), are
// unbound, so a narrowed grant takes effect on the broker.
func (m *Module) reconcileDeadBindings(ch *amqp.Channel, queue string, want []string) error {
	had, err := m.node.bindings.load(queue)
	if err != nil {
		return err
	}
	for _, p := range want {
		if err := ch.QueueBind(queue, p, wire.ExchangeDead, false, nil); err != nil {
			return fmt.Errorf("bind %s to %q on %s: %w", queue, p, wire.ExchangeDead, err)
		}
	}
	for _, p := range append(had, "#") {
		if slices.Contains(want, p) {
			continue
		}
		if err := ch.QueueUnbind(queue, p, wire.ExchangeDead, nil); err != nil {
			return fmt.Errorf("unbind %s from %q on %s: %w", queue, p, wire.ExchangeDead, err)
		}
	}
	return m.node.bindings.store(queue, want)
}

// startDeadWorker is startWorker for dead letters.
func (m *Module) startDeadWorker(deliveries <-chan amqp.Delivery) {
	m.workers.Add(1)
	go func() {
		defer m.workers.Done()
		for d := range deliveries {
			if replaced := m.handleDead(d, deliveries); replaced {
				return
			}
		}
	}()
}

// handleDead runs one dead letter through the DeadLetters handler: acked
// on success, retried after a back-off on failure, dropped past the
// attempt limit or on a Permanent error. It reports, like handle, whether
// the handler overran its timeout.
func (m *Module) handleDead(d amqp.Delivery, deliveries <-chan amqp.Delivery) (replaced bool) {
	m.from(d).delivered.Add(1)
	ev := deadEventOf(d)
	err, overran := m.call(m.def.DeadLetters, ev, d, wire.ModuleDeadQueue(m.node.cfg.Node, m.def.Name), func() {
		m.startDeadWorker(deliveries)
		m.deadFailed(d, ev, fmt.Errorf("handler timed out after %v", m.cfg.HandlerTimeout))
	})
	switch {
	case overran:
		return true
	case err == nil:
		m.from(d).handled.Add(1)
		if err := d.Ack(false); err != nil {
			m.log.Warn("ack of a dead letter failed; it will be delivered again", "event_id", ev.ID, "err", err)
		}
	default:
		m.deadFailed(d, ev, err)
	}
	return false
}

// deadFailed settles a handling of a dead letter that did not succeed,
// by the policy of its (quorum) queue: dropped if the failure is permanent
// or the attempt the last, otherwise returned to the queue after a
// back-off (a reject with requeue counts toward the queue's delivery
// limit).
func (m *Module) deadFailed(d amqp.Delivery, ev sdk.Event, cause error) {
	o := execute.Of(cause)
	if o == execute.Failed {
		m.node.stats.failed.Add(1)
		m.from(d).failed.Add(1)
	}
	v := m.policy(true).decide(o, ev.Attempt)
	if v.settle == settleDead {
		m.dropDead(d, ev, cause)
		return
	}
	m.warnFailed("dead-letter handler failed; will retry", ev.Type, ev.ID, ev.Attempt, v.delay, cause)
	m.later(v.delay, func() {
		if err := d.Reject(true); err != nil {
			m.log.Warn("requeue failed; the dead letter returns when the channel closes", "err", err)
		}
	})
}

// dropDead acknowledges a dead letter the module's handler gave up on.
func (m *Module) dropDead(d amqp.Delivery, ev sdk.Event, cause error) {
	m.log.Error("dead letter dropped by the module's DeadLetters handler; mesh.dead-letters keeps its copy",
		"event_id", ev.ID, "event_type", ev.Type, "dead_queue", ev.DeadQueue, "attempt", ev.Attempt, "err", cause)
	if err := d.Ack(false); err != nil {
		m.log.Warn("ack of a dropped dead letter failed; it will be delivered again", "event_id", ev.ID, "err", err)
	}
}

// deadEventOf is what a DeadLetters handler sees of a dead letter. A dead
// letter that breaks the wire contract is read as far as it can be, with
// every header as text.
func deadEventOf(d amqp.Delivery) sdk.Event {
	msg := deadletters.ReadDead(d)
	attempt := 1
	if n, ok := d.Headers["x-delivery-count"].(int64); ok && n >= 0 {
		attempt = int(n) + 1
	}
	ev := sdk.Event{
		Type:         msg.Type,
		Body:         d.Body,
		Attempt:      attempt,
		Redelivered:  d.Redelivered,
		UserID:       msg.UserID, // the original publisher's, as deadletters reads it (x-mesh-user-id where honoured)
		DeadQueue:    msg.Queue,
		DeadReason:   msg.Reason,
		DeadError:    msg.Error,
		DeadAttempts: msg.Attempts,
		DeadTime:     msg.Time,
	}
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	if err == nil {
		ev.ID, ev.Source, ev.Node, ev.Time = meta.ID, meta.Source, meta.Node, meta.Time
		ev.CausationID, ev.Schema, ev.Headers = meta.CausationID, meta.Schema, maps.Clone(meta.Extra)
		maps.DeleteFunc(ev.Headers, func(k, _ string) bool { return deadBookkeeping(k) })
		return ev
	}
	// Read what can be read; the handler gets every header as text.
	ev.ID, ev.Source, ev.Node = msg.ID, msg.Source, msg.SourceNode
	if t, perr := time.Parse(time.RFC3339Nano, deadletters.HeaderText(d.Headers[wire.HeaderTime])); perr == nil {
		ev.Time = t.UTC()
	}
	ev.CausationID = deadletters.HeaderText(d.Headers[wire.HeaderCausationID])
	ev.Schema = deadletters.HeaderText(d.Headers[wire.HeaderSchema])
	ev.Headers = make(map[string]string, len(d.Headers))
	for k, v := range d.Headers {
		if deadBookkeeping(k) {
			continue
		}
		ev.Headers[k] = deadletters.HeaderText(v)
	}
	if d.ContentType != "" {
		ev.Headers["content-type"] = d.ContentType
	}
	// A CloudEvent from a queue a module consumed is read as one, as
	// Consume read it (ADR 34).
	if ce, ok, cerr := cloudevents.Read(d.Headers, d.ContentType, d.Body); ok && cerr == nil {
		setCloudEvent(&ev, ce)
		return ev
	}
	if ev.DeadReason == "" {
		ev.DeadReason = wire.DeadReasonMalformed
		ev.DeadError = err.Error()
	}
	return ev
}

// deadBookkeeping tells the headers a DeadLetters handler does not get:
// they are in the Dead fields or UserID, or the broker's own.
func deadBookkeeping(k string) bool {
	return strings.HasPrefix(k, "x-mesh-dead-") || k == wire.HeaderUserID || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
		strings.HasPrefix(k, "x-last-death-") || k == "x-delivery-count"
}
