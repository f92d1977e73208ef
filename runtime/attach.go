package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Attaching: how a module comes to consume its queues and serve its tools
// on a session, and comes back after losing them. The invariants, each
// held by the test named:
//
//   - A module attaches only once it is attachable: Setup has returned and
//     its record of handled ids is open (attachFirst sets it under
//     resumeMu). Before, a new session leaves it alone; after, a session
//     that came while it started attaches it exactly once, since attach and
//     resume both run under resumeMu and record the session in attachedOn
//     (TestModuleLoadedDuringOutageAttachesOnce).
//   - One attach or resume at a time (resumeMu). A resume onto the session
//     the module is attached on does nothing unless it lost a channel there
//     (again).
//   - A stopped module gains no consumer: track refuses a channel after
//     Stop, and every timer below gives up once it sees stopped
//     (TestPluginStopDuringRestart for a module process; a Stop racing a
//     resume in-process is not forced by a test of its own).
//   - The timers that attach again, and what ends each: a resume that
//     failed (resumeFailures grows its back-off) and the first attach the
//     broker could not give yet end when the session is lost (the
//     supervisor resumes every module on the next one); resumeLater, after
//     the broker closed a channel or cancelled a consumer, ends unless the
//     session is still current and the channel still the module's
//     (TestModuleWhoseQueueIsDeletedAttachesAgain); serveLater ends when
//     another attach numbered itself after it (serveTry)
//     (TestLoadWhileAServeQueuesNodeIsDown).
//   - What a module held on a lost channel went back to its queue; a
//     handler that finished meanwhile is not run again (the record of
//     handled ids: see handle).

// attachFirst makes the module attachable and attaches it on the node's
// session, if it has one; a node without one (the broker is away)
// attaches it when it connects (resume). Both happen under resumeMu and
// record the session, so a session that comes while the module starts
// attaches it exactly once, and never before Setup has returned and the
// record of handled ids is open.
func (m *Module) attachFirst(ctx context.Context, subs []subscription, tools []tool) error {
	m.resumeMu.Lock()
	defer m.resumeMu.Unlock()
	m.attachable = true
	s := m.node.session()
	if s == nil {
		if m.node.cfg.Ephemeral {
			return wire.ErrConnectionLost
		}
		m.log.Info("the broker is away: the module attaches once the node connects")
		return nil
	}
	if err := m.attach(ctx, s, subs, tools, unavailable); err != nil {
		switch {
		case m.node.cfg.Ephemeral:
			return err
		case s.isLost():
			// Lost while attaching: the supervisor attaches it on the next
			// session.
			m.log.Warn("the connection was lost while the module attached; it attaches once the node reconnects", "err", err)
			return nil
		case unavailable(err) || errors.Is(err, errMigrating):
			// Not the module's mistake, and not for good: on a cluster,
			// its own queue without a leader, say. (Tools and consumed
			// queues the broker will not give now are left for later by
			// attach itself.) The module loads and attaches as a resume
			// does, with back-off; until then it is not ready.
			delay := jitter(expBackoff(time.Second, 30*time.Second, 1))
			m.log.Error("the broker cannot give the module its queues now; it attaches when it can", "err", err, "retry_in", delay)
			time.AfterFunc(delay, func() { m.resume(s, true) })
			return nil
		}
		return err
	}
	m.attachedOn.Store(s)
	return nil
}

// attach consumes the module's queue and serves its tools on s. Tools the
// broker will not serve now, and consumed queues it will not give, with an
// error later accepts (on a cluster, a serve queue is a classic queue,
// unavailable while its home node is down) do not fail the attach: the
// module handles its events, and serveLater and reconsumeLater try them
// again. A resume accepts every error (always); the first attach only those
// that last a while (unavailable), so that a mistake fails the load.
func (m *Module) attach(ctx context.Context, s *session, subs []subscription, tools []tool, later func(error) bool) error {
	if len(subs) > 0 {
		if err := m.consume(ctx, s, subs); err != nil {
			return err
		}
	} else if err := m.unbindAll(s); err != nil {
		return err
	}
	if m.def.DeadLetters != nil {
		if err := m.consumeDead(ctx, s); err != nil {
			return err
		}
	}
	if err := m.consumeQueues(ctx, s, m.queues, later); err != nil {
		return err
	}
	if m.def.History != nil {
		if err := m.readHistory(ctx, s); err != nil {
			return err
		}
	}
	m.serveTry.Add(1) // a pending serveLater is for an earlier attach
	if len(tools) > 0 {
		if err := m.serve(ctx, s, tools); err != nil {
			if !later(err) || s.isLost() || errors.Is(err, sdk.ErrClosed) {
				return err
			}
			m.log.Error("the module's tools cannot be served now; its events are handled, and its tools are tried again", "err", err)
			m.setToolsDown(err.Error())
			m.serveLater(s, tools, m.serveTry.Load(), 1)
			return nil
		}
	}
	m.setToolsDown("")
	return nil
}

