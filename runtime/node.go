package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/spool"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Node is a mesh node: it owns the broker connections and topology, and
// runs modules in-process. It is safe for concurrent use.
//
// When the broker goes away the node reconnects by itself, with back-off,
// and brings its modules' consumers, tool servers and reply queue back;
// meanwhile emits go to the local spool and are resent, in order, once the
// broker is back (docs/adr/0009-connection-supervision.md).
type Node struct {
	cfg    Config
	userID string // the broker user the node authenticates as, set as each event's user-id
	// brokers are the broker's addresses in the order this node tries
	// them (brokerOrder), and brokerAt the index of the one it is on or
	// tries next.
	brokers  []string
	brokerAt atomic.Int32
	log      *slog.Logger
	bindings bindingRecord
	stats    counters

	sessMu    sync.Mutex
	sess      *session                // nil while disconnected
	current   atomic.Pointer[session] // sess, for lock-free reads on the emit path
	sessReady chan struct{}           // closed while sess is set

	spool     *spool.Spool    // nil on an ephemeral node
	book      *schedbook.Book // what it scheduled and has not delivered; nil without delays or when ephemeral
	sched     schedLedger     // what each source has waiting in the book (schedlimits.go)
	spoolGate sync.RWMutex    // appends hold it shared; the drain takes it to end spooling
	spooling  atomic.Bool     // emits go to the spool: it holds events not resent yet
	drainKick chan struct{}
	drained   chan struct{} // closed when the drain loop ends

	depthsDone chan struct{} // closed when watchQueueDepths ends (at once without a MeterProvider)

	mu      sync.Mutex
	modules map[string]*Module
	// configured are the modules the node's configuration names
	// (SetModules); nil: not told.
	configured map[string]bool
	plugins    []*PluginModule
	// failed holds why an in-process module stopped by itself (its Run
	// failed), by name, until a module of that name is loaded again.
	failed map[string]error
	closed bool

	recordsMu sync.Mutex             // held while a record opens or closes
	records   map[string]*openRecord // the modules' records of handled ids, open (records.go)

	callerMu sync.Mutex
	calls    *caller // made on the first call, again after a reconnect

	closing    chan struct{}      // closed by Close
	life       context.Context    // cancelled by Close: bounds the node's own waits
	endLife    context.CancelFunc // cancels life
	supervised chan struct{}      // closed when the supervisor ends

	done     chan struct{} // closed when the node fails for good
	doneOnce sync.Once
	doneErr  error

	hooks atomic.Pointer[hooks] // for tests that force an ordering; nil in production

	started time.Time // when New made the node
	members peers     // the other nodes, from their heartbeats
	// rollCalled asks beat for a heartbeat now (answerRollCall).
	rollCalled chan struct{}

	telemetry telemetry    // metrics instruments (Config.MeterProvider)
	trace     trace.Tracer // spans (Config.TracerProvider); nil without
	callOpts  sync.Map     // tool+outcome -> metric.RecordOption
	// callOptsLen is how many callOpts holds (maxCallOpts at most).
	callOptsLen atomic.Int64
	// refused holds the features the broker refused this node (Feature,
	// featureRefused): off for the rest of its life, with a warning.
	refused sync.Map // Feature → error
	// policies is the management API the node keeps its queues' policies
	// through (Config.QueuePolicies), found once (policyAPI).
	policies struct {
		mu      sync.Mutex
		decided map[string]*brokerapi.Client // by broker URL; nil: limits as arguments
	}
}

