package meshtest

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/asyncemit"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/filter"
	"github.com/meshkit/mesh/internal/grant"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/setup"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Config sets the rules a Mesh runs modules by. Zero fields take the
// defaults of a meshd node.
type Config struct {
	// Node is the name of the node the modules run on. Default "test".
	Node string
	// MaxAttempts is how many times a handler is tried before its event
	// is dead-lettered. Default 5.
	MaxAttempts int
	// HandlerTimeout bounds one handler call, in real time: past it the
	// handler's context is cancelled and the call counts as a failed
	// attempt. Default 30s.
	HandlerTimeout time.Duration
	// RetryMin and RetryMax bound the exponential back-off before a failed
	// event is tried again, on the mesh's clock. Defaults 200ms and 30s.
	RetryMin, RetryMax time.Duration
	// CallTimeout is a call's deadline, in real time, when its context has
	// none. Default 30s.
	CallTimeout time.Duration
	// MaxBodyBytes refuses bigger bodies. Default 1 MiB.
	MaxBodyBytes int
	// Start is the mesh clock's first reading. Default
	// 2026-01-01T00:00:00Z.
	Start time.Time
	// Logger receives the modules' logs. Default: discarded.
	Logger *slog.Logger
}

func (c *Config) withDefaults() {
	if c.Node == "" {
		c.Node = "test"
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = 30 * time.Second
	}
	if c.RetryMin == 0 {
		c.RetryMin = 200 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 30 * time.Second
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.Start.IsZero() {
		c.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// ModuleConfig is how one module runs, as a module's entry in meshd's
// config. Zero fields take the Mesh's defaults.
type ModuleConfig struct {
	// Concurrency is how many of the module's handler calls Settle runs
	// at once (on goroutines: run the test with -race to find what they
	// share). Default 1: one at a time, in queue order.
	Concurrency int
	// MaxAttempts overrides Config.MaxAttempts for this module.
	MaxAttempts int
	// HandlerTimeout overrides Config.HandlerTimeout for this module.
	HandlerTimeout time.Duration
	// AllowDuplicates turns off de-duplication by event id for the module.
	AllowDuplicates bool
	// EmitGrants are the patterns of full types outside its namespace the
	// module may emit with sdk.AsFullType (emit_grants).
	EmitGrants []string
	// ToolGrants, when not nil, are the patterns of the tools the module
	// may serve (tools); nil places no limit.
	ToolGrants []string
	// AllowUndeclaredEmits lets the module emit event names its
	// sdk.Module.Emits does not list (allow_undeclared_emits); by default
	// such an emit fails with sdk.ErrForbidden, as on a node.
	AllowUndeclaredEmits bool
	// SkipBodyValidation keeps the x-schema of the module's declared
	// schemas (sdk.Module.Schemas) but does not validate its emitted
	// bodies against them (skip_body_validation), as on a node.
	SkipBodyValidation bool
	// Grants, when set, hold the module to the grants of its entry in
	// meshd's config, denying by default as a node does; they replace
	// ToolGrants and EmitGrants. Without Grants the module may call,
	// consume, receive dead letters and read the history freely.
	Grants *Grants
}

// Grants are a module's grants as its entry in meshd's config gives them
// (docs/config.md). What they do not name is refused as meshd refuses it,
// with meshd's words (sdk.ErrForbidden naming the key to add): a call at
// the call, a consumed queue, a DeadLetters handler without dead_letters
// and a History handler without history: true at Load.
type Grants struct {
	// Tools are the patterns of the tools the module may serve (tools:).
	Tools []string
	// Calls are the patterns of the tools it may call (calls:).
	Calls []string
	// Emits are the patterns of the full types outside its namespace it
	// may emit with sdk.AsFullType (emit_grants:).
	Emits []string
	// Consumes are the patterns of the existing queues it may consume
	// (consumes:).
	Consumes []string
	// DeadLetters are the patterns of the event types whose dead letters
	// its DeadLetters handler receives (dead_letters:).
	DeadLetters []string
	// History lets its History handler read the mesh's history
	// (history: true).
	History bool
}

// orEmpty is s, or an empty list (deny all) for nil.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// DeadLetter is an event a module gave up on.
type DeadLetter struct {
	// Event is the event as its last attempt saw it.
	Event sdk.Event
	// Module is the module that gave up, and Queue the queue: the
	// module's (<node>.<module>.events), or the existing queue it
	// consumes (sdk.Mesh.Consume) the message came from.
	Module, Queue string
	// Reason is "permanent" (the handler said so), "forbidden" (the
	// handler's emit or call was refused for want of a grant, which no
	// retry changes), "delivery_limit" (every attempt failed), "expired" (the event's time to live, see
	// sdk.WithTTL, ran out on the mesh's clock before a handler took it)
	// "schema" (its x-schema is not a version the handler reads, see
	// sdk.Module.Reads: the handler did not run) or "conflict" (its id
	// was handled with other content: the node's record says so, or the
	// handler's error is sdk.ErrConflict, as sdk/outbox's inbox returns).
	Reason string
	// Attempts is how many times the handler was tried (for "schema",
	// the delivery's attempt, as a node counts it: 1).
	Attempts int
	// Err is the last error, as text.
	Err string
}

// Call is one tool call made on the mesh, with its outcome.
type Call struct {
	// ID is the request's id; Caller the calling module (or the source
	// given to Mesh.Call); CausationID the handled event or request it was
	// made in, or "".
	ID, Tool, Caller, CausationID string
	// Request is the JSON request and Response the JSON response, or nil
	// when the call failed.
	Request, Response json.RawMessage
	// Err is the call's error, or nil.
	Err error
	// Ran says whether the tool ran: false for a call answered from the
	// server's stored answer, that no server took, or whose request the
	// tool's declared request schema refused (invalid_request).
	Ran bool
}

// Mesh is an in-memory mesh that runs sdk.Modules by the rules of a meshd
// node. It is safe for concurrent use, but Settle runs one at a time:
// handlers run in it, each module's up to its concurrency at once.
type Mesh struct {
	cfg Config

	mu        sync.Mutex
	now       time.Time
	modules   []*module
	pending   []*delivery // ready to run, in order
	retries   []*delivery // waiting for their retry time
	delayed   []delayed   // emitted with sdk.After or sdk.At, not due yet, in emit order
	emitted   []sdk.Event
	history   []sdk.Event         // every event routed, in order, each with its Offset: the mesh's history (sdk.Module.History)
	fates     map[string][]string // what became of each event, by id (Explain)
	dead      []DeadLetter
	filtered  []Filtered
	traces    map[string]trace.TraceID // by event id: the trace an event emitted in one is in
	calls     []Call
	settling  bool
	closed    bool
	runCancel context.CancelFunc
	runCtx    context.Context
	runs      sync.WaitGroup
	idle      *sync.Cond // on mu: broadcast when a Settle returns
	stubs     *module    // serves the tools Stub stands in for; nil until then
}

// Stub stands in for the module that serves the tool key elsewhere on the
// mesh: h answers each call of it from now on (a later Stub of the key
// replaces it), ahead of any loaded module that serves it, by the rules of
// a node's server: a *sdk.ToolError as it is, a Permanent error as
// "rejected", another error as "failed", a panic as "internal"; a request
// a retried handler repeats is answered from the stored answer. The calls
// are recorded in Calls, as others are, with the request each sent. A bad
// tool key or a nil h is refused with sdk.ErrInvalid.
func (m *Mesh) Stub(key string, h sdk.ToolHandler) error {
	if err := wire.ValidateToolKey(key); err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	if h == nil {
		return fmt.Errorf("stub %q: %w: handler is nil", key, sdk.ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stubs == nil {
		m.stubs = &module{mesh: m, def: sdk.Module{Name: "stub"}, log: m.cfg.Logger.With("module", "stub"),
			handled: map[string]uint64{}, answers: map[string]*answer{}, held: map[string]bool{}, runDone: make(chan struct{})}
	}
	m.stubs.tools = slices.DeleteFunc(m.stubs.tools, func(t tool) bool { return t.key == key })
	m.stubs.tools = append(m.stubs.tools, tool{key: key, handler: h})
	return nil
}

// StubAnswer stands in for the tool key as Stub does, with one answer to
// every call: resp (marshalled to JSON) when err is nil, otherwise err, as
// a server's handler would return it (a *sdk.ToolError to choose the
// code).
func (m *Mesh) StubAnswer(key string, resp any, err error) error {
	return m.Stub(key, sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) {
		if err != nil {
			return nil, err
		}
		return resp, nil
	}))
}

// New returns an empty mesh. Close it when the test ends, to stop the
// modules' Run functions.
func New(cfg Config) *Mesh {
	cfg.withDefaults()
	m := &Mesh{cfg: cfg, now: cfg.Start}
	m.idle = sync.NewCond(&m.mu)
	m.runCtx, m.runCancel = context.WithCancel(context.Background())
	return m
}

type module struct {
	mesh  *Mesh
	async *asyncemit.Window // its EmitAsync calls under way
	def   sdk.Module
	cfg   ModuleConfig
	log   *slog.Logger
	setup *setup.Recorder
	// contracts are its declared schemas, compiled at Load (nil: it
	// declares none): its emits and deliveries are checked on them.
	contracts *schema.Contracts
	started   bool
	subs      []subscription    // fixed when started
	queues    []setup.Entry     // existing queues it consumes (Consume), fixed when started
	held      map[string]bool   // consumed queues held (Hold): their messages wait
	tools     []tool            // fixed when started
	handled   map[string]uint64 // event ids handled, with their digests (wire.Digest), for de-duplication
	answers   map[string]*answer
	runDone   chan struct{} // closed when Run returned (at once without one)
	runErr    error         // why Run failed while the module ran: it handles nothing more
	// historyNext is the offset of the history its History handler gets
	// next.
	historyNext int64
	// callGrants are the tools it may call (Grants.Calls; nil: any), and
	// deadPatterns the event types whose dead letters its DeadLetters
	// handler gets.
	callGrants   []string
	deadPatterns []string
}

type subscription struct {
	pattern string
	handler sdk.Handler
	opts    wire.HandlerOptions
}

type tool struct {
	key     string
	handler sdk.ToolHandler
	opts    wire.HandlerOptions
}

type answer struct {
	body json.RawMessage
	te   *sdk.ToolError
}

type delivery struct {
	module  *module
	dead    bool   // a dead letter, for the module's DeadLetters handler
	queue   string // the consumed queue it came from (Put), or ""
	ev      sdk.Event
	attempt int
	due     time.Time
	expires time.Time // zero: no time to live
}

// Load runs the module's Setup, starts it consuming and starts its Run,
// whose context ends at Close. Load refuses what a node refuses: a bad
// name or kind, a bad declared schema (sdk.Module.Schemas, also for a
// tool Setup did not serve) or reads (sdk.Module.Reads, also for a
// pattern Setup did not subscribe), and Setup's error.
func (m *Mesh) Load(def sdk.Module, mc ModuleConfig) error {
	if err := wire.ValidateModule(def.Name, string(def.Kind), def.Emits, def.Calls); err != nil {
		return err
	}
	contracts, err := contractsOf(def, mc)
	if err != nil {
		return fmt.Errorf("load module %s: %w", def.Name, err)
	}
	if mc.MaxAttempts == 0 {
		mc.MaxAttempts = m.cfg.MaxAttempts
	}
	if mc.Concurrency < 0 {
		return fmt.Errorf("load module %s: %w: concurrency %d is negative", def.Name, sdk.ErrInvalid, mc.Concurrency)
	}
	if mc.Concurrency == 0 {
		mc.Concurrency = 1
	}
	if mc.HandlerTimeout == 0 {
		mc.HandlerTimeout = m.cfg.HandlerTimeout
	}
	deadPatterns := []string{"#"}
	if g := mc.Grants; g != nil {
		mc.ToolGrants, mc.EmitGrants = orEmpty(g.Tools), g.Emits
		if def.DeadLetters != nil {
			p, err := grant.DeadLetters(def.Name, orEmpty(g.DeadLetters))
			if err != nil {
				return fmt.Errorf("load module %s: %w", def.Name, err)
			}
			deadPatterns = p
		}
		if def.History != nil && !g.History {
			return fmt.Errorf("load module %s: %w", def.Name, grant.History(def.Name))
		}
	}
	mod := &module{mesh: m, async: asyncemit.New(), def: def, cfg: mc, log: m.cfg.Logger.With("module", def.Name), setup: setup.New(def.Name, mc.ToolGrants),
		contracts: contracts, handled: make(map[string]uint64), answers: make(map[string]*answer), held: make(map[string]bool), runDone: make(chan struct{}),
		deadPatterns: deadPatterns}
	if g := mc.Grants; g != nil {
		mod.callGrants = orEmpty(g.Calls)
		mod.setup.GrantConsumes(orEmpty(g.Consumes))
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return sdk.ErrClosed
	}
	if slices.ContainsFunc(m.modules, func(o *module) bool { return o.def.Name == def.Name }) {
		m.mu.Unlock()
		return fmt.Errorf("load module %s: a module of that name is already loaded", def.Name)
	}
	m.mu.Unlock()
	if def.Setup != nil {
		if err := def.Setup(&moduleMesh{mod}); err != nil {
			return fmt.Errorf("load module %s: setup: %w", def.Name, err)
		}
	}
	if h := def.History; h != nil {
		if h.From == nil || h.Handle == nil {
			return fmt.Errorf("load module %s: %w: its History needs both From and Handle", def.Name, sdk.ErrInvalid)
		}
		from, err := h.From(handlerlog.With(context.Background(), mod.log))
		if err != nil {
			return fmt.Errorf("load module %s: ask where it reads the history from: %w", def.Name, err)
		}
		mod.historyNext = max(from, 0)
	}
	subs, tools := mod.setup.Fix()
	patterns := make([]string, len(subs))
	for i, s := range subs {
		patterns[i] = s.Key
	}
	if err := contracts.CheckPatterns(patterns); err != nil {
		return fmt.Errorf("load module %s: %w", def.Name, err)
	}
	served := make([]string, len(tools))
	for i, t := range tools {
		served[i] = t.Key
	}
	if err := contracts.CheckTools(served); err != nil {
		return fmt.Errorf("load module %s: %w", def.Name, err)
	}
	m.mu.Lock()
	for _, s := range subs {
		mod.subs = append(mod.subs, subscription{pattern: s.Key, handler: s.Handler.(sdk.Handler), opts: s.Options})
	}
	for _, t := range tools {
		mod.tools = append(mod.tools, tool{key: t.Key, handler: t.Handler.(sdk.ToolHandler), opts: t.Options})
	}
	mod.queues = mod.setup.Consumed()
	mod.started = true
	m.modules = append(m.modules, mod)
	m.mu.Unlock()
	if def.Run == nil {
		close(mod.runDone)
		return nil
	}
	m.runs.Add(1)
	go func() {
		defer m.runs.Done()
		defer close(mod.runDone)
		err := def.Run(handlerlog.With(m.runCtx, mod.log), &moduleMesh{mod})
		switch {
		case err == nil:
		case m.runCtx.Err() != nil:
			if !errors.Is(err, context.Canceled) {
				mod.log.Warn("module run ended with an error as the module stopped", "err", err)
			}
		default:
			// As a node stops an in-process module whose Run failed: its
			// deliveries wait, unhandled.
			mod.log.Error("module run failed; the module stops", "err", err)
			m.mu.Lock()
			mod.runErr = fmt.Errorf("its Run failed: %w", err)
			m.mu.Unlock()
		}
	}()
	return nil
}

// WaitRun waits until the Run of the module named name returns, or ctx ends,
// and returns Run's error (nil for a module without Run): what a node
// does with a Run that fails, the test mesh does too (the module stops
// handling: its deliveries wait, unhandled).
func (m *Mesh) WaitRun(ctx context.Context, name string) error {
	m.mu.Lock()
	i := slices.IndexFunc(m.modules, func(mod *module) bool { return mod.def.Name == name })
	if i < 0 {
		m.mu.Unlock()
		return fmt.Errorf("meshtest: no module %q is loaded", name)
	}
	mod := m.modules[i]
	m.mu.Unlock()
	select {
	case <-mod.runDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return mod.runErr
}

// Close waits for a Settle running in another goroutine to finish (the
// handlers in flight drain first, as on a node), then cancels the
// modules' Run contexts and waits for them to return. Emits and calls
// then fail with sdk.ErrClosed. Do not call it from a handler, nor while
// a handler waits for something only Close would end: it waits for them.
func (m *Mesh) Close() {
	m.mu.Lock()
	for m.settling {
		m.idle.Wait()
	}
	m.closed = true
	m.mu.Unlock()
	m.runCancel()
	m.runs.Wait()
}

// Now is the mesh's clock. It moves only when Advance or Settle moves it.
func (m *Mesh) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d (retries and delayed events that
// come due run at the next Settle).
func (m *Mesh) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
}

// Emit publishes an event of any full type from outside the modules, as
// an operator or another node would (meshctl emit), with source as its
// emitter. It returns the event's id; the event is handled at the next
// Settle.
func (m *Mesh) Emit(ctx context.Context, source, eventType string, body any, opts ...sdk.EmitOption) (string, error) {
	raw, o, err := wire.SourceEmit(source, eventType, body, opts, m.cfg.MaxBodyBytes)
	if err != nil {
		return "", err
	}
	return m.publish(ctx, source, eventType, raw, o, "")
}

// Redeliver hands every module consuming it a copy of an event already
// emitted (by its id) again, as the broker does after a lost
// acknowledgement or a resend: a module that handled it acknowledges the
// copy without handling it again, unless it allows duplicates.
func (m *Mesh) Redeliver(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range m.emitted {
		if ev.ID == id {
			m.route(ev, time.Time{})
			return nil
		}
	}
	return fmt.Errorf("redeliver %s: no such event was emitted", id)
}

// RedeliverWith hands every module consuming it a copy of an event already
// emitted (by its id) with another body, as a producer that reuses an id
// would. A module that handled the id does not drop the copy as a
// duplicate, nor handle it: it dead-letters it with reason "conflict"
// (DeadLetters lists it), as a node does; one that allows duplicates
// handles it. body is marshalled to JSON unless it is a json.RawMessage.
func (m *Mesh) RedeliverWith(id string, body any) error {
	raw, ok := body.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("redeliver %s: marshal body: %w", id, err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return fmt.Errorf("redeliver %s: body is not valid JSON", id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range m.emitted {
		if ev.ID == id {
			ev.Body = raw
			m.route(ev, time.Time{})
			return nil
		}
	}
	return fmt.Errorf("redeliver %s: no such event was emitted", id)
}

// eventDigest is ev's digest as a node keeps it (wire.Digest).
func eventDigest(ev sdk.Event) uint64 {
	return wire.Digest(ev.Type, wire.Meta{Source: ev.Source, Schema: ev.Schema, CausationID: ev.CausationID, Extra: ev.Headers}, ev.Body)
}

// Call invokes a tool from outside the modules, as meshctl call does, with
// source as the caller. The tool runs in the calling goroutine.
func (m *Mesh) Call(ctx context.Context, source, tool string, req, resp any) error {
	if err := wire.ValidateWord("source", source); err != nil {
		return err
	}
	return m.call(ctx, source, tool, req, resp)
}

// Settle runs everything pending until the mesh is quiet: every event
// emitted is handled, and every retry runs, the clock jumping ahead to
// each retry's time, until nothing is left to run. Handlers run one at a
// time, in the order their events reached the modules' queues.
//
// A delayed event (sdk.After, sdk.At) waits on the clock: Settle does not
// jump to it, so a test sees what happens before it is due. Once the clock
// reaches its delay rounded up to the second, as on a node (by Advance, or
// a retry's jump), it goes to the modules subscribed then, at once if a
// Settle is running, else at the next. Delayed lists what waits.
// AtMostOnce is a plain emit here: nothing is lost.
//
// The mesh keeps a history of every event routed, in order, each with its
// Offset from 0: once the deliveries are done, a module's History handler
// (sdk.Module.History) gets what it has not had, from where its From said
// at Load, in batches of up to 256; a batch it fails comes again at the
// next Settle.
func (m *Mesh) Settle() {
	m.mu.Lock()
	if m.settling {
		m.mu.Unlock()
		panic("meshtest: Settle called from a handler")
	}
	m.settling = true
	failed := map[*module]bool{} // History handlers that failed in this Settle: tried again at the next
	defer func() {
		m.mu.Lock()
		m.settling = false
		m.idle.Broadcast()
		m.mu.Unlock()
	}()
	for {
		m.comeDue()
		if !m.runnable() && len(m.retries) > 0 {
			next := m.retries[0]
			for _, r := range m.retries[1:] {
				if r.due.Before(next.due) {
					next = r
				}
			}
			if next.due.After(m.now) {
				m.now = next.due
			}
			m.comeDue()
			m.promote()
		}
		if !m.runnable() {
			if m.feedHistory(failed) {
				continue // what its handlers emitted runs next
			}
			m.mu.Unlock()
			return
		}
		batch := m.take()
		m.mu.Unlock()
		results := make([]handled, len(batch))
		if len(batch) == 1 {
			results[0] = batch[0].module.handle(batch[0])
		} else {
			var wg sync.WaitGroup
			for i, d := range batch {
				wg.Go(func() { results[i] = d.module.handle(d) })
			}
			wg.Wait()
		}
		m.mu.Lock()
		for i, d := range batch {
			d.module.settle(d, results[i])
		}
		m.promote()
	}
}

// feedHistory hands each module with a History handler the history it
// has not had yet, a batch of up to 256 events at a time, as a node does,
// and reports whether any took one. A failed batch is handed again at the
// next Settle (on a node, after a back-off), and nothing after it before.
// m.mu is held, and released while the handlers run.
func (m *Mesh) feedHistory(failed map[*module]bool) bool {
	progressed := false
	for _, mod := range slices.Clone(m.modules) {
		if mod.def.History == nil || failed[mod] || mod.runErr != nil || mod.historyNext >= int64(len(m.history)) {
			continue
		}
		batch := slices.Clone(m.history[mod.historyNext:min(mod.historyNext+256, int64(len(m.history)))])
		for i := range batch {
			batch[i].Headers = maps.Clone(batch[i].Headers)
		}
		m.mu.Unlock()
		ctx, cancel := context.WithTimeout(handlerlog.With(context.Background(), mod.log), mod.cfg.HandlerTimeout)
		err, _ := execute.Safely(func() error { return mod.def.History.Handle(ctx, batch) })
		cancel()
		m.mu.Lock()
		if err != nil {
			mod.log.Error("the module failed a batch of the history; it gets the same batch again at the next Settle", "from", batch[0].Offset, "err", err)
			failed[mod] = true
			continue
		}
		mod.historyNext += int64(len(batch))
		progressed = true
	}
	return progressed
}

// take removes from the pending deliveries the next one and, up to its
// module's concurrency, the module's next ones after it (one per event
// id: a node holds a second copy of an id back until the first is
// settled). m.mu is held.
func (m *Mesh) take() []*delivery {
	i := slices.IndexFunc(m.pending, func(d *delivery) bool { return !d.waits() })
	first := m.pending[i]
	batch := []*delivery{first}
	rest := make([]*delivery, 0, len(m.pending))
	rest = append(rest, m.pending[:i]...) // held: they wait in their queue
	m.pending = m.pending[i:]
	limit := first.module.cfg.Concurrency
	if first.queue != "" {
		limit = first.module.prefetchOf(first.queue)
	}
	for _, d := range m.pending[1:] {
		if d.module == first.module && d.queue == first.queue && d.dead == first.dead && len(batch) < limit &&
			!slices.ContainsFunc(batch, func(b *delivery) bool { return b.ev.ID == d.ev.ID }) {
			batch = append(batch, d)
			continue
		}
		rest = append(rest, d)
	}
	m.pending = rest
	return batch
}

// waits says whether d waits in a held queue. m.mu is held.
func (d *delivery) waits() bool {
	return d.module.runErr != nil || (d.queue != "" && d.module.held[d.queue])
}

// runnable reports whether a pending delivery may run now. m.mu is held.
func (m *Mesh) runnable() bool {
	return slices.ContainsFunc(m.pending, func(d *delivery) bool { return !d.waits() })
}

// promote moves the retries due by now to the pending deliveries, in due
// order. m.mu is held.
func (m *Mesh) promote() {
	slices.SortStableFunc(m.retries, func(a, b *delivery) int { return a.due.Compare(b.due) })
	n := 0
	for _, r := range m.retries {
		if r.due.After(m.now) {
			break
		}
		m.pending = append(m.pending, r)
		n++
	}
	m.retries = m.retries[n:]
}

// Put puts a message into an existing broker queue that a loaded module
// consumes (sdk.Mesh.Consume), as the system that fills it would: id is
// its message id, body its bytes as they are (not necessarily JSON),
// typ its routing key ("" is the queue's name, as for a message sent
// straight to the queue). Settle then hands it to the module's handler,
// with retries and dead letters as for an event. Put fails when no
// loaded module consumes queue.
func (m *Mesh) Put(queue, id, typ string, body []byte, headers map[string]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return sdk.ErrClosed
	}
	if typ == "" {
		typ = queue
	}
	for _, mod := range m.modules {
		if mod.handlerOf(queue) != nil {
			ev := sdk.Event{ID: id, Type: typ, Time: m.now, Headers: maps.Clone(headers), Body: slices.Clone(body), Queue: queue}
			if ev.Headers == nil {
				ev.Headers = map[string]string{}
			}
			m.pending = append(m.pending, &delivery{module: mod, queue: queue, ev: ev, attempt: 1})
			m.note(id, "put into queue %s, consumed by module %s", queue, mod.def.Name)
			return nil
		}
	}
	return fmt.Errorf("meshtest: no loaded module consumes queue %q", queue)
}

// handlerOf is the module's handler of a consumed queue, or nil.
func (mod *module) handlerOf(queue string) sdk.Handler {
	for _, q := range mod.queues {
		if q.Key == queue {
			return q.Handler.(sdk.Handler)
		}
	}
	return nil
}

// consumedOf is the module's subscription to a consumed queue: its
// handler and options.
func (mod *module) consumedOf(queue string) subscription {
	for _, q := range mod.queues {
		if q.Key == queue {
			return subscription{pattern: queue, handler: q.Handler.(sdk.Handler), opts: q.Options}
		}
	}
	return subscription{}
}

// prefetchOf is the prefetch the module consumes queue with.
func (mod *module) prefetchOf(queue string) int {
	for _, q := range mod.queues {
		if q.Key == queue {
			return q.Prefetch
		}
	}
	return 1
}

// Filtered is an event a module's filters rejected (sdk.Filter): it was
// acknowledged without running a handler, and cost no attempt.
type Filtered struct {
	Event  sdk.Event
	Module string
}

// Filtered returns every delivery the modules' filters rejected so far,
// in order.
func (m *Mesh) Filtered() []Filtered {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.filtered)
}

// newSpan is a span context of its own in trace tid, sampled but recorded
// nowhere: the test mesh has no tracer, but the handling of a traced event
// is in its trace, as on a node.
func newSpan(tid trace.TraceID) trace.SpanContext {
	var sid trace.SpanID
	for !sid.IsValid() {
		_, _ = cryptorand.Read(sid[:])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
}

// filterEvent is what a filter reads of ev.
func filterEvent(ev sdk.Event) *filter.Event {
	return &filter.Event{Type: ev.Type, Source: ev.Source, Node: ev.Node, Schema: ev.Schema, User: ev.UserID, Queue: ev.Queue, Headers: ev.Headers, Body: ev.Body}
}

// Emitted returns every event published on the mesh so far, in order.
func (m *Mesh) Emitted() []sdk.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.emitted)
}

// DeadLetters returns every event a module gave up on so far, in order.
// Each is also handed to every module with a DeadLetters handler
// (sdk.Module.DeadLetters), with the event's Dead fields set.
func (m *Mesh) DeadLetters() []DeadLetter {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.dead)
}

// Calls returns every tool call made on the mesh so far, in order.
func (m *Mesh) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// publish records an event and queues it for every module whose patterns
// match. id is its id, or "" for a fresh one.
func (m *Mesh) publish(ctx context.Context, source, eventType string, raw []byte, o wire.EmitOptions, id string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return "", sdk.ErrClosed
	}
	if id == "" {
		id = ulid.MustNew(ulid.Timestamp(m.now), ulid.DefaultEntropy()).String()
	}
	if o.CausationID == "" {
		o.CausationID = causation.From(ctx)
	}
	if err := wire.CheckCausation(o.CausationID); err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	if err := o.CheckDue(m.now); err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	ev := sdk.Event{ID: id, Type: eventType, Source: source, Node: m.cfg.Node, Time: m.now,
		CausationID: o.CausationID, Schema: o.Schema, Headers: map[string]string{}, Body: json.RawMessage(slices.Clone(raw))}
	due := o.Due(m.now)
	if due.After(m.now) {
		ev.Headers[wire.HeaderDue] = due.UTC().Format(time.RFC3339Nano)
	}
	if o.HasKey { // as a node's event carries it (sdk.WithKey)
		ev.Headers[wire.HeaderPartitionKey] = o.Key
	}
	m.emitted = append(m.emitted, ev)
	if ev.CausationID != "" {
		m.note(id, "emitted as %s by %s, caused by %s", eventType, source, ev.CausationID)
		m.note(ev.CausationID, "caused %s %s, emitted by %s", eventType, id, source)
	} else {
		m.note(id, "emitted as %s by %s", eventType, source)
	}
	if tid := trace.SpanContextFromContext(ctx).TraceID(); tid.IsValid() {
		if m.traces == nil {
			m.traces = map[string]trace.TraceID{}
		}
		m.traces[id] = tid
	}
	if due.After(m.now) {
		// As a node's cascade delivers it: the delay rounded up to the
		// second, routed to the modules subscribed then, its TTL counting
		// from then.
		secs, _ := delay.Seconds(due.Sub(m.now)) // bounded by CheckDue
		m.delayed = append(m.delayed, delayed{ev: ev, at: m.now.Add(time.Duration(secs) * time.Second), ttl: o.TTL})
		m.note(id, "delayed until %s on the mesh's clock (Advance moves it; Delayed lists what waits)", m.now.Add(time.Duration(secs)*time.Second).Format(time.RFC3339))
		return id, nil
	}
	var expires time.Time
	if o.TTL > 0 {
		expires = m.now.Add(o.TTL)
	}
	m.route(ev, expires)
	return id, nil
}

// delayed is an event waiting on the mesh's clock until at.
type delayed struct {
	ev  sdk.Event
	at  time.Time
	ttl time.Duration
}

// Delayed returns the events emitted with sdk.After or sdk.At that are not
// due yet on the mesh's clock, in the order they come due; each has the
// header x-due, when it is due.
func (m *Mesh) Delayed() []sdk.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	waiting := slices.Clone(m.delayed)
	slices.SortStableFunc(waiting, func(a, b delayed) int { return a.at.Compare(b.at) })
	out := make([]sdk.Event, len(waiting))
	for i, d := range waiting {
		out[i] = d.ev
	}
	return out
}