// setToolsDown records why the module's tools cannot be served now, or
// that they are ("").
func (m *Module) setToolsDown(why string) {
	m.holdMu.Lock()
	m.toolsDown = why
	m.holdMu.Unlock()
}

// ToolsDown is why the module's tools cannot be served now (they are
// tried again), or "".
func (m *Module) ToolsDown() string {
	m.holdMu.Lock()
	defer m.holdMu.Unlock()
	return m.toolsDown
}

// always accepts every error (attach's later, for a resume).
func always(error) bool { return true }

// unavailable reports whether the broker refused err for a while rather
// than for good: on a cluster, a classic queue whose home node is down
// (404 "... is down or inaccessible") or a quorum queue without a leader
// (541 INTERNAL_ERROR, as while one is elected). A queue that does not
// exist, or that the user may not read, is not: it fails the load.
func unavailable(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Server && (ae.Code == amqp.InternalError || (ae.Code == amqp.NotFound && strings.Contains(ae.Reason, "down or inaccessible")))
}

// serveLater tries again, after a back-off, to serve tools on s for the
// attach numbered try, until it works, s is lost, the module stops, or
// another attach replaced that one.
func (m *Module) serveLater(s *session, tools []tool, try uint64, attempt int) {
	delay := jitter(expBackoff(time.Second, 30*time.Second, attempt))
	time.AfterFunc(delay, func() {
		m.resumeMu.Lock()
		defer m.resumeMu.Unlock()
		m.mu.Lock()
		stopped := m.stopped
		m.mu.Unlock()
		if stopped || s.isLost() || m.serveTry.Load() != try {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.serve(ctx, s, tools); err != nil {
			if errors.Is(err, sdk.ErrClosed) || s.isLost() {
				return // stopped, or lost with its session: the next attach serves them
			}
			m.log.Warn("the module's tools still cannot be served; trying again", "err", err, "attempt", attempt+1)
			m.serveLater(s, tools, try, attempt+1)
			return
		}
		m.setToolsDown("")
		m.log.Info("the module's tools are served again", "tools", len(tools))
	})
}

// resume brings the module's consumers and tool servers back on s after
// their channels were lost; what was in flight on the old channels went
// back to the queues (and a handler that finished meanwhile is not run
// again: see handle). again says the module lost a channel on s itself
// and must attach on s again; otherwise (a new session) a module already
// attached on s is left alone. On failure it tries again after a
// back-off while s lasts.
func (m *Module) resume(s *session, again bool) {
	m.resumeMu.Lock()
	defer m.resumeMu.Unlock()
	if !m.attachable || (!again && m.attachedOn.Load() == s) {
		return // not started yet (it attaches itself), or attached on s already
	}
	m.mu.Lock()
	if m.stopped || s.isLost() {
		m.mu.Unlock()
		return
	}
	old := m.consumers
	m.consumers = nil
	subs, tools := slices.Clone(m.subs), slices.Clone(m.tools)
	m.mu.Unlock()
	m.stopHistoryReader() // before its channel closes below
	for _, c := range old {
		_ = c.ch.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.attach(ctx, s, subs, tools, always); err != nil {
		if s.isLost() || errors.Is(err, sdk.ErrClosed) {
			return
		}
		delay := jitter(expBackoff(time.Second, 30*time.Second, int(m.resumeFailures.Add(1))))
		m.log.Error("resuming the module failed; trying again", "err", err, "retry_in", delay)
		time.AfterFunc(delay, func() { m.resume(s, true) })
		return
	}
	m.resumeFailures.Store(0)
	m.attachedOn.Store(s)
	m.log.Info("module attached", "queue", m.queue)
}

// openTracked opens channels on s's subscription connection that the
// module tracks (track).
func (m *Module) openTracked(s *session) func() (*amqp.Channel, error) {
	return func() (*amqp.Channel, error) {
		ch, err := s.subConn.Channel()
		if err != nil {
			return nil, err
		}
		return ch, m.track(ch)
	}
}

// untrack forgets a channel the module consumed on and closes it.
func (m *Module) untrack(ch *amqp.Channel) {
	m.mu.Lock()
	m.consumers = slices.DeleteFunc(m.consumers, func(c consumerChannel) bool { return c.ch == ch })
	m.mu.Unlock()
	_ = ch.Close()
}

// track adds a channel the module consumes on, unless the module stopped
// meanwhile (then it closes ch and says so).
func (m *Module) track(ch *amqp.Channel) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		ch.Close()
		return sdk.ErrClosed
	}
	m.consumers = append(m.consumers, consumerChannel{ch: ch, flow: &consumerFlow{}})
	return nil
}