// hooks are called, when set, at points tests need to order against.
type hooks struct {
	resumed      func()                           // the supervisor has brought every module back on a new session
	setUp        func(module string)              // a module's Setup returned; it is not attachable yet
	relaunched   func(module string, pid int)     // a crashed module process was started again, not installed yet
	stopWaiting  func(module string)              // a module process's Stop waits for its supervisor to end
	exited       func(module string)              // a module process is gone; its supervisor has not taken it out yet
	awaiting     func(module string)              // a delivery or call waits for the module process's restart
	reconsume    func(queue string, attempt int)  // a lost consumed queue is about to be consumed again
	drainWaits   func()                           // the spool's drain published a batch and waits for its confirms
	refused      func(module string)              // a module stopped for good: its process came back as another module
	record       func(id string, err error) error // the outcome of recording a handled id, as the test would have it
	writeRecords func(err error) error            // the outcome of writing the recorded ids down before their acks
	unseen       func(queue string) bool          // true: a worker drops the delivery it got from queue, neither handled nor settled
	lookedAt     func()                           // the node looked at its modules' queues (watchQueueDepths)
	checked      func(module string)              // a module's consumers were checked once (checkConsumers)
	launched     func(path string, pid int)       // a module process passed the handshake and is about to be asked to describe itself
	described    func(module string, pid int)     // a module process described itself at its first load and is loaded; it is not started yet
	intakeMarker func(marker string)              // a group's intake member reached a marker of a partition count change, and handles it next
	caughtUp     func(queue string)               // an event of a change's catch-up queue was settled
	intakeSend   func(key string) error           // the intake is about to send an event of key on: an error fails the send
}

// noHooks is what hook returns when no test set any: one value, so that
// a hook point on the event path (record) allocates nothing.
var noHooks = &hooks{}

// hook returns the hooks set, or none.
func (n *Node) hook() *hooks {
	if h := n.hooks.Load(); h != nil {
		return h
	}
	return noHooks
}

// New connects to the broker, declares and verifies the topology, takes
// the node lock (ErrNodeTaken if another node of the name runs), opens the
// spool in the state dir, and returns a node ready to load modules and
// emit. Events left in the spool by an earlier run are resent first. With
// Config.StartWithoutBroker, a broker that does not answer yet is not an
// error: the node starts disconnected and connects when it answers.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	cfg.withDefaults()
	n := &Node{
		cfg:        cfg,
		userID:     brokerUser(cfg.Brokers()[0]), // checkBrokers: all name the same user
		brokers:    brokerOrder(cfg.Brokers(), rand.IntN),
		log:        cfg.Logger.With("node", cfg.Node),
		bindings:   bindingRecord{dir: cfg.StateDir},
		modules:    make(map[string]*Module),
		failed:     make(map[string]error),
		records:    make(map[string]*openRecord),
		sessReady:  make(chan struct{}),
		drainKick:  make(chan struct{}, 1),
		drained:    make(chan struct{}),
		depthsDone: make(chan struct{}),
		closing:    make(chan struct{}),
		supervised: make(chan struct{}),
		done:       make(chan struct{}),
	}
	n.life, n.endLife = context.WithCancel(context.Background())
	n.started, n.members.known, n.rollCalled = time.Now().UTC(), make(map[string]*Peer), make(chan struct{}, 1)
	n.startTracing()
	if err := n.startTelemetry(); err != nil {
		n.endLife()
		return nil, err
	}
	if !cfg.Ephemeral {
		sp, err := spool.Open(filepath.Join(cfg.StateDir, "spool.db"), spool.Options{MaxBytes: cfg.SpoolMaxBytes})
		if err != nil {
			return nil, fmt.Errorf("node %s: open spool (state dir %s): %w", cfg.Node, cfg.StateDir, err)
		}
		n.spool = sp
		n.spooling.Store(sp.Len() > 0)
	}
	if cfg.Delays && !cfg.Ephemeral {
		if err := n.openBook(); err != nil {
			n.endLife()
			n.stopTelemetry()
			n.spool.Close()
			return nil, err
		}
	}
	crashed := !cfg.Ephemeral && n.markRunning()
	s, err := n.connect(ctx)
	if errors.Is(err, ErrNodeTaken) && crashed {
		s, err = n.awaitOwnLock(ctx, err)
	}
	switch {
	case err == nil:
		n.setSession(s)
	case cfg.StartWithoutBroker && !cfg.Ephemeral && brokerAway(err):
		n.log.Warn("the broker does not answer; starting disconnected: emits are spooled, modules attach once it answers",
			"err", err)
	default:
		n.endLife()
		n.stopTelemetry()
		if n.spool != nil {
			n.spool.Close()
		}
		if n.book != nil {
			n.book.Close()
		}
		if !crashed && !cfg.Ephemeral {
			n.unmarkRunning() // this run never ran: the next one is no restart after a crash
		}
		return nil, err
	}
	go n.supervise(s)
	if n.spool != nil {
		go n.drainLoop()
		if held := n.spool.Len(); held > 0 {
			n.log.Info("resending events spooled by an earlier run", "events", held)
			n.kickDrain()
		}
	} else {
		close(n.drained)
	}
	if s != nil {
		n.log.Info("node connected", "broker", s.broker)
		n.followPeers(s)
		n.startMover(s)
	}
	if n.membership() {
		go n.beat()
	}
	if cfg.MeterProvider != nil {
		go n.watchQueueDepths()
	} else {
		close(n.depthsDone)
	}
	if n.book != nil && n.delaysOn() {
		// Its tools answer from a local file at once: a short handler
		// timeout, within even a short consumer_timeout.
		quick := ModuleConfig{Prefetch: 8, HandlerTimeout: min(5*time.Second, n.cfg.ConsumerTimeout/2)}
		if _, err := n.Load(ctx, n.delaysModule(), quick); err != nil {
			_ = n.Close(context.Background())
			return nil, fmt.Errorf("node %s: load the delays module: %w", cfg.Node, err)
		}
	}
	return n, nil
}

