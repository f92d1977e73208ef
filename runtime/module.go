package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/asyncemit"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/dedup"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/filter"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/setup"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Module is a module loaded on a node.
type Module struct {
	node  *Node
	def   sdk.Module
	cfg   ModuleConfig
	queue string
	log   *slog.Logger
	mesh  *moduleMesh
	setup *setup.Recorder // what Setup subscribes and serves

	mu   sync.Mutex
	subs []subscription // fixed once started
	// running is set, under mu, when Setup has returned: patterns and
	// tools are fixed, emits and calls allowed. The emit path reads it
	// without the lock.
	running atomic.Bool
	stopped bool

	tools          []tool                    // fixed once started
	queues         []setup.Entry             // existing broker queues it consumes (Consume), fixed once started
	holdMu         sync.Mutex                // guards held, queueConsumers, queuesDown and toolsDown
	held           map[string]bool           // consumed queues held (Hold), across sessions
	queueConsumers map[string]*queueConsumer // the consumed queues' consumers on the current session
	queuesDown     map[string]string         // consumed queues the module cannot consume now, and why
	toolsDown      string                    // why the module's tools cannot be served now ("" when they are or it has none); holdMu
	consumers      []consumerChannel         // the channels the module consumes on, on the current session
	resumeMu       sync.Mutex                // one attach or resume at a time; guards attachable, and the writes of attachedOn
	serveTry       atomic.Uint64             // numbers the attaches, so a serveLater of an earlier one gives up
	counts         moduleCounts              // its running totals, for metrics
	attrs          attribute.Set             // module=<name>, for its metrics
	outcomeOpts    map[string]metric.RecordOption
	attachable     bool                    // Setup has returned and the record of handled ids is open
	attachedOn     atomic.Pointer[session] // the session its consumers and servers were last attached on (Ready reads it without the lock)
	dedup          *dedup.Set              // ids of events handled; nil if the module allows duplicates
	answers        *answerCache            // its tools' final answers, by request id
	claimed        map[string]chan struct{}
	workers        sync.WaitGroup
	retries        map[*time.Timer]struct{}
	handleCtx      context.Context // handlers run under it; cancelled only when a stop's grace runs out
	cancelH        context.CancelFunc
	runCancel      context.CancelFunc // set by start; mu
	releaseOnce    sync.Once          // the record of handled ids is released once (releaseRecord)
	resumeFailures atomic.Int32       // resumes that failed in a row: their back-off grows
	runDone        chan struct{}
	failure        atomic.Pointer[error] // why it stopped by itself (Err)
}

type subscription struct {
	pattern string
	handler sdk.Handler
	filter  *filter.Filter // nil: every event the pattern matches
	dedup   bool           // de-duplicate deliveries by event id for this handler
}

type tool struct {
	key     string
	handler sdk.ToolHandler
	// repeats: run the handler for a repeated request too, rather than
	// answer it from the stored answer (sdk.AllowDuplicates).
	repeats bool
}

// consumerChannel is a channel a module consumes on, with its consumer
// tags. Its workers ack and reply on it from several goroutines: amqp091-go
// serialises the frames of one channel, and acks need no order.
type consumerChannel struct {
	ch     *amqp.Channel
	tags   []string
	queues []string // the queue each tag consumes
	flow   *consumerFlow
}

// consumerFlow is what the workers of one consumer say of its deliveries,
// for checkConsumers to tell a consumer the broker stopped feeding. The
// workers of the module's queue and of each consumed queue report it (each
// has a channel of its own); a flow with no workers is never idle.
type consumerFlow struct {
	received atomic.Uint64 // deliveries the workers took
	busy     atomic.Int64  // deliveries being handled now
	workers  atomic.Int64  // workers taking deliveries
}

// take is a worker taking a delivery; done, when it has handled it.
func (f *consumerFlow) take() { f.received.Add(1); f.busy.Add(1) }
func (f *consumerFlow) done() { f.busy.Add(-1) }

