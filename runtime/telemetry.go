package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// The node's metrics, with OpenTelemetry (Config.MeterProvider; meshd
// exports them for Prometheus at /metrics). Counters the node keeps anyway
// (Stats, and each module's) are read by one callback when metrics are
// collected, so they cost the event path nothing; only the latency
// histograms are recorded as events are delivered and handled and calls
// answered. The depth of the modules' queues is read from the broker in
// the background (queuedepth.go) and observed from what it last read.

// meterName is the instrumentation scope of the node's metrics.
const meterName = "github.com/meshkit/mesh/runtime"

// Outcomes of a handler run or a call, as the metrics' outcome attribute.
const (
	outcomeOK        = "ok"
	outcomeError     = "error"     // failed: retried, or dead-lettered past the limit
	outcomePermanent = "permanent" // failed with sdk.Permanent
	outcomeTimeout   = "timeout"
)

// moduleCounts are one module's running totals, for its metrics.
type moduleCounts struct {
	emitted, restarts atomic.Uint64
	// queue is its queue as the node last read it from the broker
	// (queuedepth.go); nil while unknown.
	queue atomic.Pointer[queueStat]
	// outbox is the backlog of the module's outbox as its relay last
	// reported it (sdk/outbox); nil for a module without one.
	outbox atomic.Pointer[wire.OutboxStats]
	// origins holds an *originCounts by the x-source of the events the
	// module took, at most maxOrigins of them; originMu serializes adding.
	origins  sync.Map
	originMu sync.Mutex
	nOrigins int
}

// originCounts are one module's totals for the events of one origin: the
// module (or outside publisher) that emitted them, as x-source says.
type originCounts struct {
	attrs                                                          attribute.Set // module=<module>, origin=<origin>
	delivered, handled, failed, deadLettered, duplicates, filtered atomic.Uint64
	conflicts, identity                                            atomic.Uint64
}

// The origin attribute of what carries no usable x-source (a message
// from outside the mesh, on a queue a module consumes, or one that breaks
// the contract), and of every origin past the first maxOrigins a module
// saw: a publisher inventing sources cannot grow the metrics without
// bound.
const (
	originOutside = "outside"
	originOther   = "other"
	maxOrigins    = 100
)

// from is the counts of module m for the origin of d.
func (m *Module) from(d amqp.Delivery) *originCounts {
	src, _ := d.Headers[wire.HeaderSource].(string)
	if c, ok := m.counts.origins.Load(src); ok {
		return c.(*originCounts)
	}
	if wire.ValidateWord("source", src) != nil {
		src = originOutside
	}
	m.counts.originMu.Lock()
	defer m.counts.originMu.Unlock()
	if c, ok := m.counts.origins.Load(src); ok {
		return c.(*originCounts)
	}
	if m.counts.nOrigins >= maxOrigins {
		src = originOther
		if c, ok := m.counts.origins.Load(src); ok {
			return c.(*originCounts)
		}
		m.log.Warn("events from more origins than the metrics name; the rest count as origin \"other\"", "origins", maxOrigins)
	}
	c := &originCounts{attrs: attribute.NewSet(attribute.String("module", m.def.Name), attribute.String("origin", src))}
	m.counts.origins.Store(src, c)
	m.counts.nOrigins++
	return c
}

// telemetry holds the node's synchronous instruments and the registration
// of its observed ones.
type telemetry struct {
	handlerDuration metric.Float64Histogram // by module and outcome
	callDuration    metric.Float64Histogram // by tool and outcome
	delayLateness   metric.Float64Histogram // how late the mover published what came due
	timeInQueue     metric.Float64Histogram // by module: from an event's emit (or due) time to its delivery
	registration    metric.Registration
}

