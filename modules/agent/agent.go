// Package agent is the agent module: it serves tools from configuration,
// each backed by an executable, so that a program in any language can
// serve a tool on the mesh.
//
// For each call the agent runs the tool's command in its own process
// group. The command reads one JSON object on stdin, the request and its
// metadata:
//
//	{"tool": "invoice.create", "id": "01J...", "caller": "dispatcher", "node": "anchor",
//	 "time": "...", "deadline": "...", "causation_id": "01J...", "headers": {...},
//	 "request": <the request JSON>}
//
// and writes the response JSON on stdout (nothing is null). Its exit
// status decides the outcome:
//
//	0                                  success: stdout is the response
//	65 (EX_DATAERR), or the tool's     the request is rejected for good: a permanent
//	  permanent_exit_codes               ToolError "rejected" with stderr's last line
//	any other status, a signal         a transient ToolError "failed": the caller may retry
//	the deadline                       the command and every process it started are
//	                                     killed; a transient ToolError "timeout"
//
// Output that is not JSON is a permanent ToolError "bad_output"; output
// over the tool's limit (1 MiB by default) kills the run and is a
// permanent ToolError "output_too_large". A command that cannot be
// started is a permanent ToolError "unavailable". stderr goes to the
// node's log, a line at a time, tagged with the tool.
//
// # No process outlives its call
//
// When the command ends, or at the deadline, every process it started is
// killed, also those that left its process group or session (setsid,
// a double fork): no orphan outlives a call. On Linux each run has a
// supervisor, the agent's own binary run again (its package init takes
// over when os.Args[0] says so): a child subreaper (PR_SET_CHILD_SUBREAPER)
// whose only children are the command and the orphans of its tree, so
// that every process the command starts stays its descendant. Once the
// command exited, or when the agent says stop (the deadline) or goes
// away, the supervisor kills its descendants, found in /proc, until none
// is left, reaps them, and reports how the command ended. The agent, which
// waits only for its supervisors, is no subreaper itself. Elsewhere the
// agent kills the command's process group, which a process can leave.
//
// A command that runs as the agent's user can kill its supervisor (as it
// can kill the agent); a tool you do not trust should run as a user of its
// own (user:), which also makes limits.processes mean something.
//
// # Limits and user
//
// A tool's limits bound each process of a run (setrlimit(2), applied
// before the command runs; Linux only): cpu_seconds (RLIMIT_CPU: SIGXCPU,
// then SIGKILL a second later), memory_bytes (RLIMIT_AS, address space,
// which some runtimes reserve generously), open_files (RLIMIT_NOFILE) and
// processes (RLIMIT_NPROC, which counts every process of the user the
// command runs as, and is not enforced for root). A process past a limit
// fails or is killed, which is a transient ToolError "failed". user runs
// the command as another user (a name or a uid, with its primary group,
// its groups and its home as HOME), which needs the agent to run as root.
//
//	tools:
//	  - key: report.render
//	    command: /opt/report/render
//	    timeout: 20s
//	    user: report
//	    limits: {cpu_seconds: 10, memory_bytes: 1073741824, open_files: 64, processes: 32}
//
// At most max_concurrency runs of a tool go at once (default 1); a call
// waits for a slot until its deadline, then fails with a transient
// ToolError "overloaded".
package agent

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/modules/internal/settings"
	"github.com/meshkit/mesh/sdk"
)

// Defaults of a Tool's settings.
const (
	DefaultName           = "agent"
	DefaultTimeout        = 30 * time.Second
	DefaultMaxOutputBytes = 1 << 20
	// ExitRejected is the exit status that rejects a request for good
	// (sysexits' EX_DATAERR), unless a tool lists its own.
	ExitRejected = 65
)

// Config is the agent's settings: its tools.
type Config struct {
	// Name is the module's name (default "agent"); it must match its
	// entry in meshd's config.
	Name  string `json:"name,omitempty"`
	Tools []Tool `json:"tools"`
}

