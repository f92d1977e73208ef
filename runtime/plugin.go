package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// PluginModule is a module running in its own process (a binary built with
// process.Run), supervised by the node: if the process exits it is started
// again with back-off, and the deliveries it had are failed attempts that
// the broker redelivers.
type PluginModule struct {
	node *Node
	path string
	args []string
	// loaded is the module as its first process described it: a process
	// started again must describe the same (its handlers, tools and
	// grants are indexed from it).
	loaded *pb.Description
	// refused is why the module stopped for good: a process started
	// again described another module (nil while it runs).
	refused atomic.Pointer[error]
	window  int // deliveries in flight at most: the module's concurrency
	// outcomesDue counts outcomes received from the process and handed
	// to their handlings (forward), not yet taken by them: the workers
	// they wake are about to hold acks (ModuleConfig.outcomesDue).
	outcomesDue atomic.Int64
	// toolGrants are passed to the process, which refuses an ungranted
	// Serve when it is made, as in-process.
	toolGrants []string
	// settings are the module's own, handed to the process as JSON in
	// plugin.EnvSettings.
	settings json.RawMessage
	// runAs and dir are the user the process runs as (nil: meshd's) and
	// its own directory ("" for none).
	runAs *Credential
	// launcher and tempDir are ModuleConfig's Launcher and TempDir.
	launcher []string
	tempDir  string
	dir      string
	log      *slog.Logger
	// procLog is where the module process's own log lines go: tagged with
	// the module once it has said its name.
	procLog atomic.Pointer[slog.Logger]
	module  *Module // the in-process side: queue, retries, dead letters

	mu        sync.Mutex
	proc      *moduleProcess   // nil while restarting
	running   chan struct{}    // closed while proc is set; replaced when it goes
	launching *goplugin.Client // a restart's process, until it is proc or gone

	// stopping is set by Stop under mu, so a restart either sees it
	// before it installs its process or leaves that process for Stop to
	// end; stopped is closed with it, to cut a restart's back-off short.
	stopping atomic.Bool
	stopped  chan struct{}
	done     chan struct{}

	// handlings are the handlings the host handed the process, by the
	// token it sent with each: what the process emits and calls in one,
	// naming its token, gets its id derived by the host from that handling
	// (the process cannot choose another event's id) and joins its trace.
	handlings handlings
}

// handlingCtx is one handling the host handed to the process: its
// causation scope and its span, on a context of their own (an ended
// handling keeps nothing else of the handler's context).
type handlingCtx struct{ ctx context.Context }

func newHandlingCtx(ctx context.Context) *handlingCtx {
	slim := causation.Carry(context.Background(), ctx)
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		slim = trace.ContextWithSpanContext(slim, sc)
	}
	return &handlingCtx{ctx: slim}
}

// keptEndedHandlings is how many ended handlings a module's host still
// knows, for the emits and calls a process sends after the handling's
// outcome: a process stopped past its handler's timeout sends them when
// it resumes, while the retry runs or after it.
const keptEndedHandlings = 4096

// handlings are a module's live handlings and the last keptEndedHandlings
// that ended. An emit made in an ended handling still gets its id derived
// in it, the id it would have had in time (the retry's emit of the same
// event gets it too, and de-duplication absorbs the repeat); one made in a
// handling ended longer ago is refused, never given a fresh id.
type handlings struct {
	next  atomic.Uint64
	mu    sync.Mutex
	live  map[uint64]*handlingCtx
	ended map[uint64]*handlingCtx
	order []uint64 // ended tokens, oldest first, a ring of keptEndedHandlings
	head  int
}

// begin registers ctx as a new handling and returns its token and the
// function that ends it.
func (hs *handlings) begin(ctx context.Context) (token uint64, end func()) {
	token = hs.next.Add(1)
	h := newHandlingCtx(ctx)
	hs.mu.Lock()
	if hs.live == nil {
		hs.live = make(map[uint64]*handlingCtx)
		hs.ended = make(map[uint64]*handlingCtx)
	}
	hs.live[token] = h
	hs.mu.Unlock()
	return token, func() {
		hs.mu.Lock()
		defer hs.mu.Unlock()
		delete(hs.live, token)
		if len(hs.order) < keptEndedHandlings {
			hs.order = append(hs.order, token)
		} else {
			delete(hs.ended, hs.order[hs.head])
			hs.order[hs.head] = token
			hs.head = (hs.head + 1) % keptEndedHandlings
		}
		hs.ended[token] = h
	}
}

// find is the handling of token, live or recently ended.
func (hs *handlings) find(token uint64) (*handlingCtx, bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h, ok := hs.live[token]; ok {
		return h, true
	}
	h, ok := hs.ended[token]
	return h, ok
}

// errHandlingGone refuses an emit or call a process makes in a handling
// the host ended too long ago to derive its id (or never handed it).
var errHandlingGone = fmt.Errorf("the handling it was made in is over and forgotten (its deadline passed long ago): %w", context.DeadlineExceeded)

// inHandling is ctx in the handling the process names by token: with its
// span, and with its causation scope, from which the host derives the ids
// of what the process emits and calls in it. Outside a handling (token 0)
// ctx carries the cause the process names alone, and ids are fresh; so
// they are in a handling the host no longer knows when the process asks
// for no derived id (derive false), and otherwise that is refused.
func (pm *PluginModule) inHandling(ctx context.Context, token uint64, cause string, derive bool) (context.Context, error) {
	h, known := pm.handlings.find(token)
	if token == 0 || !known && !derive {
		if cause == "" {
			return ctx, nil
		}
		return causation.With(ctx, cause), nil
	}
	if !known {
		return ctx, errHandlingGone
	}
	if sc := trace.SpanContextFromContext(h.ctx); sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	return causation.Carry(ctx, h.ctx), nil
}