// idle reports whether some worker waits for a delivery.
func (f *consumerFlow) idle() bool { return f.busy.Load() < f.workers.Load() }

// Load runs def on the node in-process: Setup subscribes its handlers,
// then its queue <node>.<module>.events is declared, bound to exactly the
// patterns subscribed (a pattern bound on an earlier run and no longer
// subscribed is unbound) and consumed; then Run, if any, starts.
// Zero fields of mc take the node's defaults. On a node that is not
// connected (the broker is away) Load does not wait: the module attaches,
// once, when the node connects, and its emits are spooled meanwhile.
func (n *Node) Load(ctx context.Context, def sdk.Module, mc ModuleConfig) (*Module, error) {
	if err := wire.ValidateModule(def.Name, string(def.Kind), def.Emits, def.Calls); err != nil {
		return nil, err
	}
	mc = mc.over(n.cfg.Module)
	if err := mc.validate(); err != nil {
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	if err := n.cfg.CheckConsumerTimeout(mc, false); err != nil { // the runs waited through: once Setup said (start)
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	queue := wire.ModuleQueue(n.cfg.Node, def.Name)
	if err := wire.ValidateQueueName(queue); err != nil {
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	m := &Module{
		node:           n,
		def:            def,
		cfg:            mc,
		queue:          queue,
		log:            n.log.With("module", def.Name),
		retries:        make(map[*time.Timer]struct{}),
		claimed:        make(map[string]chan struct{}),
		held:           make(map[string]bool),
		queueConsumers: make(map[string]*queueConsumer),
		queuesDown:     make(map[string]string),
		runDone:        make(chan struct{}),
		answers:        newAnswerCache(n.cfg.DedupRetention, answerCacheBytes),
		attrs:          attribute.NewSet(attribute.String("module", def.Name)),
		outcomeOpts:    outcomeOptions(def.Name),
		setup:          setup.New(def.Name, mc.ToolGrants),
	}
	m.setup.GrantConsumes(mc.ConsumeGrants)
	m.mesh = &moduleMesh{module: m, async: asyncemit.New()}
	m.handleCtx, m.cancelH = context.WithCancel(context.Background())

	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, sdk.ErrClosed
	}
	if _, dup := n.modules[def.Name]; dup {
		n.mu.Unlock()
		return nil, fmt.Errorf("load module %s: a module of that name is already loaded on node %s", def.Name, n.cfg.Node)
	}
	n.modules[def.Name] = m
	n.mu.Unlock()

	if err := m.start(ctx); err != nil {
		n.mu.Lock()
		delete(n.modules, def.Name)
		n.mu.Unlock()
		m.cancelH()
		m.mu.Lock()
		m.stopped = true
		for _, c := range m.consumers {
			c.ch.Close()
		}
		m.mu.Unlock()
		if m.dedup != nil {
			_ = m.releaseRecord()
		}
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	n.mu.Lock()
	if n.failed[def.Name] != nil && n.modules[def.Name] == m {
		delete(n.failed, def.Name) // loaded again: an earlier failure of the name is over
	}
	n.mu.Unlock()
	return m, nil
}

func (m *Module) start(ctx context.Context) error {
	if m.def.Setup != nil {
		if err := m.def.Setup(m.mesh); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	fixedSubs, fixedTools := m.setup.Fix()
	m.queues = m.setup.Consumed()
	if len(fixedSubs) > 0 {
		if err := m.node.cfg.CheckConsumerTimeout(m.cfg, true); err != nil {
			return err
		}
	}
	m.mu.Lock()
	for _, e := range fixedSubs {
		m.subs = append(m.subs, subscription{pattern: e.Key, handler: e.Handler.(sdk.Handler), filter: e.Options.Filter,
			dedup: !m.cfg.AllowDuplicates && !e.Options.AllowDuplicates})
	}
	for _, e := range fixedTools {
		m.tools = append(m.tools, tool{key: e.Key, handler: e.Handler.(sdk.ToolHandler), repeats: e.Options.AllowDuplicates})
	}
	m.running.Store(true)
	subs := slices.Clone(m.subs)
	tools := slices.Clone(m.tools)
	m.mu.Unlock()
	if slices.ContainsFunc(subs, func(s subscription) bool { return s.dedup }) {
		path := filepath.Join(m.node.cfg.StateDir, "dedup", m.def.Name+".log")
		set, err := m.node.openRecord(m.def.Name, path, dedup.Options{Retention: m.node.cfg.DedupRetention, MaxEntries: m.node.cfg.DedupMaxEntries, Logger: m.log})
		if err != nil {
			return fmt.Errorf("open the record of handled events: %w", err)
		}
		m.dedup = set
	}
	if h := m.node.hook().setUp; h != nil {
		h(m.def.Name)
	}
	if err := m.attachFirst(ctx, subs, tools); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	m.runCancel = cancel
	if m.stopped {
		cancel() // stopped while it started (the node closing): Run sees it at once
	}
	m.mu.Unlock()
	go m.checkConsumers(runCtx)
	go func() {
		err := m.run(runCtx)
		close(m.runDone)
		if err != nil {
			m.runFailed(err)
		}
	}()
	m.log.Info("module loaded", "queue", m.queue, "patterns", len(subs), "queue_type", m.cfg.QueueType)
	return nil
}

// run runs the module's Run, if any, until it returns, and returns its
// error if it failed before the module was stopped.
func (m *Module) run(ctx context.Context) error {
	if m.def.Run == nil {
		return nil
	}
	err := m.def.Run(handlerlog.With(ctx, m.log), m.mesh)
	m.mu.Lock()
	stopping := m.stopped // Run's ctx ends after the drain: a Run that ends during it is stopping too
	m.mu.Unlock()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil || stopping:
		if !errors.Is(err, context.Canceled) {
			m.log.Warn("module run ended with an error as the module stopped", "err", err)
		}
		return nil
	}
	return err
}

// runFailed stops a module whose Run failed before it was stopped: an
// in-process module is not started again (its code is the program's), so
// its failure stays on the node, where Ready reports it, until a module
// of that name is loaded again.
func (m *Module) runFailed(err error) {
	err = fmt.Errorf("its Run failed: %w", err)
	m.log.Error("module run failed; the module stops", "err", err)
	m.node.mu.Lock()
	m.node.failed[m.def.Name] = err // not ready from now on
	m.node.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.HandlerTimeout+5*time.Second)
	defer cancel()
	if serr := m.Stop(ctx); serr != nil {
		m.log.Warn("stopping the module after its Run failed", "err", serr)
	}
	m.failure.Store(&err)
}

// Err is why the module stopped by itself (its Run failed), once it has
// stopped; nil otherwise.
func (m *Module) Err() error {
	if p := m.failure.Load(); p != nil {
		return *p
	}
	return nil
}

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
		case unavailable(err):
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
// the workers.
func (m *Module) consume(ctx context.Context, s *session, subs []subscription) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := m.track(ch); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(m.queue, true, false, false, false, moduleQueueArgs(m.cfg)); err != nil {
		return fmt.Errorf("declare queue %s (if it exists with other arguments, such as another queue type or attempt limit, the broker refuses it: delete the queue or keep its settings): %w", m.queue, err)
	}
	want := make([]string, len(subs))
	for i, s := range subs {
		want[i] = s.pattern
	}
	if err := m.reconcileBindings(ch, want); err != nil {
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
	a := newAcker(ch, m.cfg.Prefetch)
	a.flow = m.flowOf(ch)
	go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	for range m.cfg.Concurrency {
		m.startWorker(deliveries, a)
	}
	return nil
}

// reconcileBindings binds the module's queue to every pattern in want and
// unbinds the patterns recorded for it that want no longer has.
func (m *Module) reconcileBindings(ch *amqp.Channel, want []string) error {
	had, err := m.node.bindings.load(m.queue)
	if err != nil {
		return err
	}
	for _, p := range want {
		if err := ch.QueueBind(m.queue, p, wire.ExchangeEvents, false, nil); err != nil {
			return fmt.Errorf("bind %s to %q: %w", m.queue, p, err)
		}
	}
	for _, p := range had {
		if slices.Contains(want, p) {
			continue
		}
		if err := ch.QueueUnbind(m.queue, p, wire.ExchangeEvents, nil); err != nil {
			return fmt.Errorf("unbind %s from %q: %w", m.queue, p, err)
		}
		m.log.Info("unbound a pattern the module no longer consumes", "pattern", p)
	}
	return m.node.bindings.store(m.queue, want)
}

// unbindAll unbinds a module that consumes nothing (any more) from what it
// consumed before, so its queue stops filling. The queue and what is in it
// stay for the operator.
func (m *Module) unbindAll(s *session) error {
	had, err := m.node.bindings.load(m.queue)
	if err != nil || len(had) == 0 {
		return err
	}
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return m.reconcileBindings(ch, nil)
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

// Mesh returns the module's view of the mesh, to emit from outside its
// handlers.
func (m *Module) Mesh() sdk.Mesh { return m.mesh }

// Stop stops consuming, lets the handlers in flight finish until ctx is
// done, acknowledges what finished, and closes the module's channel: what
// was delivered but not finished returns to the queue. Then Run's context
// is cancelled (after the handlers drained, as on every host: a handler
// may use what Run keeps open), and Stop waits for Run to return until ctx
// is done. Stop is idempotent.
func (m *Module) Stop(ctx context.Context) error {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return nil
	}
	m.stopped = true
	runCancel := m.runCancel
	m.mu.Unlock()

	m.resumeMu.Lock() // a resume in progress finishes first
	m.resumeMu.Unlock()
	m.mu.Lock()
	consumers := slices.Clone(m.consumers)
	m.mu.Unlock()
	var errs []error
	for _, c := range consumers {
		for _, tag := range c.tags {
			if err := c.ch.Cancel(tag, false); err != nil && !errors.Is(err, amqp.ErrClosed) {
				errs = append(errs, fmt.Errorf("cancel consumer %s: %w", tag, err))
			}
		}
	}
	drained := make(chan struct{})
	go func() { m.workers.Wait(); close(drained) }()
	leftBehind := false
	select {
	case <-drained:
	case <-ctx.Done():
		m.log.Warn("grace period over with handlers still running; their events return to the queue")
		m.cancelH()
		select {
		case <-drained:
		case <-time.After(time.Second):
			m.log.Error("handlers ignore their cancelled context; leaving them behind (the record of handled events stays open for them: one that succeeds is not run again)")
			leftBehind = true
		}
	}
	if runCancel != nil {
		runCancel() // the handlers drained, or were given up on
	}
	m.mu.Lock()
	for t := range m.retries {
		t.Stop() // its event returns to the queue when the channel closes
	}
	m.mu.Unlock()
	for _, c := range consumers {
		if err := c.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, fmt.Errorf("close channel: %w", err))
		}
	}
	m.cancelH()
	if m.dedup != nil {
		if leftBehind {
			// A handler left behind that succeeds records its event, so
			// that its redelivery (to the module's next load, which shares
			// this record) is acknowledged without running again.
			go func() {
				<-drained
				if err := m.releaseRecord(); err != nil {
					m.log.Error("close the record of handled events", "err", err)
				}
			}()
		} else if err := m.releaseRecord(); err != nil {
			errs = append(errs, fmt.Errorf("close the record of handled events: %w", err))
		}
	}
	if runCancel != nil {
		select {
		case <-m.runDone:
		case <-ctx.Done():
		}
	}
	m.node.mu.Lock()
	if m.node.modules[m.def.Name] == m {
		delete(m.node.modules, m.def.Name)
	}
	m.node.mu.Unlock()
	m.log.Info("module stopped")
	return errors.Join(errs...)
}