// startTelemetry makes the node's instruments on cfg.MeterProvider (a no-op
// one when nil).
func (n *Node) startTelemetry() error {
	mp := n.cfg.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	meter := mp.Meter(meterName)
	t := &n.telemetry
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	buckets := metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
	t.handlerDuration, err = meter.Float64Histogram("mesh.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("How long event handlers ran, by module and outcome (ok, error, permanent, timeout)."), buckets)
	add(err)
	t.callDuration, err = meter.Float64Histogram("mesh.rpc.call.duration", metric.WithUnit("s"),
		metric.WithDescription("How long tool calls made from this node took, by tool and outcome."), buckets)
	add(err)

	t.delayLateness, err = meter.Float64Histogram("mesh.delays.lateness", metric.WithUnit("s"),
		metric.WithDescription("How long after its due time (x-due) this node's mover published a delayed event to mesh.events: the delay's rounding up to the second, its time in the cascade's levels, and the mover's own."),
		metric.WithExplicitBucketBoundaries(.005, .01, .025, .05, .1, .25, .5, 1, 1.5, 2, 5, 10, 30, 60, 300))
	add(err)
	t.timeInQueue, err = meter.Float64Histogram("mesh.delivery.time_in_queue", metric.WithUnit("s"),
		metric.WithDescription("How long events waited before a module took them, by module: from the event's emit time (x-time), or its due time (x-due) for a delayed one, to its first delivery. Retries are not counted (their wait is their back-off)."),
		metric.WithExplicitBucketBoundaries(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
	add(err)

	counter := func(name, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithDescription(desc))
		add(err)
		return c
	}
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithDescription(desc))
		add(err)
		return g
	}
	var (
		connected   = gauge("mesh.connected", "1 while the node has its broker connections.")
		blocked     = gauge("mesh.publish.blocked", "1 while the broker blocks the node's publishing (a memory or disk alarm).")
		blocks      = counter("mesh.publish.blocks", "Times the broker blocked the node's publishing.")
		reconnects  = counter("mesh.reconnects", "Broker sessions regained after a loss.")
		disconnects = counter("mesh.disconnects", "Broker sessions lost.")
		confirmed   = counter("mesh.publish.confirmed", "Events the broker confirmed when first sent.")
		scheduled   = counter("mesh.delays.scheduled", "Delayed events (sdk.After, sdk.At) the broker confirmed into the delay cascade.")
		delays      = counter("mesh.delays.delivered", "Delayed events this node's mover published to mesh.events when due.")
		waiting     = gauge("mesh.delays.waiting", "Delayed events and retries this node scheduled and has not delivered yet (its book).")
		cancelled   = counter("mesh.delays.cancelled", "Delayed events that came due cancelled (meshctl delayed cancel) and were dropped.")
		atMostOnce  = counter("mesh.publish.at_most_once", "Events emitted at most once (sdk.AtMostOnce): handed to the connection, never confirmed, not in mesh.publish.confirmed.")
		refused     = counter("mesh.publish.refused", "Negative confirms from the broker (each retried).")
		backPress   = counter("mesh.emit.back_pressure", "Emits refused because the spool was full, or blocked with no spool.")
		spooled     = counter("mesh.spool.appended", "Events written to the local spool.")
		resent      = counter("mesh.spool.resent", "Spooled events resent and confirmed.")
		expired     = counter("mesh.spool.expired", "Spooled events whose TTL passed before they could be resent.")
		spoolDead   = counter("mesh.spool.dead_lettered", "Spooled events the broker refused until emit_timeout, moved to the dead letters.")
		returned    = counter("mesh.spool.returned", "Spooled events the broker returned as unroutable, kept in mesh.unrouted.")
		spoolEvents = gauge("mesh.spool.events", "Events in the spool now.")
		spoolBytes  = gauge("mesh.spool.bytes", "Bytes of events in the spool now.")
		checks      = counter("mesh.rpc.server_checks", "Times the node asked the broker whether a tool has a server.")
		emitted     = counter("mesh.events.emitted", "Events a module emitted (confirmed, or on the node's disk), by module.")
		delivered   = counter("mesh.events.delivered", "Deliveries to a module (redeliveries and duplicates included), by module and origin (the emitting module, from x-source).")
		handled     = counter("mesh.events.handled", "Events a module's handler took (acknowledged), by module and origin.")
		failed      = counter("mesh.handler.failures", "Failed handler attempts, retried or past the attempt limit (a permanent failure is dead-lettered at once, not counted here), by module and origin.")
		deadLet     = counter("mesh.events.dead_lettered", "Events a module gave up on, by module and origin.")
		duplicates  = counter("mesh.events.duplicates", "Deliveries of events a module had handled, acknowledged without handling, by module and origin.")
		conflicts   = counter("mesh.events.conflicts", "Deliveries of an event id a module had handled with other content (type, body or the headers of its meaning): not handled, dead-lettered with reason conflict, by module and origin.")
		identity    = counter("mesh.identity.mismatches", "Events and tool requests a module took whose x-node another broker user published than the node's identity rule names (identity:), by module and origin: dead-lettered with reason identity or refused as forbidden (enforce), or delivered with a warning (warn).")
		filtered    = counter("mesh.events.filtered", "Deliveries no filter of a module's handlers accepted (sdk.Filter), acknowledged without handling, by module and origin.")
		restarts    = counter("mesh.module.restarts", "Times a module process was started again after it went away, by module.")
		queuesDown  = gauge("mesh.module.queues_down", "Consumed queues a module cannot consume now (deleted, say), by module; each is tried again.")
		depth       = gauge("mesh.queue.depth", "Events ready in a module's queue (<node>.<module>.events), not counting those delivered and not yet acknowledged, by module; as the broker said at the node's last look (every heartbeat interval).")
		consumers   = gauge("mesh.queue.consumers", "Consumers of a module's queue, on every node, by module; as the broker said at the node's last look.")
		obUnsent    = gauge("mesh.outbox.unsent", "Rows of a module's outbox (sdk/outbox) committed and not yet published, by module, as its relay last reported (about every second).")
		obOldest    = gauge("mesh.outbox.oldest_age_seconds", "Age of the oldest unpublished row of a module's outbox, by module (0 for none).")
		obAside     = gauge("mesh.outbox.set_aside", "Rows of a module's outbox the node refused for good (an ungranted type, say), kept in its database, by module.")
		obErrors    = counter("mesh.outbox.relay_errors", "Failed passes of a module's outbox relay (each retried with back-off), by module.")
		hottest     = gauge("mesh.group.key_waiting_max", "Events of one key an ordered group's member holds (in hand and waiting behind it), for its hottest key, by module (0 when none holds more than one): near prefetch, that key holds up the other keys of its partition (meshctl groups names it).")
		owned       = gauge("mesh.group.partitions_owned", "Partitions of a module's ordered group (partitions:) this node's consumers are fed now, by module: its share of the group's partitions, as far as it can tell (an idle partition it owns is not known to be one).")
	)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node %s: metrics: %w", n.cfg.Node, err)
	}
	b2i := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	t.registration, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := n.Stats()
		o.ObserveInt64(connected, b2i(st.Connected))
		o.ObserveInt64(blocked, b2i(st.Blocked))
		o.ObserveInt64(blocks, int64(st.Blocks))
		o.ObserveInt64(reconnects, int64(st.Reconnects))
		o.ObserveInt64(disconnects, int64(st.Disconnects))
		o.ObserveInt64(confirmed, int64(st.Emitted))
		o.ObserveInt64(scheduled, int64(st.Scheduled))
		o.ObserveInt64(delays, int64(st.DelaysDelivered))
		o.ObserveInt64(atMostOnce, int64(st.AtMostOnce))
		o.ObserveInt64(waiting, int64(st.DelaysWaiting))
		o.ObserveInt64(cancelled, int64(st.DelaysCancelled))
		o.ObserveInt64(refused, int64(st.Refused))
		o.ObserveInt64(backPress, int64(st.BackPressure))
		o.ObserveInt64(spooled, int64(st.Spooled))
		o.ObserveInt64(resent, int64(st.Resent))
		o.ObserveInt64(expired, int64(st.Expired))
		o.ObserveInt64(spoolDead, int64(st.SpoolDeadLettered))
		o.ObserveInt64(returned, int64(st.SpoolUnrouted))
		o.ObserveInt64(spoolEvents, int64(st.SpoolEvents))
		o.ObserveInt64(spoolBytes, st.SpoolBytes)
		o.ObserveInt64(checks, int64(st.ServerChecks))
		mods, _ := n.loaded()
		for _, m := range mods {
			attrs := metric.WithAttributeSet(m.attrs)
			o.ObserveInt64(emitted, int64(m.counts.emitted.Load()), attrs)
			o.ObserveInt64(restarts, int64(m.counts.restarts.Load()), attrs)
			o.ObserveInt64(queuesDown, int64(len(m.QueuesDown())), attrs)
			if m.cfg.Partitions > 0 {
				o.ObserveInt64(owned, int64(len(m.ownedPartitions())), attrs)
				hot, most := m.hotKeys(1), int64(0)
				if len(hot) > 0 {
					most = int64(hot[0].Waiting)
				}
				o.ObserveInt64(hottest, most, attrs)
			}
			if q := m.counts.queue.Load(); q != nil { // unknown: not observed
				o.ObserveInt64(depth, q.messages, attrs)
				o.ObserveInt64(consumers, q.consumers, attrs)
			}
			if ob := m.counts.outbox.Load(); ob != nil { // no outbox: not observed
				age := int64(0)
				if !ob.Oldest.IsZero() {
					age = int64(time.Since(ob.Oldest).Seconds())
				}
				o.ObserveInt64(obUnsent, ob.Unsent, attrs)
				o.ObserveInt64(obOldest, age, attrs)
				o.ObserveInt64(obAside, ob.SetAside, attrs)
				o.ObserveInt64(obErrors, int64(ob.RelayErrors), attrs)
			}
			m.counts.origins.Range(func(_, v any) bool {
				c := v.(*originCounts)
				attrs := metric.WithAttributeSet(c.attrs)
				o.ObserveInt64(delivered, int64(c.delivered.Load()), attrs)
				o.ObserveInt64(handled, int64(c.handled.Load()), attrs)
				o.ObserveInt64(failed, int64(c.failed.Load()), attrs)
				o.ObserveInt64(deadLet, int64(c.deadLettered.Load()), attrs)
				o.ObserveInt64(duplicates, int64(c.duplicates.Load()), attrs)
				o.ObserveInt64(conflicts, int64(c.conflicts.Load()), attrs)
				o.ObserveInt64(identity, int64(c.identity.Load()), attrs)
				o.ObserveInt64(filtered, int64(c.filtered.Load()), attrs)
				return true
			})
		}
		return nil
	}, connected, blocked, blocks, reconnects, disconnects, confirmed, scheduled, delays, atMostOnce, waiting, cancelled, refused, backPress, spooled, resent, expired, spoolDead, returned,
		spoolEvents, spoolBytes, checks, emitted, delivered, handled, failed, deadLet, duplicates, conflicts, identity, filtered, restarts, queuesDown, depth, consumers,
		obUnsent, obOldest, obAside, obErrors, owned, hottest)
	if err != nil {
		return fmt.Errorf("node %s: metrics: %w", n.cfg.Node, err)
	}
	return nil
}