// brokerAway says whether a failed connect means the broker does not
// answer (yet): nothing listens, the network fails or times out, or the
// broker closes the connection while it starts or stops. A broker that
// answers and says no (credentials, virtual host, node lock, topology) is
// not away.
func brokerAway(err error) bool {
	var opErr *net.OpError
	var amqpErr *amqp.Error
	switch {
	case errors.As(err, &opErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, os.ErrDeadlineExceeded):
		return true
	case errors.As(err, &amqpErr):
		// amqp091-go reports a connection reset or closed during the
		// handshake as a frame error (501) with the network error as text,
		// or, when the close comes between two of its steps, as its
		// ErrClosed (504, "channel/connection is not open").
		return amqpErr.Code == amqp.FrameError || amqpErr.Code == amqp.ChannelError ||
			amqpErr.Code == amqp.ConnectionForced || amqpErr.Code == amqp.InternalError
	}
	return false
}

// Done is closed when the node can no longer work: an ephemeral node lost
// its connection, or another node of the same name took the node lock while
// this one was reconnecting. Err then says why. It is not closed by Close.
func (n *Node) Done() <-chan struct{} { return n.done }

// Err returns why Done was closed, or nil.
func (n *Node) Err() error {
	select {
	case <-n.done:
		return n.doneErr
	default:
		return nil
	}
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Node }

// StateDir is the node's state dir, its default resolved.
func (n *Node) StateDir() string { return n.cfg.StateDir }

// Close stops every module (see Module.Stop), ends the module processes,
// and closes the connections.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	plugins := n.plugins
	n.mu.Unlock()
	// Every module stops at once, so the grace is shared, not spent
	// once per module: each gets ctx, and a handler that ignores its
	// cancelled context is left behind a second after it.
	var (
		errMu sync.Mutex
		errs  []error
		wg    sync.WaitGroup
	)
	stopAll := func(stops []func(context.Context) error) {
		for _, stop := range stops {
			wg.Go(func() {
				err := stop(ctx)
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			})
		}
		wg.Wait()
	}
	var stops []func(context.Context) error
	for _, pm := range plugins { // their modules first, then their processes
		stops = append(stops, pm.Stop)
	}
	stopAll(stops)
	stops = stops[:0]
	n.mu.Lock()
	for _, m := range n.modules {
		stops = append(stops, m.Stop)
	}
	n.mu.Unlock()
	stopAll(stops)
	n.callerMu.Lock()
	if n.calls != nil {
		n.calls.close()
	}
	n.callerMu.Unlock()
	close(n.closing)
	n.endLife()
	n.stopTelemetry()
	<-n.supervised
	<-n.drained
	n.sessMu.Lock()
	s := n.sess
	n.sessMu.Unlock()
	if s != nil {
		s.close(true)
	}
	<-n.depthsDone // after the close: a look the broker does not answer ends with it
	if n.spool != nil {
		errs = append(errs, n.spool.Close())
		n.unmarkRunning()
	}
	if n.book != nil {
		errs = append(errs, n.book.Close())
	}
	return errors.Join(ignoreClosed(errs)...)
}

