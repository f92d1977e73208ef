// Package process runs an sdk.Module as a module process under meshd: it
// is the whole main of a module binary.
//
//	func main() {
//		if err := process.Run(notifier.Module()); err != nil {
//			log.Fatal(err)
//		}
//	}
//
// The module behaves as it does in-process (see the sdk package doc, "What
// a module can rely on"): meshd owns its queue, retries, dead letters and
// de-duplication; the process runs its handlers, tools and Run. It lives
// apart from package sdk so that a library of handlers does not pull in
// go-plugin and gRPC.
package process

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshkit/mesh/internal/asyncemit"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/setup"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/version"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Settings decodes the module's own settings, the config: of its entry in
// meshd's config, into v (a pointer to a struct, or to any JSON-decodable
// value). Unknown fields are errors. It leaves v as it is and returns nil
// when the module has no settings. Call it in main, before Run.
func Settings(v any) error {
	raw, ok := os.LookupEnv(plugin.EnvSettings)
	if !ok || raw == "" || raw == "null" {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the module's config in meshd's config: %w", err)
	}
	return nil
}

// Dir is the directory meshd gave the module for what it stores,
// STATE_DIR/modules/NAME (MESH_MODULE_DIR, also its HOME), or "" when it
// has none (a process not started by meshd). meshd gives every module one,
// whatever user it runs as; the module alone may read and write it, and
// with Landlock it is the only place in the state dir open to the module.
func Dir() string { return os.Getenv(plugin.EnvModuleDir) }

// Run serves m as a module process under meshd. It returns an error at
// once if the process was not started by meshd; otherwise it returns when
// meshd stops the module, after m.Run (if any) has seen its context
// cancelled and returned, or after a grace of two seconds.
func Run(m sdk.Module) error {
	if os.Getenv(plugin.Handshake().MagicCookieKey) != plugin.Handshake().MagicCookieValue {
		return errors.New("this is a mesh module: meshd starts it (meshd run --config ...); it does not run on its own")
	}
	grants, err := plugin.ToolGrantsFromEnv()
	if err != nil {
		return err
	}
	hideFromOtherProcesses()
	go exitWithParent(os.Getppid())
	go ignoreStopSignals()
	runCtx, stop := context.WithCancel(context.Background())
	s := &moduleServer{module: m, toolGrants: grants, maxMessage: plugin.MaxMessageBytesFromEnv(4 << 20), ready: make(chan struct{}), runCtx: runCtx, runDone: make(chan struct{})}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: plugin.Handshake(),
		Plugins: plugin.Set(func(b *goplugin.GRPCBroker) pb.ModuleServer {
			s.broker = b
			return s
		}),
		GRPCServer: goplugin.DefaultGRPCServer,
	})
	stop() // meshd stopped the module: Run's context ends, as in-process
	if s.started.Load() && m.Run != nil {
		select {
		case <-s.runDone:
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

// exitRunFailed is the exit status of a module process whose Run failed.
const exitRunFailed = 3

// exitProcess ends the process (a variable, for tests).
var exitProcess = os.Exit

// ignoreStopSignals keeps the module process running on SIGTERM and
// SIGINT: meshd stops it once its deliveries are drained (and it exits
// when meshd is gone). A signal sent to the whole process group (systemd's
// default, a terminal's Ctrl-C) would otherwise cut its handlers short
// before meshd's grace period.
func ignoreStopSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, os.Interrupt)
	for sig := range ch {
		processLogger.Info("signal ignored: meshd stops this module process", "signal", sig.String())
	}
}

// exitWithParent ends the module process when meshd is gone (killed with
// SIGKILL, say): the process is then adopted by another parent, and an
// orphaned module has nobody to deliver to it. The broker redelivers what
// meshd had not acked.
func exitWithParent(parent int) {
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			fmt.Fprintln(os.Stderr, "meshd is gone; the module exits")
			os.Exit(0)
		}
	}
}