// stopTelemetry unregisters the observed instruments.
func (n *Node) stopTelemetry() {
	if n.telemetry.registration != nil {
		_ = n.telemetry.registration.Unregister()
	}
}

// outcomeOptions are the record options of each outcome of module's
// handlers, made once at load (an attribute set costs allocations).
func outcomeOptions(module string) map[string]metric.RecordOption {
	opts := make(map[string]metric.RecordOption, 4)
	for _, o := range []string{outcomeOK, outcomeError, outcomePermanent, outcomeTimeout} {
		opts[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("module", module), attribute.String("outcome", o)))
	}
	return opts
}

// recordHandler records one handler run of m.
func (m *Module) recordHandler(start time.Time, outcome string) {
	m.node.telemetry.handlerDuration.Record(context.Background(), time.Since(start).Seconds(), m.outcomeOpts[outcome])
}

// maxClockSkew is how far in the future an event's time may be, from
// another node's clock, and still be recorded as no time in the queue;
// one further ahead says nothing of the queue, and is not recorded.
const maxClockSkew = time.Minute

// recordTimeInQueue records how long a delivery of m waited: from emitted,
// the event's time, or from its due time (x-due, a delayed event's) when
// later, until now. It records nothing for an unknown time (zero) or one
// more than maxClockSkew ahead; a time less ahead (another node's clock)
// counts as no wait.
func (m *Module) recordTimeInQueue(emitted time.Time, headers amqp.Table) {
	if emitted.IsZero() {
		return
	}
	if due, ok := headers[wire.HeaderDue].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, due); err == nil && t.After(emitted) {
			emitted = t
		}
	}
	waited := time.Since(emitted)
	if waited < -maxClockSkew {
		return
	}
	m.node.telemetry.timeInQueue.Record(context.Background(), max(waited, 0).Seconds(), m.queueTimeOpt)
}

