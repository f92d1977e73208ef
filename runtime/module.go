package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/meshkit/mesh/internal/asyncemit"
	"github.com/meshkit/mesh/internal/dedup"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/filter"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/setup"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Module is a module loaded on a node.
type Module struct {
	node  *Node
	def   sdk.Module
	cfg   ModuleConfig
	queue string
	// groupQueue is the queue of the module's group (ModuleConfig.Group),
	// which the module consumes beside queue, with groupTag; "" if the
	// module is no group's.
	groupQueue, groupTag string
	// partitionSlots bounds the handler calls of an ordered group's lanes
	// at once to Concurrency (partitions.go).
	partitionSlots chan struct{}
	// partitions are the consumers of an ordered group's partitions and
	// catch-up queues on the node, by queue (consumePartition).
	partitions map[string]*partition
	// epoch is the group's partition count as the node knows it, gone
	// the queues of a change known gone (closed channels), followMu
	// serializes follow (repartition.go).
	epoch    groupEpoch
	gone     map[string]chan struct{}
	followMu sync.Mutex
	settleMu sync.Mutex // one checkSettled at a time
	// mismatched are the peers found keeping order over another partition
	// count, each said once (groupMembers).
	mismatched sync.Map
	log        *slog.Logger
	mesh       *moduleMesh
	setup      *setup.Recorder // what Setup subscribes and serves
	// contracts are the module's declared schemas, compiled at load
	// (nil: it declares none): emits and deliveries are checked on them.
	contracts *schema.Contracts

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
	failures       failureBudget           // of its failure warnings
	identityWarns  failureBudget           // of its identity warnings (identity.go)
	queueTimeOpt   metric.RecordOption     // module=<name>, for its time in queue (made once: a set costs allocations)
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
	stopping       chan struct{}         // closed when Stop begins
	historyNext    atomic.Int64          // the offset of the history it reads next (-1: the start), with a History handler
	historyCh      *amqp.Channel         // the channel it reads the history on, on the current session; mu
	historyCancel  context.CancelFunc    // ends the reader on historyCh; mu
	historyMu      sync.Mutex            // one History.Handle at a time, across readers
	historyAckMu   sync.Mutex            // a history reader's ack, or its end before its channel closes
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
	// ordered says the channel consumes an ordered group's partition or
	// intake (partitions.go): Stop closes it once its handlers settled,
	// never cancelling its consumer, and checkConsumers leaves it alone
	// (a single active consumer's waiting consumer gets nothing).
	ordered bool
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
	contracts, err := contractsOf(def, mc)
	if err != nil {
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	if err := n.cfg.CheckConsumerTimeout(mc, false); err != nil { // the runs waited through: once Setup said (start)
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	queue := wire.ModuleQueue(n.cfg.Node, def.Name)
	if err := wire.ValidateQueueName(queue); err != nil {
		return nil, fmt.Errorf("load module %s: %w", def.Name, err)
	}
	var groupQueue string
	if mc.Group != "" {
		groupQueue = wire.GroupQueue(mc.Group, def.Name)
		if err := wire.ValidateQueueName(groupQueue); err != nil {
			return nil, fmt.Errorf("load module %s: group %s: %w", def.Name, mc.Group, err)
		}
	}
	m := &Module{
		node:           n,
		def:            def,
		cfg:            mc,
		queue:          queue,
		groupQueue:     groupQueue,
		log:            n.log.With("module", def.Name),
		retries:        make(map[*time.Timer]struct{}),
		claimed:        make(map[string]chan struct{}),
		held:           make(map[string]bool),
		queueConsumers: make(map[string]*queueConsumer),
		queuesDown:     make(map[string]string),
		runDone:        make(chan struct{}),
		stopping:       make(chan struct{}),
		answers:        newAnswerCache(n.cfg.DedupRetention, answerCacheBytes),
		attrs:          attribute.NewSet(attribute.String("module", def.Name)),
		outcomeOpts:    outcomeOptions(def.Name),
		queueTimeOpt:   metric.WithAttributeSet(attribute.NewSet(attribute.String("module", def.Name))),
		setup:          setup.New(def.Name, mc.ToolGrants),
		contracts:      contracts,
	}
	if groupQueue != "" {
		m.groupTag = m.consumerTag(".group")
	}
	if mc.Partitions > 0 {
		m.partitionSlots = make(chan struct{}, mc.Concurrency)
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
	var patterns []string
	for _, e := range fixedSubs {
		patterns = append(patterns, e.Key)
	}
	if err := m.contracts.CheckPatterns(patterns); err != nil {
		return err
	}
	served := make([]string, len(fixedTools))
	for i, e := range fixedTools {
		served[i] = e.Key
	}
	if err := m.contracts.CheckTools(served); err != nil {
		return err
	}
	if err := m.historyFrom(ctx); err != nil {
		return err
	}
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
	m.node.announceSchemas(m)
	runCtx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	m.runCancel = cancel
	if m.stopped {
		cancel() // stopped while it started (the node closing): Run sees it at once
	}
	m.mu.Unlock()
	go m.checkConsumers(runCtx)
	if m.cfg.Partitions > 0 {
		go m.balance(runCtx)
	}
	go func() {
		err := m.run(runCtx)
		close(m.runDone)
		if err != nil {
			m.runFailed(err)
		}
	}()
	if m.groupQueue != "" {
		m.log.Info("module loaded", "queue", m.queue, "group", m.cfg.Group, "group_queue", m.groupQueue, "patterns", len(subs), "queue_type", m.cfg.QueueType)
	} else {
		m.log.Info("module loaded", "queue", m.queue, "patterns", len(subs), "queue_type", m.cfg.QueueType)
	}
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
	close(m.stopping)
	runCancel := m.runCancel
	m.mu.Unlock()

	m.resumeMu.Lock() // a resume in progress finishes first
	m.resumeMu.Unlock()
	m.mu.Lock()
	consumers := slices.Clone(m.consumers)
	m.mu.Unlock()
	var errs []error
	for _, c := range consumers {
		if c.ordered {
			// Cancelling would hand the partition over at once, before
			// what it holds comes back: closed below, once its
			// handlers settled, it comes back first (partitions.go).
			continue
		}
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
	parts := make([]*partition, 0, len(m.partitions))
	for _, p := range m.partitions {
		parts = append(parts, p)
	}
	m.mu.Unlock()
	for _, p := range parts {
		p.flush() // what the lanes settled, acknowledged before the channel closes
	}
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

// contractsOf compiles the schemas def declares, its events' and its
// tools' (ADR 34).
func contractsOf(def sdk.Module, mc ModuleConfig) (*schema.Contracts, error) {
	decls := make([]schema.Decl, len(def.Schemas))
	for i, s := range def.Schemas {
		decls[i] = schema.Decl{Event: s.Event, Tool: s.Tool, Version: s.Version, JSON: s.JSON, Response: s.Response}
	}
	return schema.New(def.Name, def.Emits, decls, def.Reads, !mc.SkipBodyValidation)
}