// moduleServer runs a module in its process for meshd.
type moduleServer struct {
	pb.UnimplementedModuleServer
	module     sdk.Module
	broker     *goplugin.GRPCBroker
	toolGrants []string // nil: no limit
	// maxMessage is the largest message meshd takes from the process
	// (plugin.EnvMaxMessageBytes): emit batches are cut to fit it.
	maxMessage int

	once     sync.Once
	mesh     *pluginMesh
	handlers []sdk.Handler     // by pattern index, fixed by Describe
	tools    []sdk.ToolHandler // by tool index, fixed by Describe
	desc     *pb.Description
	descErr  error

	ready       chan struct{} // closed once Start has connected the host
	started     atomic.Bool
	host        pb.HostClient
	callTimeout time.Duration
	emits       chan emitRequest
	// handling counts the deliveries being handled, emitting the emits
	// sent to batchEmits and not yet answered: when every handler is
	// waiting for an emit and none is queued, no more is coming soon,
	// and the batch goes at once (flushEmits).
	handling, emitting atomic.Int64
	runCtx             context.Context
	runDone            chan struct{}
}

func (s *moduleServer) Describe(context.Context, *pb.Empty) (*pb.Description, error) {
	s.once.Do(func() {
		s.mesh = &pluginMesh{server: s, async: asyncemit.New(), rec: setup.New(s.module.Name, s.toolGrants), heldAtStart: map[string]bool{}}
		s.mesh.inSetup.Store(true)
		if s.module.Setup != nil {
			s.descErr = s.module.Setup(s.mesh)
		}
		s.mesh.inSetup.Store(false)
		subs, tools := s.mesh.rec.Fix()
		s.desc = &pb.Description{Name: s.module.Name, Kind: string(s.module.Kind), Emits: s.module.Emits, Calls: s.module.Calls, SdkRelease: version.Release()}
		for _, sc := range s.module.Schemas {
			s.desc.Schemas = append(s.desc.Schemas, &pb.SchemaDecl{Event: sc.Event, Tool: sc.Tool, Version: sc.Version, Json: sc.JSON, Response: sc.Response})
		}
		for _, p := range slices.Sorted(maps.Keys(s.module.Reads)) {
			s.desc.Reads = append(s.desc.Reads, &pb.Reads{Pattern: p, Versions: s.module.Reads[p]})
		}
		for _, tool := range slices.Sorted(maps.Keys(s.module.Callers)) {
			s.desc.Callers = append(s.desc.Callers, &pb.ToolCallers{Tool: tool, Callers: s.module.Callers[tool]})
		}
		// The handlers' options travel with the description; meshd
		// applies them (a filter runs there, before a delivery is sent).
		for i, e := range subs {
			s.handlers = append(s.handlers, e.Handler.(sdk.Handler))
			s.desc.Patterns = append(s.desc.Patterns, e.Key)
			if e.Options.AllowDuplicates {
				s.desc.DuplicatesAllowed = append(s.desc.DuplicatesAllowed, uint32(i))
			}
			if e.Options.Filter != nil && s.desc.Filters == nil {
				s.desc.Filters = make([]string, len(subs))
			}
			if s.desc.Filters != nil {
				s.desc.Filters[i] = e.Options.Filter.String()
			}
		}
		// Index len(patterns): the host delivers dead letters there (nil
		// without a DeadLetters handler); then the consumed queues.
		s.handlers = append(s.handlers, s.module.DeadLetters)
		s.desc.DeadLetters = s.module.DeadLetters != nil
		for _, e := range s.mesh.rec.Consumed() {
			s.handlers = append(s.handlers, e.Handler.(sdk.Handler))
			s.desc.Consumes = append(s.desc.Consumes, &pb.Consume{Queue: e.Key, Prefetch: uint32(e.Prefetch), Held: s.mesh.heldAtStart[e.Key], Exclusive: e.Exclusive,
				Filter: e.Options.Filter.String()})
		}
		// Index len(patterns) + 1 + len(consumes): the history, handed to
		// History.Handle a batch at a time (handleHistory).
		s.handlers = append(s.handlers, nil)
		if h := s.module.History; h != nil && h.From != nil && h.Handle != nil {
			s.desc.History = true
			err, _ := execute.Safely(func() error {
				var err error
				s.desc.HistoryFrom, err = h.From(handlerlog.With(s.runCtx, s.mesh.Logger()))
				return err
			})
			if err != nil && s.descErr == nil {
				s.descErr = fmt.Errorf("history: where to read from: %w", err)
			}
		}
		for i, e := range tools {
			s.tools = append(s.tools, e.Handler.(sdk.ToolHandler))
			s.desc.Tools = append(s.desc.Tools, e.Key)
			if e.Options.AllowDuplicates {
				s.desc.ToolsDuplicatesAllowed = append(s.desc.ToolsDuplicatesAllowed, uint32(i))
			}
		}
	})
	if s.descErr != nil {
		return nil, setupError(s.descErr)
	}
	return s.desc, nil
}

