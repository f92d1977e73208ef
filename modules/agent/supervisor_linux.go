//go:build linux

package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The os.Args[0] that make the agent's binary, run again, a run's
// supervisor, or the limiter that applies a run's limits and user before
// it executes the command.
const (
	supervisorArg0 = "mesh-agent-supervisor"
	limiterArg0    = "mesh-agent-limiter"
)

// init takes the process over when the agent started it as a supervisor
// or a limiter; nothing else of the binary runs then.
func init() {
	if len(os.Args) == 0 {
		return
	}
	switch os.Args[0] {
	case supervisorArg0:
		os.Exit(supervise())
	case limiterArg0:
		os.Exit(limit())
	}
}

// supervise runs one run of a command, and sees that no process of it
// outlives it. The agent hands it the run (a supervision) on fd 3, and
// closes fd 3 to say stop (at the deadline, or when the agent goes away);
// stdin, stdout and stderr are the command's. It says how the command
// ended in a report on fd 4, and exits.
//
// It is a child subreaper, and its only child is the command: a process
// of the run whose parent exits is made its child, not init's, whatever
// session or group it is in, so every process of the run is its
// descendant until it is reaped. Once the command exited, or on stop, it
// kills the command's group and every descendant it finds in /proc, again
// each time a child ends (a process may have forked before it was
// killed: its child is found on the next scan, which the death of an
// ancestor that was seen brings), and reaps them, until it has no child
// left: then no process of the run is left either, since an orphan would
// be its child.
//
// It reaps with wait4(-1): all of its children are the run's, and no
// os/exec of its own waits for any of them, so none is stolen.
func supervise() int {
	control, reports := os.NewFile(3, "control"), os.NewFile(4, "reports")
	syscall.CloseOnExec(3) // the command inherits neither
	syscall.CloseOnExec(4)
	var spec supervision
	if err := json.NewDecoder(control).Decode(&spec); err != nil {
		fmt.Fprintln(os.Stderr, "agent supervisor: read the run:", err)
		return 1
	}
	say := func(r report) int {
		if err := json.NewEncoder(reports).Encode(r); err != nil {
			return 1
		}
		return 0
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return say(report{Error: fmt.Sprintf("the supervisor cannot be a child subreaper: %v", err)})
	}
	ended := make(chan os.Signal, 1)
	signal.Notify(ended, syscall.SIGCHLD)
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	tool, err := spawn(spec)
	if err != nil {
		return say(report{Error: err.Error()})
	}
	releaseStdio() // the command has them; the agent sees EOF once the run is gone
	told := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, control)
		close(told)
	}()

	run := &tree{self: os.Getpid(), tool: tool}
	stopping := false
	for !run.step(stopping) {
		select {
		case <-ended:
		case <-told:
			stopping, told = true, nil
		case <-stopped:
			stopping = true
		}
	}
	status := uint32(run.status)
	return say(report{Status: &status})
}

// spawn starts the command in a process group of its own: directly (as
// its user, if it has one), or through the limiter when it has limits.
func spawn(spec supervision) (int, error) {
	attr := &syscall.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true}}
	if len(spec.Limits) == 0 {
		if u := spec.User; u != nil {
			attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
		}
		if spec.Dir != "" {
			var pathErr *os.PathError
			if _, err := os.Stat(spec.Dir); errors.As(err, &pathErr) {
				return 0, &os.PathError{Op: "chdir", Path: spec.Dir, Err: pathErr.Err}
			}
		}
		pid, err := syscall.ForkExec(spec.Path, spec.Args, attr)
		if err != nil {
			return 0, &os.PathError{Op: "fork/exec", Path: spec.Path, Err: err}
		}
		return pid, nil
	}
	// The limiter says on its fd 3 why it could not execute the command;
	// the pipe closes without a word when it did.
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	how, err := json.Marshal(limiting{Limits: spec.Limits, User: spec.User, Dir: spec.Dir})
	if err != nil {
		w.Close()
		return 0, err
	}
	attr.Dir = "" // the limiter changes to it once it is the user
	attr.Files = append(attr.Files, w.Fd())
	pid, err := syscall.ForkExec("/proc/self/exe", append([]string{limiterArg0, string(how), spec.Path}, spec.Args...), attr)
	w.Close()
	if err != nil {
		return 0, fmt.Errorf("start the limiter: %w", err)
	}
	why, _ := io.ReadAll(r)
	if len(why) > 0 {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil) // it exits at once
		return 0, errors.New(string(why))
	}
	return pid, nil
}

// releaseStdio points the supervisor's stdin and stdout at /dev/null, so
// that it holds the run's pipes no longer than the command does (stderr
// it keeps, for what the Go runtime might say).
func releaseStdio() {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer null.Close()
	_ = unix.Dup3(int(null.Fd()), 0, 0)
	_ = unix.Dup3(int(null.Fd()), 1, 0)
}

// tree is a supervisor's run: the command and what it started.
type tree struct {
	self, tool int
	reaped     bool // the command exited and was reaped
	status     syscall.WaitStatus
}