// comeDue routes the delayed events due by now, in due order. m.mu is
// held.
func (m *Mesh) comeDue() {
	slices.SortStableFunc(m.delayed, func(a, b delayed) int { return a.at.Compare(b.at) })
	n := 0
	for _, d := range m.delayed {
		if d.at.After(m.now) {
			break
		}
		var expires time.Time
		if d.ttl > 0 {
			expires = m.now.Add(d.ttl)
		}
		m.route(d.ev, expires)
		n++
	}
	m.delayed = m.delayed[n:]
}

// route queues ev for every module one of whose patterns matches it.
// m.mu is held.
func (m *Mesh) route(ev sdk.Event, expires time.Time) {
	ev.Offset = int64(len(m.history))
	m.history = append(m.history, ev)
	ev.Offset = 0
	var names []string
	for _, mod := range m.modules {
		if slices.ContainsFunc(mod.subs, func(s subscription) bool { return wire.MatchPattern(s.pattern, ev.Type) }) {
			m.pending = append(m.pending, &delivery{module: mod, ev: ev, attempt: 1, expires: expires})
			names = append(names, mod.def.Name)
		}
	}
	m.note(ev.ID, "%s", m.routedNote(ev.Type, names))
}

// backoff is the delay before attempt+1, by the node's policy
// (execute.Backoff) without its jitter, so tests repeat exactly.
func (m *Mesh) backoff(attempt int) time.Duration {
	return execute.Backoff(attempt, m.cfg.RetryMin, m.cfg.RetryMax, nil)
}

