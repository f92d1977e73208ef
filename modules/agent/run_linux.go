//go:build linux

package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// limitsSupported says whether a Tool's Limits can be applied: they are
// set by the supervisor, which is Linux's.
const limitsSupported = true

// supervisorGrace bounds how long a supervisor told to stop may take to
// kill its run; past it the agent kills the supervisor, and what the run
// started may then outlive it.
const supervisorGrace = 5 * time.Second

// supervision is what the agent tells a run's supervisor on its control
// pipe: the command to run and how.
type supervision struct {
	Path   string     `json:"path"`
	Args   []string   `json:"args"`
	Dir    string     `json:"dir,omitempty"`
	Env    []string   `json:"env"`
	Limits []setLimit `json:"limits,omitempty"`
	User   *userIDs   `json:"user,omitempty"`
}

// setLimit is one resource limit of a run.
type setLimit struct {
	Name     string `json:"name"`
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

type userIDs struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// report is what a supervisor says on its report pipe before it exits:
// the command's wait status, or why it was not started.
type report struct {
	Status *uint32 `json:"status,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// process is a run under its supervisor (see supervise). The agent waits
// for the supervisor, its own child, with os/exec, and for nothing else:
// it is no subreaper and reaps no process it did not start, so no wait of
// os/exec, the agent's or anyone's in the process, is stolen.
type process struct {
	cmd     *exec.Cmd
	control *os.File // the write end; closing it tells the supervisor to stop
	reports *os.File // the read end
	once    sync.Once
	kill    *time.Timer // set by stop: the grace given to the supervisor
}

// start starts a supervisor for a run of t's command with in on stdin.
func start(t Tool, in []byte, stdout, stderr *os.File) (*process, error) {
	// The command is looked up as os/exec does, in the agent's PATH.
	lookup := exec.Command(t.Command, t.Args...)
	if lookup.Err != nil {
		return nil, lookup.Err
	}
	spec := supervision{Path: lookup.Path, Args: lookup.Args, Dir: t.Dir, Env: environment(t)}
	for _, r := range t.Limits.rlimits() {
		if r.value > 0 {
			l := setLimit{Name: r.name, Resource: r.resource, Cur: uint64(r.value), Max: uint64(r.value)}
			if r.resource == unix.RLIMIT_CPU {
				l.Max++ // SIGXCPU at the limit, which a process may catch, SIGKILL a second later
			}
			spec.Limits = append(spec.Limits, l)
		}
	}
	if c := t.cred; c != nil {
		spec.User = &userIDs{UID: c.uid, GID: c.gid, Groups: c.groups}
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var files []*os.File // control's read end and write end, reports' read end and write end
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(files)
			return nil, err
		}
		files = append(files, r, w)
	}
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe", // the agent's binary, whose init makes it the supervisor
		Args:       []string{supervisorArg0},
		Env:        []string{},
		Stdin:      bytes.NewReader(in),
		Stdout:     stdout,
		Stderr:     stderr,
		ExtraFiles: []*os.File{files[0], files[3]}, // its fd 3 and fd 4
	}
	err = cmd.Start()
	closeAll([]*os.File{files[0], files[3]})
	if err != nil {
		closeAll([]*os.File{files[1], files[2]})
		return nil, fmt.Errorf("start its supervisor: %w", err)
	}
	p := &process{cmd: cmd, control: files[1], reports: files[2]}
	if _, err := p.control.Write(body); err != nil { // the supervisor reads it at once
		_ = cmd.Process.Kill()
		_, _ = p.wait()
		return nil, fmt.Errorf("hand the run to its supervisor: %w", err)
	}
	return p, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// stop tells the supervisor to kill the run, and gives it supervisorGrace.
func (p *process) stop() {
	p.once.Do(func() {
		p.control.Close()
		p.kill = time.AfterFunc(supervisorGrace, func() { _ = p.cmd.Process.Kill() })
	})
}

// wait waits for the supervisor, which exits once the command ended and
// every process of the run is gone, and says how the command ended.
func (p *process) wait() (syscall.WaitStatus, error) {
	err := p.cmd.Wait()
	p.once.Do(func() { p.control.Close() })
	if p.kill != nil {
		p.kill.Stop()
	}
	b, readErr := io.ReadAll(p.reports)
	p.reports.Close()
	var r report
	if jsonErr := json.Unmarshal(b, &r); readErr != nil || jsonErr != nil || r.Status == nil && r.Error == "" {
		if err == nil {
			err = errors.New("exit status 0")
		}
		return 0, fmt.Errorf("its supervisor ended without a report (%v): what the run started may still run", err)
	}
	if r.Error != "" {
		return 0, &startError{errors.New(r.Error)}
	}
	return syscall.WaitStatus(*r.Status), nil
}
