package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshkit/mesh/sdk"
)

// envelope is what a command reads on stdin.
type envelope struct {
	Tool        string            `json:"tool"`
	ID          string            `json:"id"`
	Caller      string            `json:"caller,omitempty"`
	Node        string            `json:"node,omitempty"`
	Time        time.Time         `json:"time,omitzero"`
	Deadline    time.Time         `json:"deadline,omitzero"`
	CausationID string            `json:"causation_id,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Request     json.RawMessage   `json:"request"`
}

// Limits of what a run writes to the log from stderr.
const (
	maxStderrLine  = 4096
	maxStderrLines = 200
)

func toolError(code string, permanent bool, format string, args ...any) error {
	return &sdk.ToolError{Code: code, Message: fmt.Sprintf(format, args...), Permanent: permanent}
}

// handler runs t's command for each call.
func (a *Agent) handler(t Tool, m sdk.Mesh) sdk.ToolHandler {
	log := m.Logger().With("tool", t.Key)
	return sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
		select {
		case a.slots[t.Key] <- struct{}{}:
			defer func() { <-a.slots[t.Key] }()
		case <-ctx.Done():
			return nil, toolError("overloaded", false, "%d runs of %s busy until the deadline", t.MaxConcurrency, t.Key)
		}
		return run(ctx, t, req, log)
	})
}

// run runs the command once and turns its outcome into a response or a
// ToolError.
func run(ctx context.Context, t Tool, req sdk.Request, log *slog.Logger) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(t.Timeout))
	defer cancel()
	body := req.Body
	if len(body) == 0 {
		body = json.RawMessage("null")
	}
	in, err := json.Marshal(envelope{Tool: req.Tool, ID: req.ID, Caller: req.Caller, Node: req.Node, Time: req.Time,
		Deadline: req.Deadline, CausationID: req.CausationID, Headers: req.Headers, Request: body})
	if err != nil {
		return nil, toolError("bad_request", true, "the request is not JSON: %v", err)
	}

	stdout := &capped{max: t.MaxOutputBytes, over: cancel}
	stderr := &lines{log: log}
	// The command writes to pipes of the agent's own (os.File, so waiting
	// for the run does not wait for them): the wait returns when the
	// command ended and what it started is gone, and the pipes are read to
	// their end then.
	outputs, drained, err := pipeOutput(stdout, stderr)
	if err != nil {
		return nil, toolError("unavailable", true, "start %s: %v", t.Command, err)
	}
	p, err := start(t, in, outputs[0], outputs[1])
	if err != nil {
		drained()
		return nil, toolError("unavailable", true, "start %s: %v", t.Command, err)
	}
	stop := context.AfterFunc(ctx, p.stop)
	status, err := p.wait()
	stop()
	drained()
	stderr.flush()

	var notStarted *startError
	if err != nil && !errors.As(err, &notStarted) {
		log.Error("the run's outcome is not known", "err", err)
	}
	switch {
	case notStarted != nil:
		return nil, toolError("unavailable", true, "start %s: %v", t.Command, notStarted.err)
	case stdout.overflowed():
		return nil, toolError("output_too_large", true, "%s wrote more than %d bytes on stdout", t.Command, t.MaxOutputBytes)
	case (err != nil || !succeeded(status)) && ctx.Err() != nil:
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, toolError("timeout", false, "%s ran past its deadline; it and every process it started were killed", t.Command)
		}
		return nil, toolError("cancelled", false, "%s was stopped: %v", t.Command, ctx.Err())
	case err != nil:
		return nil, toolError("failed", false, "%s: %v", t.Command, err)
	case status.Exited() && status.ExitStatus() > 0 && slices.Contains(t.PermanentExitCodes, status.ExitStatus()):
		return nil, toolError("rejected", true, "%s", stderr.lastOr(fmt.Sprintf("%s rejected the request (exit status %d)", t.Command, status.ExitStatus())))
	case !succeeded(status):
		return nil, toolError("failed", false, "%s: %s: %s", t.Command, describe(status), stderr.lastOr("no stderr"))
	}
	out := bytes.TrimSpace(stdout.buf.Bytes())
	if len(out) == 0 {
		return json.RawMessage("null"), nil
	}
	if !json.Valid(out) {
		return nil, toolError("bad_output", true, "%s wrote %d bytes on stdout that are not JSON", t.Command, len(out))
	}
	return json.RawMessage(out), nil
}

// startError is a command that could not be started.
type startError struct{ err error }

func (e *startError) Error() string { return "start: " + e.err.Error() }

func succeeded(s syscall.WaitStatus) bool { return s.Exited() && s.ExitStatus() == 0 }

// describe says how a command ended, as os.ProcessState does.
func describe(s syscall.WaitStatus) string {
	switch {
	case s.Exited():
		return "exit status " + strconv.Itoa(s.ExitStatus())
	case s.Signaled() && s.CoreDump():
		return "signal: " + s.Signal().String() + " (core dumped)"
	case s.Signaled():
		return "signal: " + s.Signal().String()
	}
	return fmt.Sprintf("wait status %#x", uint32(s))
}

// pipeOutput makes a stdout and a stderr pipe, each copied to w by a
// goroutine, and returns their write ends for the command. The returned
// drained closes the agent's write ends and waits until both pipes are
// read to their end, at most a second: a process the agent could not kill
// may hold them.
func pipeOutput(stdout, stderr io.Writer) (outputs []*os.File, drained func(), err error) {
	var readers, writers []*os.File
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range append(readers, writers...) {
				f.Close()
			}
			return nil, nil, err
		}
		readers, writers = append(readers, r), append(writers, w)
	}
	var wg sync.WaitGroup
	for i, dst := range []io.Writer{stdout, stderr} {
		wg.Go(func() { _, _ = io.Copy(dst, readers[i]) })
	}
	return writers, func() {
		for _, w := range writers {
			w.Close() // the command has its own copies; EOF comes when they are gone
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
		for _, r := range readers {
			r.Close()
		}
	}, nil
}

// environment is a command's environment: a few of the agent's (HOME the
// user's when the tool has one), the tool's own, and MESH_TOOL; a later
// one of a name wins, as os/exec has it.
func environment(t Tool) []string {
	var env []string
	at := map[string]int{}
	set := func(k, v string) {
		if i, ok := at[k]; ok {
			env[i] = k + "=" + v
			return
		}
		at[k] = len(env)
		env = append(env, k+"="+v)
	}
	for _, k := range []string{"PATH", "HOME", "LANG", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			set(k, v)
		}
	}
	if t.cred != nil && t.cred.home != "" {
		set("HOME", t.cred.home)
	}
	for _, k := range slices.Sorted(maps.Keys(t.Env)) {
		set(k, t.Env[k])
	}
	set("MESH_TOOL", t.Key)
	return env
}

// capped keeps up to max bytes; past them it drops the rest, says so and
// calls over (which kills the run).
type capped struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	max  int64
	over func()
	full bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.full {
		return len(p), nil
	}
	if int64(c.buf.Len()+len(p)) > c.max {
		c.full = true
		c.over()
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *capped) overflowed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.full
}

// lines writes what a command says on stderr to the log, a line at a
// time (each cut at maxStderrLine bytes, at most maxStderrLines a run),
// and keeps the last one for the error message.
type lines struct {
	mu      sync.Mutex
	log     *slog.Logger
	partial []byte
	n       int
	last    string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			if len(l.partial) > maxStderrLine {
				l.emit(l.partial)
				l.partial = l.partial[:0]
			}
			return len(p), nil
		}
		l.emit(l.partial[:i])
		l.partial = l.partial[i+1:]
	}
}

func (l *lines) emit(line []byte) {
	s := strings.TrimRight(string(line[:min(len(line), maxStderrLine)]), "\r")
	if strings.TrimSpace(s) == "" {
		return
	}
	l.last = s
	if l.n++; l.n <= maxStderrLines {
		l.log.Warn(s, "stream", "stderr")
	} else if l.n == maxStderrLines+1 {
		l.log.Warn("more stderr not logged", "stream", "stderr", "limit", maxStderrLines)
	}
}

func (l *lines) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.emit(l.partial)
		l.partial = nil
	}
}

func (l *lines) lastOr(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last != "" {
		return l.last
	}
	return s
}