// handled is what became of one delivery's handler call.
type handled struct {
	ev      sdk.Event
	dedup   bool // the module de-duplicates this event's id
	skipped bool // already handled: acknowledged without running
	// conflict: its id was handled with other content (wire.Digest):
	// dead-lettered without running, with this error.
	conflict string
	expired  bool // its time to live ran out while it waited: not run
	// deadlinePassed: a consumed queue's message whose x-deadline passed:
	// not run.
	deadlinePassed bool
	// filtered: no filter of the patterns that match it accepted it:
	// acknowledged without running.
	filtered bool
	// unread: its x-schema is not a version the handler reads
	// (sdk.Module.Reads): dead-lettered without running.
	unread error
	err    error
}

// handle runs one delivery's handler, unless the module already handled
// its id (and de-duplicates it).
func (mod *module) handle(d *delivery) handled {
	var sub subscription
	fe := filterEvent(d.ev)
	h := handled{ev: d.ev}
	switch {
	case d.dead:
		sub = subscription{handler: mod.def.DeadLetters} // dead letters are not filtered
	case d.queue != "":
		sub = mod.consumedOf(d.queue)
		h.filtered = !sub.opts.Filter.Match(fe)
	default:
		i := slices.IndexFunc(mod.subs, func(s subscription) bool {
			return wire.MatchPattern(s.pattern, d.ev.Type) && s.opts.Filter.Match(fe)
		})
		if h.filtered = i < 0; !h.filtered {
			sub = mod.subs[i]
		}
	}
	h.dedup = !d.dead && d.queue == "" && !mod.cfg.AllowDuplicates && !sub.opts.AllowDuplicates
	if d.queue != "" {
		mod.mesh.mu.Lock()
		_, h.deadlinePassed = wire.Expired(d.ev.Headers[wire.HeaderDeadline], mod.mesh.now)
		mod.mesh.mu.Unlock()
		if h.deadlinePassed {
			return h
		}
	}
	mod.mesh.mu.Lock()
	recorded, seen := mod.handled[d.ev.ID]
	tid := mod.mesh.traces[d.ev.ID]
	h.expired = !d.expires.IsZero() && !mod.mesh.now.Before(d.expires)
	mod.mesh.mu.Unlock()
	if h.expired { // the broker sets it aside before any filter reads it
		h.filtered = false
		return h
	}
	if h.filtered {
		return h
	}
	if !d.dead && d.queue == "" {
		if h.unread = mod.contracts.Read(sub.pattern, d.ev.Schema); h.unread != nil {
			return h
		}
	}
	if h.dedup && seen {
		if digest := eventDigest(d.ev); digest != recorded {
			h.conflict = wire.ConflictError(d.ev.ID, recorded, digest)
			return h
		}
		h.skipped = true
		return h
	}
	h.ev.Attempt = d.attempt
	h.ev.Redelivered = d.attempt > 1
	h.ev.Headers = maps.Clone(h.ev.Headers)
	h.err = mod.runHandler(sub.handler, h.ev, tid)
	return h
}