// moduleProcess is one run of the module binary.
type moduleProcess struct {
	client *goplugin.Client
	rpc    goplugin.ClientProtocol
	remote *plugin.Client
	desc   *pb.Description
	// version is the version of the binary this process runs (its Go
	// build info, read when it started: a binary replaced on disk shows
	// its new version from its next start).
	version string
	// protocol is the module protocol the handshake agreed on, within
	// plugin.Window: where protocols differ, the host speaks this one.
	protocol uint
	stream   pb.Module_DeliverClient
	sendq    chan *pb.Delivery
	exited   chan struct{} // closed when the stream ends: the process is gone
	seq      atomic.Uint64
	window   int
	// outcomesDue is the PluginModule's: receive adds what it hands over.
	outcomesDue *atomic.Int64

	mu        sync.Mutex
	pending   map[uint64]chan *pb.Outcome
	streamErr error // why the delivery stream ended
}

// LoadPlugin starts the module binary at path, asks it what it is, and
// loads it like Load does: its queue, bindings, retries and dead letters
// are the node's, and its handlers run in the module process, as many at
// once as mc.Concurrency allows (default 1, in queue order), exactly as
// in-process. Event deliveries cross the boundary in batches.
func (n *Node) LoadPlugin(ctx context.Context, path string, args []string, mc ModuleConfig) (*PluginModule, error) {
	mc = mc.over(n.cfg.Module)
	pm := &PluginModule{node: n, path: path, args: args, window: mc.Concurrency, toolGrants: mc.ToolGrants, settings: mc.Settings, runAs: mc.RunAs, dir: mc.Dir, launcher: mc.Launcher, tempDir: mc.TempDir,
		log: n.log.With("plugin", path), stopped: make(chan struct{}), done: make(chan struct{})}
	pm.procLog.Store(pm.log)
	mc.outcomesDue = &pm.outcomesDue
	proc, err := pm.launchFirst(ctx)
	if err != nil {
		return nil, err
	}
	if mc.Name != "" && proc.desc.Name != mc.Name {
		// Before Load: a process claiming another module's name never
		// gets a callback server, so nothing goes out under that name.
		proc.client.Kill()
		return nil, fmt.Errorf("start module %s: %w: the binary says it is module %q, and its entry says %q; nothing it sent was accepted",
			path, sdk.ErrForbidden, truncateText(proc.desc.Name, 100), mc.Name)
	}
	pm.proc, pm.running = proc, make(chan struct{})
	close(pm.running)
	pm.loaded = proc.desc
	patterns, tools := proc.desc.Patterns, proc.desc.Tools
	if n := len(proc.desc.Filters); n != 0 && n != len(patterns) {
		proc.client.Kill()
		return nil, fmt.Errorf("start module %s: %w: the module process described %d filters for %d patterns", path, sdk.ErrInvalid, n, len(patterns))
	}
	var dead sdk.Handler
	if proc.desc.DeadLetters {
		dead = pm.forward(uint32(len(patterns)))
	}
	schemas, reads, err := declarationsOf(proc.desc)
	if err != nil {
		proc.client.Kill()
		return nil, fmt.Errorf("start module %s: %w", path, err)
	}
	var history *sdk.History
	if proc.desc.History {
		from := proc.desc.HistoryFrom
		history = &sdk.History{From: func(context.Context) (int64, error) { return from, nil },
			Handle: pm.forwardHistory(uint32(len(patterns) + 1 + len(proc.desc.Consumes)))}
	}
	def := sdk.Module{Name: proc.desc.Name, Kind: proc.desc.Kind, Emits: proc.desc.Emits, Calls: proc.desc.Calls, DeadLetters: dead,
		Schemas: schemas, Reads: reads, History: history,
		Callers: callersOfDescription(proc.desc), Setup: func(m sdk.Mesh) error {
			// The handlers' options as the process described them, given
			// to this node's own On, Consume and Serve: the filters are
			// parsed, bounded and evaluated here.
			for i, p := range patterns {
				var opts []sdk.HandlerOption
				if slices.Contains(proc.desc.DuplicatesAllowed, uint32(i)) {
					opts = append(opts, sdk.AllowDuplicates())
				}
				if len(proc.desc.Filters) > 0 && proc.desc.Filters[i] != "" {
					opts = append(opts, sdk.Filter(proc.desc.Filters[i]))
				}
				if err := m.On(p, pm.forward(uint32(i)), opts...); err != nil {
					return err
				}
			}
			for i, t := range tools {
				var opts []sdk.HandlerOption
				if slices.Contains(proc.desc.ToolsDuplicatesAllowed, uint32(i)) {
					opts = append(opts, sdk.AllowDuplicates())
				}
				if err := m.Serve(t, pm.answer(uint32(i)), opts...); err != nil {
					return err
				}
			}
			for k, c := range proc.desc.Consumes {
				var opts []sdk.HandlerOption
				if c.Filter != "" {
					opts = append(opts, sdk.Filter(c.Filter))
				}
				if err := m.Consume(c.Queue, int(c.Prefetch), pm.forward(uint32(len(patterns)+1+k)), opts...); err != nil {
					return err
				}
				if c.Exclusive {
					if err := m.Exclusive(c.Queue); err != nil {
						return err
					}
				}
				if c.Held {
					if err := m.Hold(c.Queue, true); err != nil {
						return err
					}
				}
			}
			return nil
		}}
	if pm.module, err = n.Load(ctx, def, mc); err != nil {
		proc.client.Kill()
		return nil, err
	}
	pm.log = pm.log.With("module", proc.desc.Name)
	pm.procLog.Store(pm.log)
	if h := n.hook().described; h != nil {
		h(proc.desc.Name, proc.pid())
	}
	switch err := pm.start(ctx, proc); {
	case err == nil:
		pm.announce("started", nil)
	case proc.gone(err):
		// Killed (or crashed) after it described itself: the module is
		// loaded and valid, so this is a crash like any later one, and
		// the supervisor starts it again with back-off, rather than the
		// node failing to start over one lost process.
		pm.log.Error("module process exited as it was started; restarting it", "err", err)
		proc.client.Kill()
	default:
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = pm.module.Stop(stopCtx)
		proc.client.Kill()
		return nil, err
	}
	go pm.supervise(proc)
	n.mu.Lock()
	n.plugins = append(n.plugins, pm)
	n.mu.Unlock()
	return pm, nil
}

