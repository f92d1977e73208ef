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
//	the deadline                       the whole process group is killed; a transient
//	                                     ToolError "timeout"
//
// Output that is not JSON is a permanent ToolError "bad_output"; output
// over the tool's limit (1 MiB by default) kills the process group and is
// a permanent ToolError "output_too_large". A command that cannot be
// started is a permanent ToolError "unavailable". stderr goes to the
// node's log, a line at a time, tagged with the tool. When the command
// ends, whatever it left running in its process group is killed: no
// orphan outlives a call.
//
// At most max_concurrency runs of a tool go at once (default 1); a call
// waits for a slot until its deadline, then fails with a transient
// ToolError "overloaded".
package agent

import (
	"errors"
	"fmt"
	"strings"
	"time"

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
	}
	if len(errs) > 0 {
		return fmt.Errorf("agent config: %w", errors.Join(errs...))
	}
	return nil
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
	return sdk.Module{Name: a.cfg.Name, Kind: sdk.KindAgent, Setup: func(m sdk.Mesh) error {
		var errs []error
		for _, t := range a.cfg.Tools {
			errs = append(errs, m.Serve(t.Key, a.handler(t, m)))
		}
		return errors.Join(errs...)
	}}
}