// flowOf is the flow of the consumer on ch (a fresh one if ch is not
// tracked: its workers then report to no check).
func (m *Module) flowOf(ch *amqp.Channel) *consumerFlow {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.consumers {
		if c.ch == ch {
			return c.flow
		}
	}
	return &consumerFlow{}
}

// addTag records a consumer tag on the channel ch and the queue it
// consumes, for Stop to cancel and checkConsumers to check.
func (m *Module) addTag(ch *amqp.Channel, tag, queue string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.consumers {
		if m.consumers[i].ch == ch && !slices.Contains(m.consumers[i].tags, tag) {
			m.consumers[i].tags = append(m.consumers[i].tags, tag)
			m.consumers[i].queues = append(m.consumers[i].queues, queue)
		}
	}
}

// consume declares the module's queue, reconciles its bindings and starts
// the workers. A module of a group (ModuleConfig.Group) consumes its
// group's queue beside its own, on the same channel: the group's queue is
// bound to its patterns and its own to none (what the node retries waits
// there), so that events its own queue held before it joined the group are
// still handled, and none arrive there any more.
func (m *Module) consume(ctx context.Context, s *session, subs []subscription) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.node.migrating(s, m.queue); err != nil {
		return err
	}
	ch, err := m.node.declareQueue(ctx, s, m.openTracked(s), m.untrack, m.queue, moduleQueueArgs(m.cfg))
	if err != nil {
		return fmt.Errorf("declare queue %s (if it exists with other arguments, such as another queue type or priorities, the broker refuses it: move it to the new settings with meshctl queue migrate, or keep its settings): %w", m.queue, err)
	}
	want := make([]string, len(subs))
	for i, s := range subs {
		want[i] = s.pattern
	}
	own := want
	if m.cfg.Partitions > 0 {
		own = nil
		if err := m.consumePartitions(ctx, s, want); err != nil {
			return err
		}
	} else if m.groupQueue != "" {
		own = nil
		if ch, err = m.node.declareQueue(ctx, s, m.reusing(s, ch), m.untrack, m.groupQueue, moduleQueueArgs(m.cfg)); err != nil {
			return fmt.Errorf("declare queue %s of group %s (the group's members declare it alike: their queue_type, max_attempts and max_priority must agree): %w", m.groupQueue, m.cfg.Group, err)
		}
		if err := m.reconcileBindings(ch, m.groupQueue, want); err != nil {
			return err
		}
	}
	if err := m.reconcileBindings(ch, m.queue, own); err != nil {
		return err
	}
	if err := ch.Qos(m.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	tag := m.consumerTag("")
	deliveries, err := ch.Consume(m.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", m.queue, err)
	}
	m.addTag(ch, tag, m.queue)
	if m.groupQueue != "" && m.cfg.Partitions == 0 {
		fromGroup, err := ch.Consume(m.groupQueue, m.groupTag, false, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consume %s: %w", m.groupQueue, err)
		}
		m.addTag(ch, m.groupTag, m.groupQueue)
		deliveries = merged(deliveries, fromGroup)
	}
	a := newAcker(ch, m.cfg.Prefetch)
	a.flow = m.flowOf(ch)
	if m.dedup != nil {
		a.records = m.writeRecords
	}
	go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	for range m.cfg.Concurrency {
		m.startWorker(deliveries, a)
	}
	return nil
}

// merged is the deliveries of a and b on one channel, which closes when
// both have closed (their amqp channel closed, or both consumers were
// cancelled).
func merged(a, b <-chan amqp.Delivery) <-chan amqp.Delivery {
	out := make(chan amqp.Delivery)
	go func() {
		defer close(out)
		for a != nil || b != nil {
			select {
			case d, ok := <-a:
				if !ok {
					a = nil
					continue
				}
				out <- d
			case d, ok := <-b:
				if !ok {
					b = nil
					continue
				}
				out <- d
			}
		}
	}()
	return out
}

// reconcileBindings binds queue to every pattern in want and unbinds the
// patterns recorded for it that want no longer has.
func (m *Module) reconcileBindings(ch *amqp.Channel, queue string, want []string) error {
	return m.reconcile(queue, want,
		func(p string) error { return ch.QueueBind(queue, p, wire.ExchangeEvents, false, nil) },
		func(p string) error { return ch.QueueUnbind(queue, p, wire.ExchangeEvents, nil) })
}