// setupError carries Setup's error to meshd with a gRPC code that keeps
// what it wraps (the host turns it back, runtime/plugin.go).
func setupError(err error) error {
	code := codes.Unknown
	switch {
	case errors.Is(err, sdk.ErrForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, sdk.ErrInvalid):
		code = codes.InvalidArgument
	}
	return status.Error(code, err.Error())
}

func (s *moduleServer) Start(_ context.Context, req *pb.StartRequest) (*pb.Empty, error) {
	if s.mesh == nil {
		return nil, errors.New("start before describe")
	}
	conn, err := s.broker.Dial(req.HostBrokerId)
	if err != nil {
		return nil, fmt.Errorf("dial the host: %w", err)
	}
	s.host = pb.NewHostClient(conn)
	s.callTimeout = time.Duration(req.CallTimeoutNanos)
	if s.callTimeout <= 0 {
		s.callTimeout = 30 * time.Second
	}
	s.emits = make(chan emitRequest, 1024)
	go s.batchEmits()
	close(s.ready)
	s.started.Store(true)
	go func() {
		defer close(s.runDone)
		if s.module.Run == nil {
			return
		}
		err := s.module.Run(handlerlog.With(s.runCtx, s.mesh.Logger()), s.mesh)
		switch {
		case err == nil:
		case s.runCtx.Err() != nil:
			if !errors.Is(err, context.Canceled) {
				s.mesh.Logger().Warn("module run ended with an error as the module stopped", "err", err)
			}
		default:
			// A Run that fails while the module runs: the process exits,
			// and meshd starts it again with back-off, as after a crash
			// (in-process, the module stops).
			s.mesh.Logger().Error("module run failed; the module process exits for meshd to start it again", "err", err)
			exitProcess(exitRunFailed)
		}
	}()
	return &pb.Empty{}, nil
}

func (s *moduleServer) Deliver(stream pb.Module_DeliverServer) error {
	outcomes := make(chan *pb.Outcome, 256)
	done := make(chan struct{})
	defer close(done)
	var inflight atomic.Int64
	// Outcomes go back as soon as every delivery received is handled: the
	// host sends in batches, so they come back in batches.
	idle := func() bool { return inflight.Load() == 0 && len(outcomes) == 0 }
	defer func() { s.handling.Add(-inflight.Load()) }()
	go func() {
		for batch := range plugin.Batches(outcomes, done, idle) {
			if err := stream.Send(&pb.OutcomeBatch{Outcomes: batch}); err != nil {
				return
			}
		}
	}()
	history := map[uint64][]*pb.Delivery{} // batches of the history not all here yet
	work := newHandlerPool(done, func(d *pb.Delivery) {
		o := s.handle(d)
		inflight.Add(-1)
		s.handling.Add(-1)
		outcomes <- o
	})
	for {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		// The host sends no more at once than the module's concurrency
		// allows, in queue order: each runs on its own goroutine.
		inflight.Add(int64(len(b.Deliveries)))
		s.handling.Add(int64(len(b.Deliveries)))
		for _, d := range b.Deliveries {
			if d.HistoryBatch != 0 {
				// A batch of the history may come over several messages:
				// it is handed to History.Handle once all of it is here.
				batch := append(history[d.HistoryBatch], d)
				if len(batch) < int(d.HistoryBatchSize) {
					history[d.HistoryBatch] = batch
					continue
				}
				delete(history, d.HistoryBatch)
				go func() {
					for _, o := range s.handleHistory(batch) {
						inflight.Add(-1)
						s.handling.Add(-1)
						outcomes <- o
					}
				}()
				continue
			}
			work.run(d)
		}
	}
}