// announce emits node.<node>.module.<what> about this module, so the mesh
// sees modules start, crash and restart.
func (pm *PluginModule) announce(what string, cause error) {
	body := map[string]any{"module": pm.module.def.Name, "path": pm.path}
	if cause != nil {
		body["error"] = cause.Error()
	}
	// As long as any emit may take (emit_timeout): a slow confirm on a
	// busy broker must not lose the announcement.
	n := pm.node
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.EmitTimeout)
	defer cancel()
	if _, err := n.Emit(ctx, n.cfg.Node, "node."+n.cfg.Node+".module."+what, body); err != nil {
		pm.log.Warn("could not announce the module", "event", what, "err", err)
	}
}

// firstLaunches is how many times a first load starts a module process
// that went away while it was starting (killed, or crashed) before the
// load fails: a binary that dies at every start still fails the load, in
// well under a second, and one killed once does not.
const firstLaunches = 3

// errProcessGone is wrapped by launch's error when the process went away
// while it was starting (killed, or crashed), as opposed to a process that
// answered and was refused (another protocol version, say).
var errProcessGone = errors.New("the module process went away while it was starting")

// launchFirst is launch for the first load: it starts the process again,
// with a short back-off, if it went away while starting, up to
// firstLaunches times.
func (pm *PluginModule) launchFirst(ctx context.Context) (*moduleProcess, error) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		p, err := pm.launch(ctx)
		if err == nil || !errors.Is(err, errProcessGone) || attempt == firstLaunches {
			return p, err
		}
		pm.log.Warn("module process went away as it started; starting it again", "err", err, "attempt", attempt, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, err
		}
		backoff *= 2
	}
}

// processGone reports whether the process of client went away, err being
// what a call to it returned: it exited, or its connection is down.
func processGone(client *goplugin.Client, err error) bool {
	return client.Exited() || status.Code(err) == codes.Unavailable
}

// gone is processGone for p, whose delivery stream may have seen it first.
func (p *moduleProcess) gone(err error) bool {
	if processGone(p.client, err) {
		return true
	}
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// launch starts the binary, checks the handshake and opens the delivery
// stream. Its error wraps errProcessGone if the process went away while
// starting.
func (pm *PluginModule) launch(ctx context.Context) (*moduleProcess, error) {
	limit := pm.messageLimit()
	cmd := processSpec{path: pm.path, args: pm.args, launcher: pm.launcher, toolGrants: pm.toolGrants, limit: limit,
		settings: pm.settings, dir: pm.dir, tempDir: pm.tempDir, runAs: pm.runAs}.command()
	tail := &stderrTail{}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		Stderr:          tail, // its last words, if it exits while starting (lastWords)
		HandshakeConfig: plugin.Handshake(),
		// Every module protocol of the window (docs/adr/0039-module-protocol-window.md).
		VersionedPlugins: plugin.HostPlugins(),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           pluginLogger(&pm.procLog),
		SkipHostEnv:      true, // cmd.Env is the whole of it: moduleEnv passes nothing of the node's
		// Every connection between meshd and this process, the host's
		// callback server included, is mutual TLS with certificates made
		// for this run: no other local process can talk to either side
		// (docs/adr/0029-trust-boundary.md).
		AutoMTLS: true,
		// go-plugin lets a message of up to 2 GiB in; a module process is
		// held to what an honest one sends (plugin.EnvMaxMessageBytes).
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit), grpc.MaxCallSendMsgSize(limit+messageSlack))},
		// A process of another user reaches the host's sockets through
		// its own group, which they are given (mode 0660): no other
		// module's user can.
		UnixSocketConfig: socketConfig(pm.runAs),
	})
	fail := func(err error) (*moduleProcess, error) {
		gone := processGone(client, err)
		client.Kill()
		if gone {
			return nil, fmt.Errorf("start module %s: %w: %w", pm.path, errProcessGone, err)
		}
		return nil, fmt.Errorf("start module %s: %w", pm.path, err)
	}
	// Stop ends a process still starting (a hung handshake included).
	pm.mu.Lock()
	if pm.stopping.Load() {
		pm.mu.Unlock()
		return nil, fmt.Errorf("start module %s: %w", pm.path, sdk.ErrClosed)
	}
	pm.launching = client
	pm.mu.Unlock()
	defer func() {
		pm.mu.Lock()
		pm.launching = nil
		pm.mu.Unlock()
	}()
	rpc, err := client.Client()
	if err != nil {
		if verr := versionError(err); verr != err {
			return fail(verr)
		}
		if words := lastWords(client, cmd, tail); words != "" && client.Exited() {
			// The process's own words: go-plugin's are about the
			// handshake it never made ("Unrecognized remote plugin
			// message ... not compiled for this architecture").
			err = errors.New(words)
		} else if words != "" {
			err = fmt.Errorf("%s (%w)", words, err)
		}
		return fail(err)
	}
	raw, err := rpc.Dispense(plugin.Name)
	if err != nil {
		return fail(err)
	}
	remote := raw.(*plugin.Client)
	if h := pm.node.hook().launched; h != nil {
		if rc := client.ReattachConfig(); rc != nil {
			h(pm.path, rc.Pid)
		}
	}
	desc, err := remote.Module.Describe(ctx, &pb.Empty{})
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			return fail(fmt.Errorf("describe: %w", err))
		}
		return fail(fmt.Errorf("describe: %w", setupError(err)))
	}
	stream, err := remote.Module.Deliver(context.Background())
	if err != nil {
		return fail(fmt.Errorf("open the delivery stream: %w", err))
	}
	p := &moduleProcess{client: client, rpc: rpc, remote: remote, desc: desc, version: binaryVersion(pm.path), protocol: uint(client.NegotiatedVersion()), stream: stream, window: pm.window,
		sendq: make(chan *pb.Delivery, 256), exited: make(chan struct{}), pending: make(map[uint64]chan *pb.Outcome), outcomesDue: &pm.outcomesDue}
	go p.send()
	go p.receive()
	return p, nil
}