// reconcile binds name (a queue, or a group's exchange) to mesh.events
// with every pattern in want and unbinds the patterns its binding record
// holds that want no longer has, then records want.
func (m *Module) reconcile(name string, want []string, bind, unbind func(pattern string) error) error {
	had, err := m.node.bindings.load(name)
	if err != nil {
		return err
	}
	for _, p := range want {
		if err := bind(p); err != nil {
			return fmt.Errorf("bind %s to %q: %w", name, p, err)
		}
	}
	for _, p := range had {
		if slices.Contains(want, p) {
			continue
		}
		if err := unbind(p); err != nil {
			return fmt.Errorf("unbind %s from %q: %w", name, p, err)
		}
		m.log.Info("unbound a pattern the module no longer consumes here", "pattern", p, "bound", name)
	}
	return m.node.bindings.store(name, want)
}

// reusing is an open (for Node.declareQueue) that gives ch first, then
// new channels the module tracks on s.
func (m *Module) reusing(s *session, ch *amqp.Channel) func() (*amqp.Channel, error) {
	return func() (*amqp.Channel, error) {
		if ch != nil {
			first := ch
			ch = nil
			return first, nil
		}
		return m.openTracked(s)()
	}
}

// unbindAll unbinds a module that consumes nothing (any more) from what it
// consumed before, so its queues stop filling. The queues and what is in
// them stay for the operator.
func (m *Module) unbindAll(s *session) error {
	queues := []string{m.queue}
	if m.groupQueue != "" {
		queues = append(queues, m.groupQueue)
	}
	var ch *amqp.Channel
	for _, q := range queues {
		had, err := m.node.bindings.load(q)
		if err != nil {
			return err
		}
		if len(had) == 0 {
			continue
		}
		if ch == nil {
			if ch, err = s.subConn.Channel(); err != nil {
				return fmt.Errorf("open channel: %w", err)
			}
			defer ch.Close()
		}
		if err := m.reconcileBindings(ch, q, nil); err != nil {
			return err
		}
	}
	return nil
}

// watch notices when the broker ends the module's consumption on its own
// while the session lasts: the channel ch closed with an error, or its
// consumer was cancelled (the queue was deleted). The module then resumes
// after a second: its queue is declared again and consumed on a new
// channel. A lost session is the supervisor's to handle. watch returns
// when the channel closes.
func (m *Module) watch(s *session, ch *amqp.Channel, closed <-chan *amqp.Error, cancelled <-chan string) {
	for {
		select {
		case err, ok := <-closed:
			if ok && err != nil {
				m.resumeLater(s, ch, "its channel closed", err)
			}
			return
		case _, ok := <-cancelled:
			if ok {
				m.resumeLater(s, ch, "the broker cancelled its consumer (was the queue deleted?)", nil)
			}
			cancelled = nil
		}
	}
}

// resumeLater resumes the module in a second if by then the session s is
// still current and ch still one of the module's channels.
func (m *Module) resumeLater(s *session, ch *amqp.Channel, why string, err error) {
	time.AfterFunc(time.Second, func() {
		if m.node.session() != s {
			return // lost with its session: the supervisor resumes every module
		}
		m.mu.Lock()
		current := slices.ContainsFunc(m.consumers, func(c consumerChannel) bool { return c.ch == ch })
		m.mu.Unlock()
		if !current {
			return
		}
		m.log.Error("module stopped consuming; resuming it", "why", why, "queue", m.queue, "err", err)
		m.resume(s, true)
	})
}

// startWorker starts a goroutine that handles deliveries until they end,
// or until its handler overran its timeout: a replacement worker then took
// its place, and it exits once the handler returns.
func (m *Module) startWorker(deliveries <-chan amqp.Delivery, a *acker) {
	m.workers.Add(1)
	a.flow.workers.Add(1)
	go func() {
		defer m.workers.Done()
		defer a.flow.workers.Add(-1)
		linger := time.NewTimer(ackLinger)
		linger.Stop()
		for {
			d, ok := m.nextDelivery(deliveries, a, linger)
			if !ok {
				// Consuming ended (Stop cancelled it, or the channel
				// closed): send what is held, while the channel lasts.
				if err := a.flush(); err != nil {
					m.log.Debug("held acks not sent; the events will be delivered again", "err", err)
				}
				return
			}
			if unseen := m.node.hook().unseen; unseen != nil && unseen(m.queue) {
				continue
			}
			a.delivered(d.DeliveryTag)
			a.flow.take()
			replaced := m.handle(d, deliveries, a)
			a.flow.done()
			if replaced {
				return
			}
		}
	}()
}