// handlerPool runs each delivery on a goroutine of its own, as many at once
// as the host sends (the module's concurrency), reusing the goroutines
// that are free: a goroutine started for each delivery would grow its
// stack anew each time (a JSON decode goes deep), which cost about a sixth
// of the process's CPU under load (issue 30).
type handlerPool struct {
	free  chan *pb.Delivery // a free goroutine takes a delivery sent here
	done  <-chan struct{}
	do    func(*pb.Delivery)
	loops sync.WaitGroup // the goroutines; each ends once done closed and it is free
}

func newHandlerPool(done <-chan struct{}, do func(*pb.Delivery)) *handlerPool {
	return &handlerPool{free: make(chan *pb.Delivery), done: done, do: do}
}

// run hands d to a free goroutine, or starts one; it does not wait for d
// to be handled.
func (h *handlerPool) run(d *pb.Delivery) {
	select {
	case h.free <- d:
	default:
		h.loops.Go(func() { h.loop(d) })
	}
}

// loop handles d, then whatever run hands it, until done closes.
func (h *handlerPool) loop(d *pb.Delivery) {
	for {
		h.do(d)
		select {
		case d = <-h.free:
		case <-h.done:
			return
		}
	}
}

func (s *moduleServer) handle(d *pb.Delivery) *pb.Outcome {
	handlers := s.handlers
	if int(d.Pattern) >= len(handlers) || handlers[d.Pattern] == nil {
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_PERMANENT, Error: fmt.Sprintf("no handler for pattern %d", d.Pattern)}
	}
	pe, deadline := plugin.EventOf(d)
	ev := sdk.Event(pe)
	// The host's span of this handling, as a remote parent, and the
	// logger tagged with the event: as in-process.
	ctx := tracecontext.Extract(context.Background(), d.Traceparent, d.Tracestate)
	ctx = handlerlog.Event(ctx, s.mesh.Logger(), ev.ID, ev.Type, tracecontext.IDs)
	ctx, cancel := withDeadline(withHandling(causation.HandlingEvent(ctx, ev.ID, ev.Time), d.Handling), deadline)
	defer cancel()
	err, panicked := execute.Safely(func() error { return handlers[d.Pattern].HandleEvent(ctx, ev) })
	if pe, ok := err.(*execute.PanicError); ok && panicked {
		// The host gets the error's text, which names the file and line;
		// the stack stays here, in the module's log (meshd's, at warn).
		s.mesh.Logger().Warn("handler panicked", "event_id", ev.ID, "event_type", ev.Type, "attempt", ev.Attempt, "at", pe.At, "stack", pe.Stack)
	}
	switch execute.Of(err) {
	case execute.OK:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_OK}
	case execute.Permanent:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_PERMANENT, Error: errorText(err)}
	case execute.Forbidden:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_FORBIDDEN, Error: errorText(err)}
	case execute.Conflict:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_CONFLICT, Error: errorText(err)}
	default:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_FAILED, Error: errorText(err)}
	}
}