// processSpec is how a module process is started: its binary and
// arguments, through the launcher (confinement) and as its user, with the
// environment the node gives it and nothing of the node's own.
type processSpec struct {
	path       string
	args       []string
	launcher   []string
	toolGrants []string
	limit      int
	settings   []byte
	dir        string
	tempDir    string
	runAs      *Credential
}

// command is the process's command, not started.
func (s processSpec) command() *exec.Cmd {
	argv := append(slices.Clone(s.launcher), s.path)
	argv = append(argv, s.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(moduleEnv(os.Environ()), plugin.ToolGrantsEnv(s.toolGrants)...)
	if s.limit > 0 {
		cmd.Env = append(cmd.Env, plugin.EnvMaxMessageBytes+"="+strconv.Itoa(s.limit))
	}
	if s.settings != nil {
		cmd.Env = append(cmd.Env, plugin.EnvSettings+"="+string(s.settings))
	}
	if s.dir != "" {
		cmd.Env = append(setEnv(cmd.Env, "HOME", s.dir), plugin.EnvModuleDir+"="+s.dir)
	}
	if s.tempDir != "" {
		cmd.Env = setEnv(cmd.Env, "TMPDIR", s.tempDir)
	}
	if s.runAs != nil {
		// Its USER and LOGNAME; the launcher, if there is one, takes the
		// user on itself.
		runAs(cmd, *s.runAs, len(s.launcher) == 0)
	}
	return cmd
}

// moduleEnv is a module process's environment: of the node's, only what a
// program needs to run (PATH, the locale, the time zone, the temporary
// directory, HOME and USER) and nothing else. The node's configuration
// (MESH_*), its broker credentials, TLS key, OTLP headers and whatever
// else its environment holds stay out of the module's reach: a module
// reaches the mesh through its node only.
func moduleEnv(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return !moduleEnvKept(k)
	})
}

// socketConfig is go-plugin's socket configuration for a process that
// runs as c (nil: meshd's user, go-plugin's defaults).
func socketConfig(c *Credential) *goplugin.UnixSocketConfig {
	if c == nil {
		return nil
	}
	return &goplugin.UnixSocketConfig{Group: strconv.FormatUint(uint64(c.GID), 10)}
}

// setEnv sets k to v in env, replacing what env had.
func setEnv(env []string, k, v string) []string {
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
	return append(env, k+"="+v)
}

// moduleEnvKept reports whether the node passes the variable k to its
// module processes.
func moduleEnvKept(k string) bool {
	switch k {
	case "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM":
		return true
	case "GOCOVERDIR", "GOTRACEBACK", "GOMAXPROCS", "GODEBUG", "GOGC", "GOMEMLIMIT": // the Go runtime's own
		return true
	}
	return strings.HasPrefix(k, "LC_")
}

// messageSlack is room for the fields around the bodies of one message
// across the boundary.
const messageSlack = 1 << 20

// messageLimit bounds every message a module process sends meshd (an emit
// batch, an outcome batch, an answer, its description): an emit batch
// of bodies as large as the node takes, with room for their headers.
// Past it the message is refused and the process gets an error; an
// honest process (sdk/process) cuts its batches to fit.
func (pm *PluginModule) messageLimit() int {
	return 4*max(pm.node.cfg.MaxBodyBytes, 64<<10) + messageSlack
}

// maxModuleErrorText bounds an error text from a module process where the
// host logs, stores or passes it on.
const maxModuleErrorText = 4096

// callersOfDescription are the default callers the process declared for
// the tools it serves (sdk.Module.Callers): they can only restrict who may
// call the module itself, and the node config's callers replace them.
func callersOfDescription(desc *pb.Description) map[string][]string {
	if len(desc.Callers) == 0 {
		return nil
	}
	out := make(map[string][]string, len(desc.Callers))
	for _, c := range desc.Callers {
		out[c.Tool] = append(out[c.Tool], c.Callers...)
	}
	return out
}

// setupError gives back what a module's Setup error wrapped, as the
// module process coded it (sdk/process).
func setupError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.PermissionDenied:
		return fmt.Errorf("%s: %w", st.Message(), sdk.ErrForbidden)
	case codes.InvalidArgument:
		return fmt.Errorf("%s: %w", st.Message(), sdk.ErrInvalid)
	}
	return errors.New(st.Message())
}

// versionError names both ranges and the fix when the handshake failed
// on the module protocol (plugin.Refusal).
func versionError(err error) error {
	m := incompatibleVersion.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	v, perr := strconv.ParseUint(m[1], 10, 32)
	if perr != nil {
		return err
	}
	return plugin.Refusal(uint(v))
}

// incompatibleVersion is go-plugin's error for a process that answered the
// handshake with a protocol the host does not serve.
var incompatibleVersion = regexp.MustCompile(`(?i)incompatible API version with plugin\. Plugin version: (\d+)`)

// start hands the process the host's callback service.
func (pm *PluginModule) start(ctx context.Context, p *moduleProcess) error {
	id := p.remote.Broker.NextId()
	limit := pm.messageLimit()
	go p.remote.Broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
		s := grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(limit), grpc.MaxSendMsgSize(limit+messageSlack))...)
		pb.RegisterHostServer(s, &hostServer{pm: pm})
		return s
	})
	if _, err := p.remote.Module.Start(ctx, &pb.StartRequest{HostBrokerId: id, CallTimeoutNanos: int64(pm.node.cfg.CallTimeout)}); err != nil {
		return fmt.Errorf("start module %s: %w", p.desc.Name, err)
	}
	return nil
}