// settle applies the failure policy to a handled delivery, as a node's
// module does: acknowledged, retried after a back-off, or dead-lettered.
// m.mu is held.
func (mod *module) settle(d *delivery, h handled) {
	m := mod.mesh
	verdict, reason := execute.Decide(execute.Of(h.err), d.attempt, mod.cfg.MaxAttempts)
	switch {
	case d.dead && verdict == execute.GiveUp:
		// A dead letter is never dead-lettered again.
		mod.log.Error("dead letter dropped by the module's DeadLetters handler", "event_id", h.ev.ID, "attempt", d.attempt, "err", h.err)
		m.note(h.ev.ID, "module %s's DeadLetters handler gave up on its dead letter (attempt %d): %v", mod.def.Name, d.attempt, h.err)
	case h.skipped:
		m.note(h.ev.ID, "module %s: a duplicate of an event it handled: acknowledged without running", mod.def.Name)
	case h.conflict != "":
		m.deadLetter(mod, d, h.ev, wire.DeadReasonConflict, d.attempt, h.conflict)
	case h.filtered:
		m.filtered = append(m.filtered, Filtered{Event: h.ev, Module: mod.def.Name})
		m.note(h.ev.ID, "module %s: its handler's filter rejected it: acknowledged without running (Filtered lists it)", mod.def.Name)
	case h.deadlinePassed:
		m.deadLetter(mod, d, h.ev, wire.DeadReasonExpired, d.attempt, "its deadline "+h.ev.Headers[wire.HeaderDeadline]+" passed before a handler took it")
	case h.expired:
		m.deadLetter(mod, d, h.ev, "expired", d.attempt-1, "time to live ran out in the queue")
	case h.unread != nil:
		m.deadLetter(mod, d, h.ev, wire.DeadReasonSchema, d.attempt, h.unread.Error())
	case h.err == nil:
		if h.dedup {
			mod.handled[h.ev.ID] = eventDigest(d.ev)
		}
		m.note(h.ev.ID, "module %s handled it (attempt %d)", mod.def.Name, d.attempt)
	case verdict == execute.GiveUp:
		m.deadLetter(mod, d, h.ev, reason, d.attempt, h.err.Error())
	default: // execute.Retry
		m.retries = append(m.retries, &delivery{module: mod, dead: d.dead, queue: d.queue, ev: d.ev, attempt: d.attempt + 1, due: m.now.Add(m.backoff(d.attempt)), expires: d.expires})
		m.note(h.ev.ID, "module %s: attempt %d failed: %v; retried after %v", mod.def.Name, d.attempt, h.err, m.backoff(d.attempt))
	}
}