// handleHistory runs one batch of the history through History.Handle and
// answers each of its deliveries with the outcome.
func (s *moduleServer) handleHistory(batch []*pb.Delivery) []*pb.Outcome {
	slices.SortFunc(batch, func(a, b *pb.Delivery) int { return cmp.Compare(a.Offset, b.Offset) })
	outcome := &pb.Outcome{Kind: pb.Outcome_OK}
	if h := s.module.History; h == nil || h.Handle == nil {
		outcome = &pb.Outcome{Kind: pb.Outcome_PERMANENT, Error: "the module has no History handler"}
	} else {
		events := make([]sdk.Event, len(batch))
		var deadline time.Time
		for i, d := range batch {
			pe, dl := plugin.EventOf(d)
			events[i], deadline = sdk.Event(pe), dl
		}
		ctx := tracecontext.Extract(context.Background(), batch[0].Traceparent, batch[0].Tracestate)
		ctx = handlerlog.With(ctx, s.mesh.Logger())
		ctx, cancel := withDeadline(withHandling(ctx, batch[0].Handling), deadline)
		err, _ := execute.Safely(func() error { return h.Handle(ctx, events) })
		cancel()
		switch execute.Of(err) {
		case execute.OK:
		case execute.Permanent:
			outcome = &pb.Outcome{Kind: pb.Outcome_PERMANENT, Error: errorText(err)}
		case execute.Forbidden:
			outcome = &pb.Outcome{Kind: pb.Outcome_FORBIDDEN, Error: errorText(err)}
		case execute.Conflict:
			outcome = &pb.Outcome{Kind: pb.Outcome_CONFLICT, Error: errorText(err)}
		default:
			outcome = &pb.Outcome{Kind: pb.Outcome_FAILED, Error: errorText(err)}
		}
	}
	outcomes := make([]*pb.Outcome, len(batch))
	for i, d := range batch {
		outcomes[i] = &pb.Outcome{Seq: d.Seq, Kind: outcome.Kind, Error: outcome.Error}
	}
	return outcomes
}

// withDeadline is ctx bounded by the host's deadline; the zero time (the
// host's handler had none) leaves it unbounded rather than already over.
func withDeadline(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline)
}

// handlingKey is the context key of the host's token for the handling a
// context is in (pb.Delivery.handling).
type handlingKey struct{}

// withHandling returns ctx in the host's handling token (0: none).
func withHandling(ctx context.Context, token uint64) context.Context {
	if token == 0 {
		return ctx
	}
	return context.WithValue(ctx, handlingKey{}, token)
}

// handlingOf is the host's token for the handling ctx is in, 0 outside
// one: sent with each emit and call, so the host derives their ids from
// the handling it handed this process (a late emit of an attempt that
// timed out gets the id it would have had in time, not the id of the
// retry's next emit).
func handlingOf(ctx context.Context) uint64 {
	t, _ := ctx.Value(handlingKey{}).(uint64)
	return t
}

// maxErrorText bounds an error text the process sends meshd (which cuts
// longer ones too): a batch of outcomes stays well within the message
// limit.
const maxErrorText = 4096