// step reaps what ended and, if the run is over (the command exited, or
// stopping) and anything of it is left, kills that; it says whether the
// run is gone: no child left. A command that leaves nothing costs no scan
// of /proc.
func (t *tree) step(stopping bool) (gone bool) {
	if t.reap() {
		return true
	}
	if !t.reaped && !stopping {
		return false
	}
	t.kill()
	return t.reap()
}

// reap reaps the children that ended, and says whether none is left.
func (t *tree) reap() (none bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
		case err != nil: // ECHILD: no child, and so no descendant, is left
			return true
		case pid == 0: // children left, none of them ended
			return false
		case pid == t.tool:
			t.status, t.reaped = ws, true
		}
	}
}

// kill sends SIGKILL to the command's group (while the command is not
// reaped, the group's id is not reused) and to every descendant of the
// supervisor.
func (t *tree) kill() {
	if !t.reaped {
		_ = syscall.Kill(-t.tool, syscall.SIGKILL)
	}
	for pid, parent := range descendants(t.self) {
		killProcess(pid, parent, t.self)
	}
}

// descendants reads /proc for the processes under root: each, with its
// parent.
func descendants(root int) map[int]int {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := dir.Readdirnames(-1)
	dir.Close()
	children := map[int][]int{}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if parent, _, ok := stat(pid); ok {
			children[parent] = append(children[parent], pid)
		}
	}
	found := map[int]int{}
	for next := []int{root}; len(next) > 0; {
		p := next[0]
		next = next[1:]
		for _, c := range children[p] {
			if _, seen := found[c]; !seen && c != root {
				found[c] = p
				next = append(next, c)
			}
		}
	}
	return found
}

// killProcess sends SIGKILL to pid, a descendant seen with parent, unless
// pid is no longer that process: by a pidfd, which names one process, and
// whose process, once the pidfd is open, must still have parent, or self
// when it was reparented. (A descendant may have been reaped by its parent
// and its pid reused since /proc was read.)
func killProcess(pid, parent, self int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil { // no pidfds (Linux before 5.3, or a seccomp filter)
		_ = unix.Kill(pid, unix.SIGKILL)
		return
	}
	defer unix.Close(fd)
	if now, _, ok := stat(pid); !ok || now != parent && now != self {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// stat reads a process's parent and state from /proc/PID/stat.
func stat(pid int) (parent int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "PID (COMM) STATE PPID ...": COMM may hold anything, ")" too.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	parent, err = strconv.Atoi(fields[1])
	return parent, fields[0][0], err == nil
}

// limiting is what the limiter applies before it executes the command.
type limiting struct {
	Limits []setLimit `json:"limits,omitempty"`
	User   *userIDs   `json:"user,omitempty"`
	Dir    string     `json:"dir,omitempty"`
}

// limit is the limiter: os.Args are [limiterArg0, a limiting as JSON, the
// command's path, its arguments...]. It sets the limits on itself (as
// root, when the agent is, so that it may raise them), becomes the user,
// changes to the directory and executes the command, which keeps them
// all; it says on fd 3 why it could not.
func limit() int {
	why := os.NewFile(3, "why")
	syscall.CloseOnExec(3)
	fail := func(format string, args ...any) int {
		fmt.Fprintf(why, format, args...)
		return 127
	}
	var how limiting
	if len(os.Args) < 4 {
		return fail("the limiter's arguments are %q", os.Args)
	}
	if err := json.Unmarshal([]byte(os.Args[1]), &how); err != nil {
		return fail("the limiter's arguments: %v", err)
	}
	setLimits := func(processes bool) error {
		for _, l := range how.Limits {
			if (l.Resource == unix.RLIMIT_NPROC) != processes {
				continue
			}
			if err := unix.Setrlimit(l.Resource, &unix.Rlimit{Cur: l.Cur, Max: l.Max}); err != nil {
				return fmt.Errorf("limits.%s %d: setrlimit: %w", l.Name, l.Cur, err)
			}
		}
		return nil
	}
	if err := setLimits(false); err != nil {
		return fail("%v", err)
	}
	if u := how.User; u != nil {
		groups := make([]int, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = int(g)
		}
		if err := errors.Join(syscall.Setgroups(groups), syscall.Setgid(int(u.GID)), syscall.Setuid(int(u.UID))); err != nil {
			return fail("become uid %d gid %d: %v", u.UID, u.GID, err)
		}
	}
	if how.Dir != "" {
		if err := os.Chdir(how.Dir); err != nil {
			return fail("%v", err)
		}
	}
	// RLIMIT_NPROC last, once the user: the limiter's threads count as
	// the user's processes, and a setuid past the limit would fail the
	// exec (EAGAIN); the command, one thread once executed, is held to it.
	if err := setLimits(true); err != nil {
		return fail("%v", err)
	}
	err := syscall.Exec(os.Args[2], os.Args[3:], os.Environ())
	return fail("%v", &os.PathError{Op: "fork/exec", Path: os.Args[2], Err: err})
}
