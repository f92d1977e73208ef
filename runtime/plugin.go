package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/schema"
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
	// isolation hands a suspect (an event in flight when a process of
	// the module exited) to the process alone (isolation.go).
	isolation isolation
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
	// events is how many event handlings are in the process (forward),
	// and eventsAtExit how many were when its stream ended (ended): each
	// of those knows from it whether it was alone (isolation.go).
	events, eventsAtExit int
	ended                bool

	cmd      *exec.Cmd // its command, whose ProcessState says how it ended
	exitOnce sync.Once
	exitDesc string
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
	mc.isolation = &pm.isolation
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

// Refused returns why the module stopped for good (its process started
// again as another module), or nil; nil too once it is stopped (and so
// replaced, or gone).
func (pm *PluginModule) Refused() error {
	if err := pm.refused.Load(); err != nil && !pm.stopping.Load() {
		return *err
	}
	return nil
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