// supervise starts the module again, with back-off, whenever its process
// goes away, until Stop.
func (pm *PluginModule) supervise(p *moduleProcess) {
	defer close(pm.done)
	backoff := 100 * time.Millisecond
	for {
		pm.watchLiveness(p)
		if h := pm.node.hook().exited; h != nil {
			h(pm.module.def.Name)
		}
		if pm.stopping.Load() {
			return
		}
		// Deliveries wait for the restart from now on: one retried while
		// the crash is announced must not go to the dead process and burn
		// an attempt without being tried. (current may have taken it out
		// already.)
		pm.takeOut(p)
		pm.log.Error("module process exited; restarting it", "retry_in", backoff)
		pm.announce("crashed", p.exitErr())
		for {
			select {
			case <-time.After(backoff):
			case <-pm.stopped:
				return
			}
			next, err := pm.relaunch()
			if errors.Is(err, sdk.ErrClosed) {
				return // stopped during the restart; its process is ended
			}
			if errors.Is(err, errDescribesAnother) {
				pm.refuse(err)
				return
			}
			if err == nil {
				p = next
				pm.module.counts.restarts.Add(1)
				pm.log.Info("module process restarted")
				pm.announce("restarted", nil)
				backoff = 100 * time.Millisecond
				break
			}
			backoff = min(backoff*2, 30*time.Second)
			pm.log.Error("module restart failed", "err", err, "retry_in", backoff)
		}
	}
}

// sameModule reports whether two descriptions are of the same module: all
// but whether Setup held a consumed queue at start, which is the run's.
func sameModule(a, b *pb.Description) bool {
	norm := func(d *pb.Description) *pb.Description {
		d = proto.Clone(d).(*pb.Description)
		for _, c := range d.Consumes {
			c.Held = false
		}
		d.HistoryFrom = 0 // where it resumes is its store's to say
		d.SdkRelease = "" // a binary rebuilt with a newer sdk, declaring the same, is the same module
		return d
	}
	return proto.Equal(norm(a), norm(b))
}

// errDescribesAnother says a module process started again described
// another module than the one loaded.
var errDescribesAnother = errors.New("the binary now describes another module")

// refuse stops the module for good: its consumers end, what was delivered
// to it goes back to its queues, and Ready says why, until it is stopped
// (and loaded again).
func (pm *PluginModule) refuse(err error) {
	pm.refused.Store(&err)
	pm.log.Error("module stopped: its process started again as another module", "err", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if stopErr := pm.module.Stop(ctx); stopErr != nil {
		pm.log.Warn("stopping the refused module", "err", stopErr)
	}
	if h := pm.node.hook().refused; h != nil {
		h(pm.module.def.Name)
	}
}

// Refused returns why the module stopped for good (its process started
// again as another module), or nil; nil too once it is stopped (and so
// replaced, or gone).
func (pm *PluginModule) Refused() error {
	if err := pm.refused.Load(); err != nil && !pm.stopping.Load() {
		return *err
	}
	return nil
}

// relaunch starts the module process again and installs it, unless Stop
// came meanwhile: then it ends the new process and returns sdk.ErrClosed.
func (pm *PluginModule) relaunch() (*moduleProcess, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { // Stop cuts the restart short
		select {
		case <-pm.stopped:
			cancel()
		case <-ctx.Done():
		}
	}()
	next, err := pm.launch(ctx)
	if err == nil && !sameModule(next.desc, pm.loaded) {
		// A binary replaced on disk by another: its handlers and tools
		// would be taken for those of the first (events to the wrong
		// handler), or it claims another name. It gets no callback server,
		// as at first load.
		next.client.Kill()
		what := "its handlers, tools, emits, calls or consumed queues differ from the process it was loaded with"
		if next.desc.Name != pm.module.def.Name {
			what = fmt.Sprintf("it says it is module %q", truncateText(next.desc.Name, 100))
		}
		err = fmt.Errorf("restart module %s: %w (%s): the module stops, its events stay in its queue; reload meshd (SIGHUP) or restart it to load the new binary",
			pm.module.def.Name, errDescribesAnother, what)
	}
	if err == nil {
		if err = pm.start(ctx, next); err != nil {
			next.client.Kill()
		}
	}
	if err != nil {
		if pm.stopping.Load() {
			return nil, sdk.ErrClosed
		}
		return nil, err
	}
	if h := pm.node.hook().relaunched; h != nil {
		h(pm.module.def.Name, next.pid())
	}
	if next.desc.History && next.desc.HistoryFrom != pm.module.historyNext.Load() {
		// The process resumes where its own store says (it may have
		// lost it): the history is read from there on.
		pm.module.RewindHistory(next.desc.HistoryFrom)
	}
	pm.mu.Lock()
	if pm.stopping.Load() {
		pm.mu.Unlock()
		next.kill(2 * time.Second)
		return nil, sdk.ErrClosed
	}
	pm.proc = next
	close(pm.running)
	pm.mu.Unlock()
	return next, nil
}

// Liveness: a module process that does not answer a ping within
// pingTimeout is killed, and so restarted. A hung handler alone does not
// trigger it (gRPC answers pings beside it); its handler timeout counts it.
const (
	pingEvery   = 2 * time.Second
	pingTimeout = 3 * time.Second
)

// watchLiveness returns when p is gone, killing it first if it stopped
// answering.
func (pm *PluginModule) watchLiveness(p *moduleProcess) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
		answered := make(chan error, 1)
		go func() { answered <- p.rpc.Ping() }()
		select {
		case <-p.exited:
			return
		case err := <-answered:
			if err == nil {
				continue
			}
			pm.log.Error("module process failed its ping; killing it", "err", err)
		case <-time.After(pingTimeout):
			pm.log.Error("module process stopped answering; killing it", "timeout", pingTimeout)
		}
		p.kill(0) // it cannot answer a request to exit
		<-p.exited
		return
	}
}