// handle runs one delivery through validation, the handler and the
// failure policy. Every path ends in exactly one ack, reject or scheduled
// retry. It reports whether the handler overran its timeout, in which case
// the delivery was settled as failed and a new worker started in the
// calling worker's place.
func (m *Module) handle(d amqp.Delivery, deliveries <-chan amqp.Delivery, a *acker) (replaced bool) {
	counts := m.from(d)
	counts.delivered.Add(1)
	src := m.own(a)
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	// The runtime's own headers count only where the runtime put them
	// (owned.go): the type, the publisher and the attempts made.
	o, oerr := m.node.originOf(d)
	eventType := o.eventType
	if !o.own {
		meta.Attempt = 0
	}
	attempt := m.attempt(d, meta)
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
	ev := eventOf(d, meta, eventType, attempt)
	ev.UserID = o.userID
	sub, matched := m.subscriptionFor(ev)
	switch {
	case !matched:
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonNoHandler, fmt.Errorf("no handler of module %s matches %s", m.def.Name, eventType))
		return false
	case sub.handler == nil:
		m.filteredOut(src, d, counts, ev)
		return false
	}
	release := func() {}
	if sub.dedup {
		var dup bool
		release, dup = m.claim(meta.ID)
		if dup {
			m.node.stats.duplicates.Add(1)
			counts.duplicates.Add(1)
			m.log.Debug("event already handled; acknowledged without handling it again", "event_id", meta.ID, "event_type", eventType)
			if err := src.ack(d); err != nil {
				m.log.Warn("ack of a duplicate failed; it will be delivered again", "event_id", meta.ID, "err", err)
			}
			return false
		}
		defer release()
	}
	if m.cfg.QueueType == QueueClassic && d.Redelivered {
		// The last delivery of this message was never settled: its
		// consumer stopped or crashed. That counts as an attempt, which a
		// classic queue does not record, so record it and deliver again.
		m.failed(src, d, eventType, attempt, errors.New("the consumer stopped before the handler finished"))
		return false
	}
	err, overran := m.call(sub.handler, ev, d, m.queue, func() {
		release() // settled as failed: a redelivery must not wait for the hung handler
		m.startWorker(deliveries, a)
		m.failed(src, d, eventType, attempt, fmt.Errorf("handler timed out after %v", m.cfg.HandlerTimeout))
		// Settled outside any worker: the replacement may be waiting for
		// a delivery already, with no linger to send a held ack, so the
		// ack (after a dead letter, or of a classic queue's retried
		// original) goes now rather than with the next delivery.
		if err := a.flush(); err != nil {
			m.log.Warn("ack after a timed-out handler failed; the event will be delivered again", "event_id", ev.ID, "err", err)
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
		if sub.dedup && !m.record(d, ev.ID) {
			return false // its channel closed unrecorded: the broker delivers it again
		}
		if err := src.ack(d); err != nil {
			m.log.Warn("ack failed; the event will be delivered again (and recognised as handled)", "event_id", ev.ID, "err", err)
		}
	case execute.Of(err) == execute.Permanent:
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonPermanent, err)
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
func (m *Module) attempt(d amqp.Delivery, meta wire.Meta) int {
	if m.cfg.QueueType == QueueQuorum {
		if n, ok := d.Headers["x-delivery-count"].(int64); ok && n >= 0 {
			return int(n) + 1
		}
		return 1
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

// claim reports whether the event id was already handled by the module.
// If not, the caller holds the id until it calls release: a second
// delivery of the same id meanwhile (a duplicate from a fan-out retry, a
// resend) waits for the first one's outcome instead of running alongside
// it.
func (m *Module) claim(id string) (release func(), dup bool) {
	for {
		seen, err := m.dedup.Seen(id)
		if err != nil {
			m.log.Warn("could not check whether the event was handled; handling it", "event_id", id, "err", err)
			return func() {}, false
		}
		if seen {
			return nil, true
		}
		m.mu.Lock()
		busy, held := m.claimed[id]
		if !held {
			mine := make(chan struct{})
			m.claimed[id] = mine
			m.mu.Unlock()
			return sync.OnceFunc(func() {
				m.mu.Lock()
				delete(m.claimed, id)
				m.mu.Unlock()
				close(mine)
			}), false
		}
		m.mu.Unlock()
		<-busy
	}
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
}

// own is the module's event queue as a source.
func (m *Module) own(a *acker) source {
	return source{queue: m.queue, quorum: m.cfg.QueueType == QueueQuorum, acks: a}
}

// failed settles a failed attempt: dead-lettered if it was the last one,
// otherwise tried again after a back-off.
func (m *Module) failed(src source, d amqp.Delivery, eventType string, attempt int, cause error) {
	m.node.stats.failed.Add(1)
	m.from(d).failed.Add(1)
	if attempt >= m.cfg.MaxAttempts {
		m.deadLetter(src, d, eventType, attempt, wire.DeadReasonDeliveryLimit, cause)
		return
	}
	delay := m.node.backoff(attempt)
	m.log.Debug("handler failed; will retry", "event_type", eventType, "attempt", attempt, "retry_in", delay, "err", cause)
	m.later(delay, func() {
		if src.quorum {
			// reject with requeue counts toward x-delivery-limit on every
			// version from 3.10 to 4.3; nack does not on 4.3.
			if err := src.reject(d); err != nil {
				m.log.Warn("requeue failed; the event returns when the channel closes", "err", err)
			}
			return
		}
		m.requeueClassic(src, d, eventType, attempt)
	})
}

// requeueClassic puts a copy of d at the back of its classic queue with the
// attempts made so far, then acknowledges d. Until the copy is confirmed d
// stays unacknowledged, so nothing is lost if either step fails. The copy
// is the node's: published as its broker user (the broker checks it),
// with the type in x-mesh-routing-key and the original publisher's user
// in x-mesh-user-id, which the node honours on its own copies only
// (owned.go).
func (m *Module) requeueClassic(src source, d amqp.Delivery, eventType string, attempts int) {
	o, _ := m.node.originOf(d)
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = m.node.userID
	msg.Headers[wire.HeaderAttempt] = int64(attempts)
	msg.Headers[wire.HeaderRoutingKey] = eventType
	msg.Headers[wire.HeaderUserID] = o.userID
	s, ok := m.liveSession(d)
	if !ok {
		return // the delivery's channel is gone: the broker delivers it again
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.pub.publish(ctx, "", src.queue, msg); err != nil {
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
	m.log.Warn("event dead-lettered", "event_type", eventType, "event_id", d.MessageId, "reason", reason, "attempts", attempts, "err", cause)
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

// record records id as handled, trying again with back-off while it
// cannot (a full disk): the delivery d is acknowledged only once its id is
// recorded, so a record that failed never leaves an acked event that a
// redelivery would run again. It gives up, unrecorded and unacked, when
// d's channel closes (the broker delivers it again).
func (m *Module) record(d amqp.Delivery, id string) bool {
	for attempt := 1; ; attempt++ {
		err := m.dedup.Record(id)
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
		m.log.Error("could not record the event as handled (is the disk full?); its ack waits until it is recorded", "event_id", id, "err", err, "attempt", attempt, "retry_in", delay)
		time.Sleep(delay)
	}
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

// truncateText cuts s to at most n bytes, at a rune boundary.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// backoff is the delay before attempt+1: exponential from RetryMin,
// capped at RetryMax, with up to 20% jitter so retries of a burst spread.
func (n *Node) backoff(attempt int) time.Duration {
	return execute.Backoff(attempt, n.cfg.RetryMin, n.cfg.RetryMax, rand.Int64N)
}
