//go:build unix && !linux

package agent

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// limitsSupported says whether a Tool's Limits can be applied: they are
// set by the supervisor, which is Linux's.
const limitsSupported = false

// process is a run of a command in a process group of its own. Without
// the Linux supervisor, what left the group (setsid) is not killed.
type process struct {
	cmd  *exec.Cmd
	pgid int
}

// start starts t's command with in on stdin.
func start(t Tool, in []byte, stdout, stderr *os.File) (*process, error) {
	cmd := exec.Command(t.Command, t.Args...)
	cmd.Dir = t.Dir
	cmd.Env = environment(t)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c := t.cred; c != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.uid, Gid: c.gid, Groups: c.groups}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &process{cmd: cmd, pgid: cmd.Process.Pid}, nil
}

// stop kills the command's process group.
func (p *process) stop() { _ = syscall.Kill(-p.pgid, syscall.SIGKILL) }

// wait waits for the command, then kills whatever it left behind in its
// group, and says how the command ended.
func (p *process) wait() (syscall.WaitStatus, error) {
	err := p.cmd.Wait()
	p.stop()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return 0, err
	}
	status, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return status, nil
}