// deadLetter records that mod gave up on ev and hands the dead letter to
// every module with a DeadLetters handler, as mesh.events.dead does.
// m.mu is held.
func (m *Mesh) deadLetter(mod *module, d *delivery, ev sdk.Event, reason string, attempts int, errText string) {
	queue := wire.ModuleQueue(m.cfg.Node, mod.def.Name)
	if d.queue != "" {
		queue = d.queue
	}
	m.dead = append(m.dead, DeadLetter{Event: ev, Module: mod.def.Name, Queue: queue, Reason: reason, Attempts: attempts, Err: errText})
	m.note(ev.ID, "module %s dead-lettered it after %d attempt(s), reason %s: %s (DeadLetters lists it)", mod.def.Name, attempts, reason, errText)
	ev = d.ev // as emitted: the attempt and redelivered flag are the dead-letter queue's own
	ev.Headers = maps.Clone(ev.Headers)
	ev.DeadQueue = queue
	ev.DeadReason, ev.DeadAttempts, ev.DeadError, ev.DeadTime = reason, attempts, errText, m.now
	for _, to := range m.modules {
		if to.def.DeadLetters != nil && slices.ContainsFunc(to.deadPatterns, func(p string) bool { return wire.MatchPattern(p, ev.Type) }) {
			m.pending = append(m.pending, &delivery{module: to, dead: true, ev: ev, attempt: 1})
		}
	}
}