// maxCallOpts bounds the tool and outcome pairs whose record options a
// node keeps; past it, each call's are made for it (a module calling ever
// new tool names must not grow the node's memory).
const maxCallOpts = 1024

// recordCall records one call of tool made from the node.
func (n *Node) recordCall(start time.Time, tool, outcome string) {
	key := tool + "\x00" + outcome
	opt, ok := n.callOpts.Load(key)
	if !ok {
		opt = metric.WithAttributeSet(attribute.NewSet(attribute.String("tool", tool), attribute.String("outcome", outcome)))
		if n.callOptsLen.Load() < maxCallOpts {
			if _, loaded := n.callOpts.LoadOrStore(key, opt); !loaded {
				n.callOptsLen.Add(1)
			}
		}
	}
	n.telemetry.callDuration.Record(context.Background(), time.Since(start).Seconds(), opt.(metric.RecordOption))
}

// callOutcome is the outcome attribute of a call's error: ok, timeout,
// no_server, or error (the tool's error, transient or permanent, or the
// connection).
func callOutcome(err error) string {
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, context.DeadlineExceeded):
		return outcomeTimeout
	case errors.Is(err, sdk.ErrNoServer):
		return "no_server"
	case errors.Is(err, sdk.ErrPermanent):
		return outcomePermanent
	}
	return outcomeError
}

// outcomeOf is the outcome attribute of a handler's error.
func outcomeOf(err error, timedOut bool) string {
	switch {
	case timedOut || errors.Is(err, context.DeadlineExceeded):
		return outcomeTimeout
	case err == nil:
		return outcomeOK
	case errors.Is(err, sdk.ErrPermanent) || errors.Is(err, sdk.ErrForbidden):
		return outcomePermanent
	}
	return outcomeError
}