// kill ends the process: go-plugin asks it to exit first, and if it has not
// within grace it is killed outright (a frozen process never answers).
func (p *moduleProcess) kill(grace time.Duration) {
	done := make(chan struct{})
	if grace > 0 {
		go func() { p.client.Kill(); close(done) }()
		select {
		case <-done:
			return
		case <-time.After(grace):
		}
	}
	if rc := p.client.ReattachConfig(); rc != nil && rc.Pid > 0 {
		if proc, err := os.FindProcess(rc.Pid); err == nil {
			_ = proc.Kill()
		}
	}
	if grace == 0 {
		p.client.Kill() // cleans up after the dead process
	} else {
		<-done
	}
}

// PID is the process id of the module process now running, or 0 while it
// restarts.
func (pm *PluginModule) PID() int {
	pm.mu.Lock()
	p := pm.proc
	pm.mu.Unlock()
	if p == nil {
		return 0
	}
	return p.pid()
}

// restarting says whether the module's process went away and is being
// started again (not stopped).
func (pm *PluginModule) restarting() bool {
	return !pm.stopping.Load() && pm.PID() == 0
}

// version is the version of the binary the module's process runs, or ""
// while it is restarting or if its build info cannot be read.
func (pm *PluginModule) version() string {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.proc == nil {
		return ""
	}
	return pm.proc.version
}

// Protocol is the module protocol the node speaks with the module's
// process (plugin.Window), or 0 while it is restarting.
func (pm *PluginModule) Protocol() uint {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.proc == nil {
		return 0
	}
	return pm.proc.protocol
}

// SDKRelease is the mesh release of the sdk the module's binary was built
// with, as its process said (empty for a binary of v0.1.0, which did not
// say, and while it is restarting).
func (pm *PluginModule) SDKRelease() string {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.proc == nil {
		return ""
	}
	return truncateText(pm.proc.desc.SdkRelease, 64)
}

// pid is the process id of p, or 0 if unknown.
func (p *moduleProcess) pid() int {
	if rc := p.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Module returns the module as the node runs it.
func (pm *PluginModule) Module() *Module { return pm.module }

// Name is the name the module process reported.
func (pm *PluginModule) Name() string { return pm.module.def.Name }

// Kind is the kind the module process reported.
func (pm *PluginModule) Kind() string { return pm.module.def.Kind }

// Stop stops consuming, lets the deliveries in flight finish until ctx is
// done (see Module.Stop), then ends the module process. A restart in
// progress (a crash loop) is cut short and its process ended, so Stop
// returns within ctx's grace and a few seconds more and leaves no process
// behind.
func (pm *PluginModule) Stop(ctx context.Context) error {
	pm.mu.Lock()
	first := !pm.stopping.Swap(true)
	launching := pm.launching
	pm.mu.Unlock()
	if first {
		close(pm.stopped)
	}
	if launching != nil {
		launching.Kill() // its handshake fails; the restart sees stopping
	}
	err := pm.module.Stop(ctx)
	pm.mu.Lock()
	p := pm.proc
	pm.mu.Unlock()
	if p != nil {
		p.kill(2 * time.Second)
	}
	if h := pm.node.hook().stopWaiting; h != nil {
		h(pm.module.def.Name)
	}
	<-pm.done
	return err
}

// takeOut makes deliveries and calls wait for the next process, if p is
// still the installed one.
func (pm *PluginModule) takeOut(p *moduleProcess) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.proc == p {
		pm.proc, pm.running = nil, make(chan struct{})
	}
}

// current returns the running process, waiting while it restarts: an
// event that arrives then is not a failed attempt unless the restart takes
// longer than its handler timeout. A process that is gone but not yet taken
// out by its supervisor counts as restarting: a delivery retried right
// after a crash must not burn an attempt on it.
func (pm *PluginModule) current(ctx context.Context) (*moduleProcess, error) {
	for {
		pm.mu.Lock()
		p, running := pm.proc, pm.running
		pm.mu.Unlock()
		if p != nil {
			select {
			case <-p.exited:
				pm.takeOut(p)
				continue
			default:
				return p, nil
			}
		}
		if h := pm.node.hook().awaiting; h != nil {
			h(pm.module.def.Name)
		}
		select {
		case <-running:
		case <-ctx.Done():
			return nil, fmt.Errorf("module process still restarting: %w", ctx.Err())
		}
	}
}