// Tool is one tool the agent serves by running a command.
type Tool struct {
	// Key is the tool key ("invoice.create"); meshd's config must grant
	// it (the module's tools).
	Key string `json:"key"`
	// Command is the executable (a path, or a name looked up in PATH),
	// and Args its arguments.
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Dir is the working directory; "" is the agent's.
	Dir string `json:"dir,omitempty"`
	// Env is added to the command's environment, which otherwise holds
	// only PATH, HOME, LANG and TMPDIR from the agent's, and MESH_TOOL
	// (the tool key).
	Env map[string]string `json:"env,omitempty"`
	// Timeout bounds a run, besides the caller's deadline (default 30s).
	Timeout Duration `json:"timeout,omitempty"`
	// MaxConcurrency bounds the runs at once (default 1).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// PermanentExitCodes are the exit statuses that reject a request for
	// good (default [65]).
	PermanentExitCodes []int `json:"permanent_exit_codes,omitempty"`
	// MaxOutputBytes bounds stdout (default 1 MiB).
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// Limits bound the resources of each process of a run (Linux only).
	Limits Limits `json:"limits,omitzero"`
	// User is whom the command runs as: a user name or a numeric uid,
	// with the user's primary group and groups, and HOME its home. ""
	// is the agent's user; another needs the agent to run as root.
	User string `json:"user,omitempty"`

	cred *credential // User, resolved by check
}

// Limits are resource limits (setrlimit(2)) of each process of a run; a
// zero field is no limit, and the agent's own limit applies.
type Limits struct {
	// CPUSeconds is RLIMIT_CPU: past it the process gets SIGXCPU, and
	// SIGKILL a second later.
	CPUSeconds int64 `json:"cpu_seconds,omitempty"`
	// MemoryBytes is RLIMIT_AS, the address space of a process.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// OpenFiles is RLIMIT_NOFILE, one more than the highest file
	// descriptor a process may open.
	OpenFiles int64 `json:"open_files,omitempty"`
	// Processes is RLIMIT_NPROC: the processes (and threads) of the
	// command's user, all of them, past which a fork fails; root is
	// exempt, so it is a bound only with User set to a user of its own.
	Processes int64 `json:"processes,omitempty"`
}

// credential is a Tool's User resolved.
type credential struct {
	uid, gid uint32
	groups   []uint32
	home     string
}

// Duration is a time.Duration read from JSON as text ("10s") or as
// nanoseconds.
type Duration = settings.Duration