// runHandler calls h with the event as the context's cause and the
// handler timeout as its deadline, turning a panic into an error and a
// call that ran past its deadline into a timeout.
func (mod *module) runHandler(h sdk.Handler, ev sdk.Event, tid trace.TraceID) (err error) {
	ctx := context.Background()
	if tid.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, newSpan(tid))
	}
	ctx = handlerlog.Event(ctx, mod.log, ev.ID, ev.Type, tracecontext.IDs)
	ctx, cancel := context.WithTimeout(causation.Handling(ctx, ev.ID, ev.Time), mod.cfg.HandlerTimeout)
	defer cancel()
	err, _ = execute.Safely(func() error { return h.HandleEvent(ctx, ev) })
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		if err == nil {
			err = errors.New("handler returned nil after its deadline")
		}
		return fmt.Errorf("handler timed out after %v: %w", mod.cfg.HandlerTimeout, err)
	}
	return err
}

// call makes one tool call for caller, running the server's handler in
// the calling goroutine.
func (m *Mesh) call(ctx context.Context, caller, key string, req, resp any) error {
	if err := wire.ValidateToolKey(key); err != nil {
		return fmt.Errorf("call: %w", err)
	}
	raw, err := wire.EncodeBody(req, m.cfg.MaxBodyBytes)
	if err != nil {
		return fmt.Errorf("call %s: %w", key, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.CallTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return sdk.ErrClosed
	}
	id, _ := causation.Derive(ctx, caller, causation.KindCall, key, raw)
	if id == "" {
		id = ulid.MustNew(ulid.Timestamp(m.now), ulid.DefaultEntropy()).String()
	}
	var server *module
	var t tool
	for _, mod := range append([]*module{m.stubs}, m.modules...) { // a stand-in first
		if mod == nil || mod.runErr != nil { // a module whose Run failed serves nothing
			continue
		}
		if i := slices.IndexFunc(mod.tools, func(t tool) bool { return t.key == key }); i >= 0 {
			server, t = mod, mod.tools[i]
			break
		}
	}
	now := m.now
	m.mu.Unlock()
	rec := Call{ID: id, Tool: key, Caller: caller, CausationID: causation.From(ctx), Request: raw}
	defer func() {
		m.mu.Lock()
		m.calls = append(m.calls, rec)
		m.mu.Unlock()
	}()
	if server == nil {
		rec.Err = fmt.Errorf("call %s: %w", key, sdk.ErrNoServer)
		return rec.Err
	}
	// Only a call made in a handling (it has a cause) has a derived id
	// that a retry repeats: only its answer is remembered, as on a node.
	repeatable := rec.CausationID != ""
	m.mu.Lock()
	a, stored := server.answers[key+"\x00"+id]
	m.mu.Unlock()
	if err := server.contracts.Request(key, raw); err != nil {
		// Refused before the handler and never remembered, as a node
		// does: the same request is refused the same way again.
		server.log.Info("request refused: it does not conform to the tool's schema", "tool", key, "request_id", id, "err", err)
		a, stored = &answer{te: &sdk.ToolError{Code: wire.CodeInvalidRequest, Message: err.Error(), Permanent: true}}, true
	}
	if !stored {
		rec.Ran = true
		a = server.answer(ctx, t, sdk.Request{ID: id, Tool: key, Caller: caller, Node: m.cfg.Node, Time: now,
			Deadline: deadline, CausationID: rec.CausationID, Headers: map[string]string{}, Body: raw})
		if repeatable && !t.opts.AllowDuplicates && (a.te == nil || a.te.Permanent) {
			m.mu.Lock()
			server.answers[key+"\x00"+id] = a
			m.mu.Unlock()
		}
		if ctx.Err() != nil {
			rec.Err = fmt.Errorf("call %s: no answer in time: %w", key, ctx.Err())
			return rec.Err
		}
	}
	if a.te != nil {
		rec.Err = fmt.Errorf("call %s: %w", key, &sdk.ToolError{Code: a.te.Code, Message: a.te.Message, Permanent: a.te.Permanent})
		return rec.Err
	}
	rec.Response = a.body
	if resp != nil {
		if err := json.Unmarshal(a.body, resp); err != nil {
			rec.Err = fmt.Errorf("call %s: decode response: %w", key, err)
			return rec.Err
		}
	}
	return nil
}

// answer runs one request on the server's handler, as a node's serve
// does: a ToolError as it is, a Permanent error as "rejected", another
// error as "failed", a panic or a response that is not JSON as "internal",
// a response its declared schema refuses as "invalid_response".
func (mod *module) answer(ctx context.Context, t tool, req sdk.Request) *answer {
	if tid := trace.SpanContextFromContext(ctx).TraceID(); tid.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, newSpan(tid)) // the serving span, in the caller's trace
	}
	ctx = handlerlog.Request(ctx, mod.log, req.ID, req.Tool, req.Caller, tracecontext.IDs)
	ctx = causation.Handling(ctx, req.ID, req.Time)
	var resp any
	err, panicked := execute.Safely(func() (err error) { resp, err = t.handler.HandleCall(ctx, req); return err })
	if panicked {
		err = &sdk.ToolError{Code: wire.CodeInternal, Message: err.Error(), Permanent: true}
	}
	if err == nil {
		if resp == nil {
			resp = json.RawMessage("null")
		}
		body, err := wire.EncodeBody(resp, mod.mesh.cfg.MaxBodyBytes)
		if err != nil {
			return &answer{te: &sdk.ToolError{Code: wire.CodeInternal, Message: "encode response: " + err.Error(), Permanent: true}}
		}
		if err := mod.contracts.Response(req.Tool, body); err != nil {
			mod.log.Warn("response not sent: it does not conform to the tool's schema", "tool", req.Tool, "request_id", req.ID, "err", err)
			return &answer{te: &sdk.ToolError{Code: schema.CodeInvalidResponse, Message: err.Error(), Permanent: true}}
		}
		return &answer{body: body}
	}
	var te *sdk.ToolError
	if !errors.As(err, &te) {
		code, permanent := execute.ToolFailure(err)
		te = &sdk.ToolError{Code: code, Message: err.Error(), Permanent: permanent}
	}
	return &answer{te: te}
}