// forward is the in-process handler of pattern i (i = the number of
// patterns: the DeadLetters handler; past it, the consumed queues): it
// hands the event to the module process and waits for its outcome.
func (pm *PluginModule) forward(i uint32) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		p, err := pm.current(ctx)
		if err != nil {
			return err
		}
		token, end := pm.handlings.begin(ctx)
		defer end()
		deadline, _ := ctx.Deadline()
		d := plugin.DeliveryOf(plugin.Event(ev), deadline)
		d.Handling, d.Seq, d.Pattern = token, p.seq.Add(1), i
		d.Traceparent, d.Tracestate = tracecontext.Inject(ctx)
		result := make(chan *pb.Outcome, 1)
		p.mu.Lock()
		p.pending[d.Seq] = result
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.pending, d.Seq)
			if len(result) > 0 {
				// Handed over as the handling gave up (its deadline, or
				// the process gone): never taken, no longer due.
				p.outcomesDue.Add(-1)
			}
			p.mu.Unlock()
		}()
		select {
		case p.sendq <- d:
		case <-p.exited:
			return errors.New("module process exited")
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case o := <-result:
			p.outcomesDue.Add(-1)
			switch o.Kind {
			case pb.Outcome_OK:
				return nil
			case pb.Outcome_PERMANENT:
				// The process sent the text of an sdk.Permanent error:
				// marked permanent again here, it keeps one prefix.
				return sdk.Permanent(errors.New(truncateText(strings.TrimPrefix(o.Error, "permanent: "), maxModuleErrorText)))
			case pb.Outcome_FORBIDDEN:
				// An emit or call the host refused for want of a grant:
				// dead-lettered at once, as forbidden, in the process's words.
				return refusedGrant(truncateText(o.Error, maxModuleErrorText))
			default:
				return errors.New(truncateText(o.Error, maxModuleErrorText))
			}
		case <-p.exited:
			return errors.New("module process exited while handling the event")
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// forwardHistory is the in-process History handler of a module process
// (delivery index i): each batch crosses as deliveries of one
// history_batch, which the process hands to its History.Handle in one
// call; the batch succeeded if every delivery's outcome is OK.
func (pm *PluginModule) forwardHistory(i uint32) func(context.Context, []sdk.Event) error {
	return func(ctx context.Context, events []sdk.Event) error {
		p, err := pm.current(ctx)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			// A process started again rewinds the history (and so ends
			// ctx) before it is current: a batch from before goes to it
			// never.
			return err
		}
		token, end := pm.handlings.begin(ctx)
		defer end()
		deadline, _ := ctx.Deadline()
		batch := p.seq.Add(1)
		result := make(chan *pb.Outcome, len(events))
		ds := make([]*pb.Delivery, len(events))
		p.mu.Lock()
		for k, ev := range events {
			d := plugin.DeliveryOf(plugin.Event(ev), deadline)
			d.Handling, d.Seq, d.Pattern = token, p.seq.Add(1), i
			d.HistoryBatch, d.HistoryBatchSize = batch, uint32(len(events))
			p.pending[d.Seq] = result
			ds[k] = d
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			for _, d := range ds {
				delete(p.pending, d.Seq)
			}
			p.outcomesDue.Add(-int64(len(result))) // handed over, never taken
			p.mu.Unlock()
		}()
		for _, d := range ds {
			select {
			case p.sendq <- d:
			case <-p.exited:
				return errors.New("module process exited")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var failed error
		for range ds {
			select {
			case o := <-result:
				p.outcomesDue.Add(-1)
				if o.Kind != pb.Outcome_OK && failed == nil {
					failed = errors.New(truncateText(o.Error, maxModuleErrorText))
				}
			case <-p.exited:
				return errors.New("module process exited while handling the history")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return failed
	}
}

// answer is the in-process handler of tool i: it runs the call in the
// module process. Calls are not batched: each is one unary gRPC call.
func (pm *PluginModule) answer(i uint32) sdk.ToolHandler {
	return sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
		p, err := pm.current(ctx)
		if err != nil {
			return nil, err
		}
		token, end := pm.handlings.begin(ctx)
		defer end()
		tr := plugin.ToolRequestOf(plugin.Request(req), i)
		tr.Handling = token
		tr.Traceparent, tr.Tracestate = tracecontext.Inject(ctx)
		a, err := p.remote.Module.Answer(ctx, tr)
		if err != nil {
			return nil, fmt.Errorf("module process: %w", err)
		}
		msg := truncateText(a.Message, maxModuleErrorText)
		switch {
		case a.IsError && a.Code != "":
			return nil, &sdk.ToolError{Code: truncateText(a.Code, 64), Message: msg, Permanent: a.Permanent}
		case a.IsError && a.Permanent:
			return nil, sdk.Permanent(errors.New(msg)) // toolError makes it "rejected"
		case a.IsError:
			return nil, errors.New(msg) // and this "failed"
		}
		return json.RawMessage(a.Body), nil
	})
}

// send crosses deliveries in batches that end with their burst (at most a
// millisecond: docs/adr/0025-plugin-batches.md), or at once when the
// window is full: then nothing more can arrive until outcomes go back.
func (p *moduleProcess) send() {
	for batch := range plugin.Batches(p.sendq, p.exited, p.windowFull) {
		if err := p.stream.Send(&pb.DeliveryBatch{Deliveries: batch}); err != nil {
			return // receive sees the stream end and marks the process gone
		}
	}
}

// windowFull reports whether every delivery the window allows is waiting
// for its outcome and none is left to send.
func (p *moduleProcess) windowFull() bool {
	if len(p.sendq) > 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending) >= p.window
}

// exitErr says how the process ended, as far as the stream saw it.
func (p *moduleProcess) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streamErr
}