// errorText is err's text, cut to maxErrorText bytes at a rune boundary.
func errorText(err error) string {
	s := err.Error()
	if len(s) <= maxErrorText {
		return s
	}
	n := maxErrorText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

type emitRequest struct {
	emit   *pb.Emit
	result chan emitResult
}

type emitResult struct {
	id  string
	err error
}

// batchEmits sends the module's emits to the host in batches, each cut to
// the size meshd takes.
func (s *moduleServer) batchEmits() {
	for batch := range plugin.Batches(s.emits, make(chan struct{}), s.flushEmits) {
		for len(batch) > 0 {
			n, size := 1, emitSize(batch[0].emit)
			for n < len(batch) {
				if size += emitSize(batch[n].emit); size > s.maxMessage/2 {
					break
				}
				n++
			}
			s.sendEmits(batch[:n])
			batch = batch[n:]
		}
	}
}

// flushEmits says a batch of emits need not wait for more: none is queued,
// and every delivery being handled waits for an emit's answer (or none
// is being handled). A batch that waited for more here would wait for
// its timer alone, and a timer under a millisecond fires a millisecond
// late in a process with nothing else to do (the runtime's poller sleeps
// in whole milliseconds): a lone event's emit took 1 ms longer.
func (s *moduleServer) flushEmits() bool {
	return len(s.emits) == 0 && s.emitting.Load() >= s.handling.Load()
}

// emitSize is about what e takes in a message.
func emitSize(e *pb.Emit) int {
	return len(e.Body) + len(e.Name) + len(e.Schema) + len(e.CausationId) + len(e.Id) + 64
}

// sendEmits sends one batch to the host and hands each emit its result.
func (s *moduleServer) sendEmits(batch []emitRequest) {
	req := &pb.EmitBatch{Emits: make([]*pb.Emit, len(batch))}
	for i, e := range batch {
		req.Emits[i] = e.emit
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	res, err := s.host.Emit(ctx, req)
	cancel()
	for i, e := range batch {
		switch {
		case err != nil:
			e.result <- emitResult{err: fmt.Errorf("%w: %v", wire.ErrConnectionLost, err)}
		case i >= len(res.Results):
			e.result <- emitResult{err: errors.New("the host answered fewer emits than it was sent")}
		default:
			r := res.Results[i]
			e.result <- emitResult{id: r.Id, err: errorOf(r.ErrorKind, r.Error)}
		}
		s.emitting.Add(-1) // answered, whether its emitter still waits or not
	}
}

// errorOf gives back the sdk error the host reported, so errors.Is works
// as in-process.
func errorOf(kind pb.ErrorKind, msg string) error { return plugin.ErrorOf(kind, msg) }

// Answer runs one tool call: a ToolError goes back as it is, a panic as
// "internal", any other error without a code for the host to classify.
func (s *moduleServer) Answer(_ context.Context, r *pb.ToolRequest) (*pb.ToolAnswer, error) {
	tools := s.tools
	if int(r.Tool) >= len(tools) {
		return &pb.ToolAnswer{IsError: true, Code: wire.CodeInternal, Message: fmt.Sprintf("no tool %d", r.Tool), Permanent: true}, nil
	}
	req := sdk.Request(plugin.RequestOf(r, s.desc.Tools[r.Tool]))
	ctx := tracecontext.Extract(context.Background(), r.Traceparent, r.Tracestate)
	ctx = handlerlog.Request(ctx, s.mesh.Logger(), req.ID, req.Tool, req.Caller, tracecontext.IDs)
	ctx, cancel := withDeadline(withHandling(causation.Handling(ctx, req.ID, req.Time), r.Handling), req.Deadline)
	defer cancel()
	var resp any
	err, panicked := execute.Safely(func() (err error) { resp, err = tools[r.Tool].HandleCall(ctx, req); return err })
	if panicked {
		err = &sdk.ToolError{Code: wire.CodeInternal, Message: err.Error(), Permanent: true}
	}
	if err == nil {
		var body []byte
		if body, err = toJSON(resp); err == nil {
			return &pb.ToolAnswer{Body: body}, nil
		}
		err = &sdk.ToolError{Code: wire.CodeInternal, Message: "encode response: " + err.Error(), Permanent: true}
	}
	var te *sdk.ToolError
	if errors.As(err, &te) {
		return &pb.ToolAnswer{IsError: true, Code: te.Code, Message: te.Message, Permanent: te.Permanent}, nil
	}
	// No code: the host gives it one by the same rules as in-process
	// (execute.ToolFailure), from Permanent: an error marked permanent, or
	// a refused grant (an emit or call of the tool's that its node config
	// does not grant), which no call again can change.
	_, permanent := execute.ToolFailure(err)
	return &pb.ToolAnswer{IsError: true, Message: err.Error(), Permanent: permanent}, nil
}

// pluginMesh is a module's Mesh inside its own process: emits and calls go
// to meshd, which publishes them under the module's name. Its rules are
// the in-process ones (runtime/mesh.go); the conformance suite
// (test/conformance) holds both to them.
type pluginMesh struct {
	server  *moduleServer
	async   *asyncemit.Window // its EmitAsync calls under way
	inSetup atomic.Bool       // Setup is running: On and Serve, no Emit or Call
	rec     *setup.Recorder
	// heldAtStart are the consumed queues Setup held (Hold), sent in the
	// Description.
	heldAtStart map[string]bool
}

var _ sdk.Mesh = (*pluginMesh)(nil)

// EmitAsync runs Emit on a goroutine of the module's window, its outcome
// to done; the emits under way fill the batches sent to the node.
func (pm *pluginMesh) EmitAsync(ctx context.Context, name string, body any, done func(string, error), opts ...sdk.EmitOption) error {
	if done == nil {
		return fmt.Errorf("emit %s: %w: EmitAsync needs a done function", name, sdk.ErrInvalid)
	}
	return pm.async.Go(ctx, func(ctx context.Context) (string, error) { return pm.Emit(ctx, name, body, opts...) }, done)
}

func (pm *pluginMesh) Emit(ctx context.Context, name string, body any, opts ...sdk.EmitOption) (string, error) {
	if pm.inSetup.Load() {
		return "", fmt.Errorf("emit %s: %w", name, wire.ErrNotStarted)
	}
	o, err := wire.ApplyEmitOptions(opts)
	if err != nil {
		return "", err
	}
	raw, bodyErr := toJSON(body) // an error is the node's to weigh first (unencodable)
	if bodyErr != nil {
		raw = nil
	}
	cause := causation.From(ctx)
	if o.CausationID == "" {
		o.CausationID = cause
	}
	e := &pb.Emit{Name: name, Body: raw, Schema: o.Schema, CausationId: o.CausationID,
		TtlMillis: o.TTL.Milliseconds(), Priority: uint32(o.Priority), HasPriority: o.HasPriority, FullType: o.FullType,
		Handling: handlingOf(ctx), AtMostOnce: o.AtMostOnce, Key: o.Key, HasKey: o.HasKey}
	e.AfterMillis, e.AtUnixMillis = plugin.TimingOf(o)
	switch {
	case o.Outbox != nil: // the host derives the row's id from these (protocol 8)
		e.Outbox, e.OutboxScope, e.OutboxN, e.OutboxUnixMillis = true, o.Outbox.Scope, o.Outbox.N, o.Outbox.Time.UnixMilli()
		e.Id, e.Handling = causation.OutboxID(pm.server.module.Name, *o.Outbox), 0
	case !o.FreshID:
		full := name
		if !o.FullType {
			full = wire.ModuleEventType(pm.server.module.Name, name)
		}
		e.Id, _ = causation.Derive(ctx, pm.server.module.Name, causation.KindEmit, full, raw)
	}
	select {
	case <-pm.server.ready:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	req := emitRequest{emit: e, result: make(chan emitResult, 1)}
	pm.server.emitting.Add(1)
	select {
	case pm.server.emits <- req:
	case <-ctx.Done():
		pm.server.emitting.Add(-1) // never sent
		return "", ctx.Err()
	}
	select {
	case r := <-req.result:
		if bodyErr != nil {
			return "", unencodable(r.err, bodyErr, "emit "+name)
		}
		return r.id, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// unencodable is the error of an emit or call (what) whose body toJSON
// could not encode (bodyErr), once its node answered for it (err): the
// node was sent an empty body, which it refuses as not JSON where a node
// refuses a body in-process, after what it checks first (the name, the
// grants, a delay). Refused for one of those, the emit or call gets that
// error, as in-process (a call the node config does not grant is
// forbidden, whatever its body); refused for its body, bodyErr, in the
// module's words.
func unencodable(err, bodyErr error, what string) error {
	if err == nil || (errors.Is(err, sdk.ErrInvalid) && strings.Contains(err.Error(), wire.EmptyBodyRefusal)) {
		return fmt.Errorf("%s: %w", what, bodyErr)
	}
	return err
}

// toJSON takes json.RawMessage and []byte as JSON as they are (the host
// checks them) and marshals anything else.
func toJSON(body any) ([]byte, error) {
	switch b := body.(type) {
	case json.RawMessage:
		return b, nil
	case []byte:
		return b, nil
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("%w: body is not JSON: %v", sdk.ErrInvalid, err)
	}
	return raw, nil
}

func (pm *pluginMesh) On(pattern string, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return pm.rec.On(pattern, h, o, err)
}

func (pm *pluginMesh) Exclusive(queue string) error { return pm.rec.Exclusive(queue) }

func (pm *pluginMesh) Hold(queue string, held bool) error {
	if !pm.rec.Consumes(queue) {
		return fmt.Errorf("hold %q: %w: module %s does not consume that queue", queue, sdk.ErrInvalid, pm.server.module.Name)
	}
	if pm.inSetup.Load() {
		pm.heldAtStart[queue] = held // Setup runs on one goroutine; Describe sends it
		return nil
	}
	<-pm.server.ready
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := pm.server.host.Hold(ctx, &pb.HoldRequest{Queue: queue, Held: held})
	if err != nil {
		return fmt.Errorf("hold %q: %w: %v", queue, wire.ErrConnectionLost, err)
	}
	return errorOf(r.ErrorKind, r.Error)
}

// ReportOutbox tells meshd the backlog of the module's outbox (sdk/outbox),
// for the node's metrics: best effort, a report lost is replaced by the
// next.
func (pm *pluginMesh) ReportOutbox(st wire.OutboxStats) {
	select {
	case <-pm.server.ready:
	default:
		return
	}
	r := &pb.OutboxReport{Unsent: st.Unsent, SetAside: st.SetAside, RelayErrors: st.RelayErrors}
	if !st.Oldest.IsZero() {
		r.OldestUnixNano = st.Oldest.UnixNano()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = pm.server.host.ReportOutbox(ctx, r)
}

var _ wire.OutboxReporter = (*pluginMesh)(nil)

func (pm *pluginMesh) Consume(queue string, prefetch int, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return pm.rec.Consume(queue, prefetch, h, o, err) // a nil h arrives as a nil any
}

func (pm *pluginMesh) Call(ctx context.Context, tool string, req, resp any) error {
	if pm.inSetup.Load() {
		return fmt.Errorf("call %s: %w", tool, wire.ErrNotStarted)
	}
	if err := wire.ValidateToolKey(tool); err != nil {
		return fmt.Errorf("call: %w", err)
	}
	raw, bodyErr := toJSON(req) // an error is the node's to weigh first (unencodable)
	if bodyErr != nil {
		raw = nil
	}
	id, _ := causation.Derive(ctx, pm.server.module.Name, causation.KindCall, tool, raw)
	select {
	case <-pm.server.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(pm.server.callTimeout)
	}
	r, err := pm.server.host.Call(ctx, &pb.CallRequest{Id: id, Tool: tool, Body: raw, DeadlineUnixNano: deadline.UnixNano(),
		CausationId: causation.From(ctx), Handling: handlingOf(ctx)})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("call %s: no answer in time: %w", tool, ctx.Err())
		}
		return fmt.Errorf("call %s: %w: %v", tool, wire.ErrConnectionLost, err)
	}
	if bodyErr != nil {
		return unencodable(errorOf(r.ErrorKind, r.Error), bodyErr, "call "+tool)
	}
	switch r.ErrorKind {
	case pb.ErrorKind_NONE:
		if resp == nil {
			return nil
		}
		if err := json.Unmarshal(r.Body, resp); err != nil {
			return fmt.Errorf("call %s: decode response: %w", tool, err)
		}
		return nil
	case pb.ErrorKind_TOOL:
		return fmt.Errorf("call %s: %w", tool, &sdk.ToolError{Code: r.ToolCode, Message: r.Error, Permanent: r.ToolPermanent})
	default:
		return errorOf(r.ErrorKind, r.Error)
	}
}

func (pm *pluginMesh) Serve(tool string, h sdk.ToolHandler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	err = pm.rec.Serve(tool, h, o, err)
	if errors.Is(err, sdk.ErrForbidden) {
		pm.Logger().Warn("serving a tool the node config does not grant refused", "tool", tool)
	}
	return err
}

// processLogger writes JSON lines in hclog's shape to stderr, which
// go-plugin in meshd reads, parses and logs at their level.
var processLogger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{
	Level: slog.LevelDebug,
	ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.TimeKey:
			return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
		case slog.LevelKey:
			return slog.String("@level", strings.ToLower(a.Value.String()))
		case slog.MessageKey:
			return slog.String("@message", a.Value.String())
		}
		return a
	},
}))

func (pm *pluginMesh) Logger() *slog.Logger { return processLogger }