// moduleMesh is a module's sdk.Mesh on the test mesh, with the rules of
// a node's (runtime/mesh.go).
type moduleMesh struct{ mod *module }

var _ sdk.Mesh = moduleMesh{}

func (mm moduleMesh) isStarted() bool {
	mm.mod.mesh.mu.Lock()
	defer mm.mod.mesh.mu.Unlock()
	return mm.mod.started
}

// EmitAsync runs Emit on a goroutine of the module's window, as a node
// does, its outcome to done.
func (mm moduleMesh) EmitAsync(ctx context.Context, name string, body any, done func(string, error), opts ...sdk.EmitOption) error {
	if done == nil {
		return fmt.Errorf("emit %s: %w: EmitAsync needs a done function", name, sdk.ErrInvalid)
	}
	return mm.mod.async.Go(ctx, func(ctx context.Context) (string, error) { return mm.Emit(ctx, name, body, opts...) }, done)
}

func (mm moduleMesh) Emit(ctx context.Context, name string, body any, opts ...sdk.EmitOption) (string, error) {
	mod := mm.mod
	if !mm.isStarted() {
		return "", fmt.Errorf("emit %s: %w", name, wire.ErrNotStarted)
	}
	o, err := wire.ApplyEmitOptions(opts)
	if err != nil {
		return "", err
	}
	eventType, err := wire.EmitType(mod.def.Name, name, o.FullType, mod.cfg.EmitGrants)
	if err == nil && !mod.cfg.AllowUndeclaredEmits {
		err = wire.CheckDeclared(mod.def.Name, eventType, mod.def.Emits)
	}
	if err != nil {
		mod.mesh.noteRefused(ctx, mod.def.Name, "emit of "+name, err)
		return "", fmt.Errorf("emit: %w", err)
	}
	raw, err := wire.EncodeBody(body, mod.mesh.cfg.MaxBodyBytes)
	if err == nil {
		o.Schema, err = mod.contracts.Emit(eventType, raw, o.Schema)
	}
	if err != nil {
		mod.mesh.noteRefused(ctx, mod.def.Name, "emit of "+eventType, err)
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	id := ""
	switch {
	case o.Outbox != nil: // a row of the module's outbox (sdk/outbox), as a node derives its id
		id = causation.OutboxID(mod.def.Name, *o.Outbox)
	case !o.FreshID:
		id, _ = causation.Derive(ctx, mod.def.Name, causation.KindEmit, eventType, raw)
	}
	return mod.mesh.publish(ctx, mod.def.Name, eventType, raw, o, id)
}

func (mm moduleMesh) On(pattern string, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return mm.mod.setup.On(pattern, h, o, err) // a nil h arrives as a nil any
}

func (mm moduleMesh) Call(ctx context.Context, tool string, req, resp any) error {
	if !mm.isStarted() {
		return fmt.Errorf("call %s: %w", tool, wire.ErrNotStarted)
	}
	if err := grant.Call(mm.mod.def.Name, tool, mm.mod.callGrants); err != nil {
		if errors.Is(err, sdk.ErrForbidden) { // not a key against the naming rules
			mm.mod.log.Warn("call of a tool the node config does not grant refused", "tool", tool)
		}
		mm.mod.mesh.noteRefused(ctx, mm.mod.def.Name, "call of "+tool, err)
		return err
	}
	err := mm.mod.mesh.call(ctx, mm.mod.def.Name, tool, req, resp)
	mm.mod.mesh.noteRefused(ctx, mm.mod.def.Name, "call of "+tool, err)
	return err
}

func (mm moduleMesh) Consume(queue string, prefetch int, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return mm.mod.setup.Consume(queue, prefetch, h, o, err) // a nil h arrives as a nil any
}

// Exclusive is recorded; on the test mesh a module is any queue's only
// consumer anyway.
func (mm moduleMesh) Exclusive(queue string) error { return mm.mod.setup.Exclusive(queue) }

func (mm moduleMesh) Hold(queue string, held bool) error {
	if !mm.mod.setup.Consumes(queue) {
		return fmt.Errorf("hold %q: %w: module %s does not consume that queue", queue, sdk.ErrInvalid, mm.mod.def.Name)
	}
	mm.mod.mesh.mu.Lock()
	defer mm.mod.mesh.mu.Unlock()
	mm.mod.held[queue] = held
	return nil
}

func (mm moduleMesh) Serve(key string, h sdk.ToolHandler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return mm.mod.setup.Serve(key, h, o, err)
}

func (mm moduleMesh) Logger() *slog.Logger { return mm.mod.log }

// contractsOf compiles the schemas def declares, as a node does
// (runtime's contractsOf).
func contractsOf(def sdk.Module, mc ModuleConfig) (*schema.Contracts, error) {
	decls := make([]schema.Decl, len(def.Schemas))
	for i, s := range def.Schemas {
		decls[i] = schema.Decl{Event: s.Event, Tool: s.Tool, Version: s.Version, JSON: s.JSON, Response: s.Response}
	}
	return schema.New(def.Name, def.Emits, decls, def.Reads, !mc.SkipBodyValidation)
}