// check validates c and fills in the defaults.
func (c *Config) check() error {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if len(c.Tools) == 0 {
		return errors.New("agent: no tools configured")
	}
	var errs []error
	keys := map[string]bool{}
	for i := range c.Tools {
		t := &c.Tools[i]
		field := fmt.Sprintf("tools[%d]", i)
		switch {
		case t.Key == "":
			errs = append(errs, fmt.Errorf("%s.key: is empty", field))
		case keys[t.Key]:
			errs = append(errs, fmt.Errorf("%s.key: %q is configured twice", field, t.Key))
		}
		keys[t.Key] = true
		if strings.TrimSpace(t.Command) == "" {
			errs = append(errs, fmt.Errorf("%s.command: is empty", field))
		}
		if t.Timeout < 0 || t.MaxConcurrency < 0 || t.MaxOutputBytes < 0 {
			errs = append(errs, fmt.Errorf("%s: timeout, max_concurrency and max_output_bytes must not be negative", field))
		}
		if t.Timeout == 0 {
			t.Timeout = Duration(DefaultTimeout)
		}
		if t.MaxConcurrency == 0 {
			t.MaxConcurrency = 1
		}
		if t.MaxOutputBytes == 0 {
			t.MaxOutputBytes = DefaultMaxOutputBytes
		}
		if t.PermanentExitCodes == nil {
			t.PermanentExitCodes = []int{ExitRejected}
		}
		for _, code := range t.PermanentExitCodes {
			if code <= 0 || code > 255 {
				errs = append(errs, fmt.Errorf("%s.permanent_exit_codes: %d is not an exit status from 1 to 255", field, code))
			}
		}
		errs = append(errs, t.Limits.check(field+".limits"))
		if t.User != "" {
			var err error
			if t.cred, err = lookupUser(t.User); err != nil {
				errs = append(errs, fmt.Errorf("%s.user: %w", field, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("agent config: %w", err)
	}
	return nil
}

// check validates the limits; field names them in errors.
func (l Limits) check(field string) error {
	if l == (Limits{}) {
		return nil
	}
	if !limitsSupported {
		return fmt.Errorf("%s: resource limits are applied on Linux only", field)
	}
	var errs []error
	for _, r := range l.rlimits() {
		if r.value < 0 {
			errs = append(errs, fmt.Errorf("%s.%s: %d is negative", field, r.name, r.value))
		} else if err := r.allowed(); err != nil {
			errs = append(errs, fmt.Errorf("%s.%s: %w", field, r.name, err))
		}
	}
	return errors.Join(errs...)
}

// rlimit is one of a Tool's Limits: its setting's name, the resource
// and the value (0: none).
type rlimit struct {
	name     string
	resource int
	value    int64
}

func (l Limits) rlimits() []rlimit {
	return []rlimit{
		{"cpu_seconds", unix.RLIMIT_CPU, l.CPUSeconds},
		{"memory_bytes", unix.RLIMIT_AS, l.MemoryBytes},
		{"open_files", unix.RLIMIT_NOFILE, l.OpenFiles},
		{"processes", unix.RLIMIT_NPROC, l.Processes},
	}
}

// allowed refuses a limit over the agent's own hard limit, which only
// root may raise.
func (r rlimit) allowed() error {
	var own unix.Rlimit
	if r.value == 0 || os.Geteuid() == 0 || unix.Getrlimit(r.resource, &own) != nil {
		return nil
	}
	if hard := uint64(own.Max); hard != uint64(unix.RLIM_INFINITY) && uint64(r.value) > hard {
		return fmt.Errorf("%d is over the agent's own hard limit %d, which only root may raise", r.value, hard)
	}
	return nil
}

// lookupUser resolves a user name or uid; running as another user than
// the agent's needs root.
func lookupUser(name string) (*credential, error) {
	u, err := user.Lookup(name)
	if _, numeric := strconv.ParseUint(name, 10, 32); err != nil && numeric == nil {
		u, err = user.LookupId(name) // a uid
	}
	if err != nil {
		return nil, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %q has no numeric uid and gid: %w", name, err)
	}
	if euid := os.Geteuid(); euid != 0 && uint64(euid) != uid {
		return nil, fmt.Errorf("running the command as %s (uid %d) needs the agent to run as root; it runs as uid %d", name, uid, euid)
	}
	c := &credential{uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("the groups of %s: %w", name, err)
	}
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil {
			c.groups = append(c.groups, uint32(g))
		}
	}
	return c, nil
}

// Agent serves the tools of a Config.
type Agent struct {
	cfg   Config
	slots map[string]chan struct{}
}

// New checks cfg and returns its agent.
func New(cfg Config) (*Agent, error) {
	cfg.Tools = append([]Tool(nil), cfg.Tools...)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, slots: make(map[string]chan struct{}, len(cfg.Tools))}
	for _, t := range cfg.Tools {
		a.slots[t.Key] = make(chan struct{}, t.MaxConcurrency)
	}
	return a, nil
}

// Module is the agent as an sdk module: it serves every configured tool.
func (a *Agent) Module() sdk.Module {
	return sdk.Module{Name: a.cfg.Name, Kind: "agent", Setup: func(m sdk.Mesh) error {
		var errs []error
		for _, t := range a.cfg.Tools {
			errs = append(errs, m.Serve(t.Key, a.handler(t, m)))
		}
		return errors.Join(errs...)
	}}
}