func ignoreClosed(errs []error) []error {
	out := errs[:0]
	for _, err := range errs {
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			out = append(out, err)
		}
	}
	return out
}

// Call invokes a tool with source as the caller (x-source); see
// sdk.Mesh.Call. It is the operator's way to call (meshctl call); modules
// call through their sdk.Mesh.
func (n *Node) Call(ctx context.Context, source, tool string, req, resp any) error {
	if err := wire.ValidateWord("source", source); err != nil {
		return err
	}
	return n.call(ctx, source, tool, req, resp, "")
}

// Emit publishes an event of any full type (module., mesh. or node.
// origin) with source as its x-source and a fresh id. It is the operator's
// and the node's own way to emit; modules emit through their sdk.Mesh,
// which confines them to their namespace. An id of a cause in ctx
// (causation.With) becomes the event's causation id.
func (n *Node) Emit(ctx context.Context, source, eventType string, body any, opts ...sdk.EmitOption) (string, error) {
	raw, o, err := wire.SourceEmit(source, eventType, body, opts, n.cfg.MaxBodyBytes)
	if err != nil {
		return "", err
	}
	return n.emit(ctx, source, eventType, raw, o, "")
}

// emit publishes a validated event with its JSON body and waits for its
// confirm. id is its id, or "" for a fresh one.
func (n *Node) emit(ctx context.Context, source, eventType string, raw []byte, o wire.EmitOptions, id string) (string, error) {
	if o.CausationID == "" {
		o.CausationID = causation.From(ctx)
	}
	if err := wire.CheckCausation(o.CausationID); err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	now := time.Now().UTC()
	if err := o.CheckDue(now); err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	due := o.Due(now)
	delayed := due.After(now)
	if delayed && !n.delaysOn() {
		if why := n.featureOff(FeatureDelays); why != nil {
			return "", fmt.Errorf("emit %s: %w: a delayed emit needs delays, which are off on this node: %v", eventType, wire.ErrInvalid, why)
		}
		return "", fmt.Errorf("emit %s: %w: a delayed emit needs delays on this node (delays: true in its config), which declares the delay cascade", eventType, wire.ErrInvalid)
	}
	if id == "" {
		id = newID(now)
	}
	headers := amqp.Table{
		wire.HeaderEventID: id,
		wire.HeaderSource:  source,
		wire.HeaderNode:    n.cfg.Node,
		wire.HeaderTime:    now.Format(time.RFC3339Nano),
	}
	if o.CausationID != "" {
		headers[wire.HeaderCausationID] = o.CausationID
	}
	if o.Schema != "" {
		headers[wire.HeaderSchema] = o.Schema
	}
	// Its slot, for the groups that keep order (ADR 48): of its key, or
	// of the empty key, the key of every event that has none.
	if o.HasKey {
		headers[wire.HeaderPartitionKey] = o.Key
	}
	headers[wire.SlotHeader(o.Key)] = wire.SlotMark
	msg := amqp.Publishing{
		Headers:      headers,
		ContentType:  wire.ContentTypeJSON,
		DeliveryMode: amqp.Persistent,
		UserId:       n.userID,
		MessageId:    id,
		Timestamp:    now,
		Body:         raw,
	}
	if o.TTL > 0 {
		msg.Expiration = strconv.FormatInt(o.TTL.Milliseconds(), 10)
	}
	if o.HasPriority {
		msg.Priority = o.Priority
	}
	if delayed {
		delayedPublishing(&msg, eventType, due) // a mover publishes it when due (delays.go)
	} else {
		due = time.Time{}
	}
	if delayed && n.book != nil {
		// Room for the schedule among what its module has waiting; given
		// back if it is not made.
		var maxCount int
		var maxBytes int64
		if m := n.module(source); m != nil {
			maxCount, maxBytes = m.cfg.MaxScheduled, m.cfg.MaxScheduledBytes
		}
		if err := n.sched.reserve(source, int64(len(raw)), maxCount, maxBytes); err != nil {
			return "", fmt.Errorf("emit %s: %w", eventType, err)
		}
	}
	ctx, span := n.startPublish(ctx, eventType, id)
	injectTrace(ctx, headers)
	var err error
	if o.AtMostOnce {
		msg.DeliveryMode = amqp.Transient
		err = n.publishAtMostOnce(eventType, msg)
	} else {
		err = n.publishEvent(ctx, eventType, due, msg)
	}
	endSpan(span, err)
	if err != nil {
		if delayed && n.book != nil {
			n.sched.release(source, int64(len(raw)))
		}
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	if delayed {
		n.writeDown(schedbook.Entry{ID: id, Type: eventType, Source: source, Due: due, Scheduled: now, Bytes: len(raw)})
	}
	return id, nil
}

// brokerUser is the user the node authenticates as (PLAIN, from the URL;
// amqp091-go's default is guest). The broker checks an event's user-id
// against it, so an event says whose credential published it.
func brokerUser(amqpURL string) string {
	u, err := amqp.ParseURI(amqpURL)
	if err != nil {
		return ""
	}
	return u.Username
}

// newID returns a new ULID for an event or request made at now.
func newID(now time.Time) string {
	return ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
}

// encodeBody turns an emit's body or a call's request into JSON within the
// node's body limit (wire.EncodeBody).
func (n *Node) encodeBody(body any) ([]byte, error) {
	return wire.EncodeBody(body, n.cfg.MaxBodyBytes)
}

// Ready says whether the node does its work now, and if not, why: it has
// its broker connections (and so the topology, declared on each), the
// broker does not block its publishing, every module is attached on the
// current session, and no module process is being restarted. meshd's
// /readyz answers with it.
func (n *Node) Ready() error {
	if err := n.Err(); err != nil {
		return err
	}
	s := n.session()
	switch {
	case s == nil:
		return errors.New("not connected to the broker, trying (emits are spooled)")
	case s.isBlocked():
		return errors.New("the broker blocks publishing (a memory or disk alarm); emits are spooled, consuming goes on")
	}
	n.mu.Lock()
	var failed []string
	for name, err := range n.failed {
		failed = append(failed, fmt.Sprintf("module %s stopped: %v", name, err))
	}
	n.mu.Unlock()
	if len(failed) > 0 {
		slices.Sort(failed)
		return errors.New(strings.Join(failed, "; "))
	}
	mods, plugins := n.loaded()
	var waiting []string
	for _, m := range mods {
		if m.attachedOn.Load() != s {
			waiting = append(waiting, m.def.Name)
		}
	}
	for _, pm := range plugins {
		if err := pm.Refused(); err != nil {
			return fmt.Errorf("module %s stopped: %w", pm.Name(), err)
		}
		if pm.restarting() {
			waiting = append(waiting, pm.Name()+" (its process is restarting)")
		}
	}
	if len(waiting) > 0 {
		slices.Sort(waiting)
		return fmt.Errorf("modules not consuming yet: %s", strings.Join(waiting, ", "))
	}
	var down []string
	for _, m := range mods {
		for q, why := range m.QueuesDown() {
			down = append(down, fmt.Sprintf("module %s cannot consume queue %s (%s; trying again)", m.def.Name, q, why))
		}
		if why := m.ToolsDown(); why != "" {
			down = append(down, fmt.Sprintf("module %s cannot serve its tools (%s; trying again)", m.def.Name, why))
		}
	}
	if len(down) > 0 {
		slices.Sort(down)
		return errors.New(strings.Join(down, "; "))
	}
	return nil
}

// loaded returns the modules loaded on the node and its module processes,
// a snapshot taken under n.mu, to work on without it.
func (n *Node) loaded() ([]*Module, []*PluginModule) {
	n.mu.Lock()
	defer n.mu.Unlock()
	mods := make([]*Module, 0, len(n.modules))
	for _, m := range n.modules {
		mods = append(mods, m)
	}
	return mods, slices.Clone(n.plugins)
}