func (p *moduleProcess) receive() {
	defer close(p.exited)
	for {
		b, err := p.stream.Recv()
		if err != nil {
			p.mu.Lock()
			p.streamErr = err
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		// The whole batch is counted due before the first handling can
		// take its outcome: its worker, and the others woken with it,
		// then ack together.
		due := 0
		for _, o := range b.Outcomes {
			if _, ok := p.pending[o.Seq]; ok {
				due++
			}
		}
		p.outcomesDue.Add(int64(due))
		for _, o := range b.Outcomes {
			if ch, ok := p.pending[o.Seq]; ok {
				ch <- o
				delete(p.pending, o.Seq)
				due--
			}
		}
		p.outcomesDue.Add(-int64(due)) // a seq the process sent twice: counted, not handed over
		p.mu.Unlock()
	}
}

// hostServer is the callback service a module process calls: it emits and
// calls as the module, so x-source and x-node are the host's, and names
// stay in the module's namespace whatever the process sends.
type hostServer struct {
	pb.UnimplementedHostServer
	pm *PluginModule
}

// Emit publishes a batch of the process's emits as the module. The ids
// are the host's: for a row of the module's outbox (protocol 8 on),
// derived from the module's name and the row's ref; otherwise derived in
// the handling the process names by its token, if the process asked for a
// derived id (a non-empty Id, whose value is not used), fresh outside a
// handling; a token the host does not know is refused.
// A batch holds plugin.MaxBatch emits at most, published by as many
// goroutines at most.
func (h *hostServer) Emit(ctx context.Context, b *pb.EmitBatch) (*pb.EmitResults, error) {
	if len(b.Emits) > plugin.MaxBatch {
		h.pm.log.Warn("emit batch over the limit refused", "emits", len(b.Emits), "limit", plugin.MaxBatch)
		return nil, status.Errorf(codes.ResourceExhausted, "an emit batch holds %d emits at most, not %d", plugin.MaxBatch, len(b.Emits))
	}
	m := h.pm.module
	res := &pb.EmitResults{Results: make([]*pb.EmitResult, len(b.Emits))}
	var wg sync.WaitGroup
	for i, e := range b.Emits {
		wg.Add(1)
		go func() { // the batch's publishes pipeline on the confirm channel
			defer wg.Done()
			o := wire.EmitOptions{Schema: e.Schema, CausationID: e.CausationId, TTL: time.Duration(e.TtlMillis) * time.Millisecond,
				Priority: uint8(min(e.Priority, 255)), HasPriority: e.HasPriority,
				FullType:   e.FullType, // still subject to the module's grants
				FreshID:    e.Id == "",
				AtMostOnce: e.AtMostOnce,
			}
			o.After, o.At = plugin.TimingFrom(e.AfterMillis, e.AtUnixMillis)
			if e.Outbox && h.pm.Protocol() >= plugin.ProtocolOutbox {
				// The id is derived from the module's name, which the host
				// knows, and the row's ref: e.Id is not used.
				o.Outbox = &causation.OutboxRef{Scope: e.OutboxScope, N: e.OutboxN, Time: time.UnixMilli(e.OutboxUnixMillis)}
				e.Handling = 0
			}
			hctx, err := h.pm.inHandling(ctx, e.Handling, e.CausationId, e.Id != "")
			id := ""
			if err == nil {
				err = o.Check()
			}
			if err == nil {
				id, err = m.emit(hctx, e.Name, json.RawMessage(e.Body), o, "")
			}
			res.Results[i] = &pb.EmitResult{Id: id, ErrorKind: errorKind(err)}
			if err != nil {
				res.Results[i].Error = err.Error()
				h.pm.log.Warn("emit from the module refused", "name", truncateText(e.Name, 300), "err", err)
			}
		}()
	}
	wg.Wait()
	return res, nil
}

func (h *hostServer) Call(ctx context.Context, r *pb.CallRequest) (*pb.CallResponse, error) {
	ctx, cancel := context.WithDeadline(ctx, time.Unix(0, r.DeadlineUnixNano))
	defer cancel()
	// The request id is the host's: derived from the handling the process
	// names, fresh outside one (r.Id, the process's own derivation, is not
	// used).
	ctx, err := h.pm.inHandling(ctx, r.Handling, r.CausationId, r.Id != "")
	var resp json.RawMessage
	if err == nil {
		err = h.pm.module.callTool(ctx, r.Tool, json.RawMessage(r.Body), &resp, "")
	}
	out := &pb.CallResponse{Body: resp, ErrorKind: errorKind(err)}
	if err != nil {
		out.Error = err.Error()
		var te *sdk.ToolError
		if errors.As(err, &te) {
			out.Error, out.ToolCode, out.ToolPermanent = te.Message, te.Code, te.Permanent
		}
	}
	return out, nil
}

// ReportOutbox keeps the backlog the process's outbox relay reports, for
// the node's metrics; a process can only report its own module's.
func (h *hostServer) ReportOutbox(_ context.Context, r *pb.OutboxReport) (*pb.Empty, error) {
	s := wire.OutboxStats{Unsent: max(r.Unsent, 0), SetAside: max(r.SetAside, 0), RelayErrors: r.RelayErrors}
	if r.OldestUnixNano > 0 {
		s.Oldest = time.Unix(0, r.OldestUnixNano)
	}
	h.pm.module.counts.outbox.Store(&s)
	return &pb.Empty{}, nil
}

func (h *hostServer) Hold(ctx context.Context, r *pb.HoldRequest) (*pb.HoldResponse, error) {
	err := h.pm.module.mesh.Hold(r.Queue, r.Held)
	if err != nil {
		return &pb.HoldResponse{ErrorKind: errorKind(err), Error: err.Error()}, nil
	}
	return &pb.HoldResponse{}, nil
}

// errorKind names the sdk sentinel err wraps, for the module process: a
// tool's error, or one of the table's (plugin.KindOf).
func errorKind(err error) pb.ErrorKind {
	var te *sdk.ToolError
	if errors.As(err, &te) {
		return pb.ErrorKind_TOOL
	}
	return plugin.KindOf(err)
}

// declarationsOf is the schemas and reads a module process described
// (sdk.Module.Schemas, Reads); the node compiles and bounds them at load.
func declarationsOf(desc *pb.Description) ([]sdk.Schema, map[string][]string, error) {
	if len(desc.Schemas) > schema.MaxDecls {
		return nil, nil, fmt.Errorf("%w: the module process declared %d schemas, at most %d", sdk.ErrInvalid, len(desc.Schemas), schema.MaxDecls)
	}
	var schemas []sdk.Schema
	for _, s := range desc.Schemas {
		schemas = append(schemas, sdk.Schema{Event: s.Event, Tool: s.Tool, Version: s.Version, JSON: s.Json, Response: s.Response})
	}
	var reads map[string][]string
	for _, r := range desc.Reads {
		if reads == nil {
			reads = map[string][]string{}
		}
		if _, dup := reads[r.Pattern]; dup {
			return nil, nil, fmt.Errorf("%w: the module process declared the reads of %q twice", sdk.ErrInvalid, truncateText(r.Pattern, 300))
		}
		reads[r.Pattern] = r.Versions
	}
	return schemas, reads, nil
}

// refusedGrant is a module process's handler error that was a refused
// grant: its text as the process sent it, and sdk.ErrForbidden to errors.Is,
// so the handling is dead-lettered at once as forbidden.
type refusedGrant string

func (e refusedGrant) Error() string { return string(e) }

// Is reports sdk.ErrForbidden.
func (e refusedGrant) Is(target error) bool { return target == sdk.ErrForbidden }
