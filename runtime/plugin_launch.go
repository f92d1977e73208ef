package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/sdk"
)

// Launching and supervising a module process. The invariants:
//
//   - A process gets the environment processSpec gives it and nothing else
//     of the node's (moduleEnv, SkipHostEnv); every connection with it is
//     mutual TLS made for its run (AutoMTLS); every message it sends meshd
//     is bounded by messageLimit.
//   - A process gets the host's callback server (start) only once it has
//     described the module the node loaded: a process started again that
//     describes another module (sameModule) is killed, and the module stops
//     for good (refuse), its events staying in its queue.
//   - At most one process is installed (pm.proc), and running is closed
//     while it is; a process that went away is taken out (takeOut) before
//     it is started again, so deliveries wait for the restart instead of
//     burning an attempt on the dead process.
//   - supervise starts the process again, with back-off, whenever it goes
//     away (it exited, its stream ended, or it failed its ping), until
//     Stop; the process that went away is ended first, whichever it was,
//     so none outlives its stream (TestBoundedAcrossTheBoundary). A first load starts a process that went away
//     while starting up to firstLaunches times.
//   - Stop wins over a restart: stopping is set under mu, so a restart
//     either sees it before it installs its process or leaves that process
//     for Stop to end, and a process still starting (launching) is killed.
//     No process is left behind.

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
		return fail(startError(client, cmd, tail, err))
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
	p := &moduleProcess{client: client, cmd: cmd, rpc: rpc, remote: remote, desc: desc, version: binaryVersion(pm.path), protocol: uint(client.NegotiatedVersion()), stream: stream, window: pm.window,
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
		// Its stream ended, but the process may live on (a stream the host
		// broke on a message past its bound, say): it is ended before
		// another takes its place, or it would outlive the host's
		// supervision, its connection to the host still open.
		p.kill(2 * time.Second)
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
