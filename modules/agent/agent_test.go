package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/modules/agent"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func script(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mesh loads an agent with tools on a test mesh.
func mesh(t *testing.T, tools ...agent.Tool) (*meshtest.Mesh, *syncBuffer) {
	t.Helper()
	a, err := agent.New(agent.Config{Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	mt := meshtest.New(meshtest.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	t.Cleanup(mt.Close)
	if err := mt.Load(a.Module(), meshtest.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	return mt, logs
}

func call(mt *meshtest.Mesh, tool string, req any, resp any, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	return mt.Call(ctx, "test", tool, req, resp)
}

func toolErr(t *testing.T, err error, code string, permanent bool) *sdk.ToolError {
	t.Helper()
	var te *sdk.ToolError
	if !errors.As(err, &te) || te.Code != code || te.Permanent != permanent {
		t.Fatalf("error %v, want a ToolError %q (permanent %v)", err, code, permanent)
	}
	return te
}

// TestExitPaths: exit 0 answers with stdout, the request and its
// metadata having come on stdin; the documented status rejects for good;
// any other status and a crash are transient; stderr reaches the log
// tagged with the tool.
func TestExitPaths(t *testing.T) {
	mt, logs := mesh(t,
		agent.Tool{Key: "t.echo", Command: script(t, "echo.sh")},
		agent.Tool{Key: "t.reject", Command: script(t, "reject.sh")},
		agent.Tool{Key: "t.fail", Command: script(t, "fail.sh")},
		agent.Tool{Key: "t.crash", Command: script(t, "crash.sh")},
		agent.Tool{Key: "t.missing", Command: "/nonexistent/tool"},
	)
	var got struct {
		Tool, ID, Caller string
		Request          map[string]int
	}
	if err := call(mt, "t.echo", map[string]int{"order": 7}, &got, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got.Tool != "t.echo" || got.ID == "" || got.Caller != "test" || got.Request["order"] != 7 {
		t.Errorf("the command read %+v", got)
	}
	te := toolErr(t, call(mt, "t.reject", 1, nil, 10*time.Second), "rejected", true)
	if te.Message != "order 7 has no customer" {
		t.Errorf("rejection message %q, want stderr's last line", te.Message)
	}
	te = toolErr(t, call(mt, "t.fail", 1, nil, 10*time.Second), "failed", false)
	if !strings.Contains(te.Message, "exit status 3") || !strings.Contains(te.Message, "database unreachable") {
		t.Errorf("failure message %q", te.Message)
	}
	te = toolErr(t, call(mt, "t.crash", 1, nil, 10*time.Second), "failed", false)
	if !strings.Contains(te.Message, "signal") {
		t.Errorf("crash message %q", te.Message)
	}
	toolErr(t, call(mt, "t.missing", 1, nil, 10*time.Second), "unavailable", true)
	if l := logs.String(); !strings.Contains(l, "tool=t.reject") || !strings.Contains(l, "order 7 has no customer") {
		t.Errorf("stderr not in the log tagged with the tool:\n%s", l)
	}
}

// alive reports whether the process of the pid in file still runs, ten
// seconds on: a pidfd becomes readable when its process exits, so the
// wait ends on that signal (a process already gone has none to open).
func alive(t *testing.T, file string) (int, bool) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return pid, false
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll the pidfd of %d: %v", pid, err)
		}
		return pid, n == 0
	}
}

// TestDeadlineKillsTheGroup: past its timeout the command and everything
// it started are killed, and the call fails as transient; a command that
// answers but leaves a process behind has it killed too.
func TestDeadlineKillsTheGroup(t *testing.T) {
	dir := t.TempDir()
	hangPID, orphanPID := filepath.Join(dir, "hang.pid"), filepath.Join(dir, "orphan.pid")
	mt, _ := mesh(t,
		agent.Tool{Key: "t.hang", Command: script(t, "hang.sh"), Timeout: agent.Duration(300 * time.Millisecond), Env: map[string]string{"PIDFILE": hangPID}},
		agent.Tool{Key: "t.orphan", Command: script(t, "orphan.sh"), Env: map[string]string{"PIDFILE": orphanPID}},
	)
	toolErr(t, call(mt, "t.hang", 1, nil, 20*time.Second), "timeout", false)
	if pid, ok := alive(t, hangPID); ok {
		t.Errorf("the hung command's child %d outlived the deadline", pid)
	}
	var done map[string]bool
	if err := call(mt, "t.orphan", 1, &done, 20*time.Second); err != nil || !done["done"] {
		t.Fatalf("orphan.sh: %v, %v", done, err)
	}
	if pid, ok := alive(t, orphanPID); ok {
		t.Errorf("the background process %d outlived its call", pid)
	}
}

// gone fails t unless the process of the pid in file is gone: killed and
// reaped by the time the call returned.
func gone(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		if _, ok := alive(t, file); ok {
			t.Errorf("the escaped process %d outlived its call by more than ten seconds", pid)
		} else {
			t.Errorf("the escaped process %d was still there (or a zombie) when its call returned", pid)
		}
	}
}

// leftovers are the processes whose environment names the tool: those a
// run of it started, under any parent, in any session.
func leftovers(t *testing.T, tool string) []int {
	t.Helper()
	names, err := filepath.Glob("/proc/[0-9]*/environ")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, name := range names {
		env, err := os.ReadFile(name)
		if err == nil && bytes.Contains(append([]byte{0}, env...), []byte("\x00MESH_TOOL="+tool+"\x00")) {
			pid, _ := strconv.Atoi(strings.Split(name, "/")[2])
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestEscapedProcessesAreKilled: a process that left the command's
// process group and session (setsid), its parent gone (a double fork), is
// killed and reaped by the time the call returns, whether the command
// answered or hung past its deadline; so is a process that keeps starting
// such processes until it is killed.
func TestEscapedProcessesAreKilled(t *testing.T) {
	dir := t.TempDir()
	answered, hung := filepath.Join(dir, "answered.pid"), filepath.Join(dir, "hung.pid")
	timeout := agent.Duration(300 * time.Millisecond)
	mt, _ := mesh(t,
		agent.Tool{Key: "t.escape", Command: script(t, "escape.sh"), Env: map[string]string{"PIDFILE": answered}},
		agent.Tool{Key: "t.escapehang", Command: script(t, "escape.sh"), Timeout: timeout, Env: map[string]string{"PIDFILE": hung, "HANG": "1"}},
		agent.Tool{Key: "t.respawn", Command: script(t, "respawn.sh"), Timeout: timeout},
	)
	var done map[string]bool
	if err := call(mt, "t.escape", 1, &done, 20*time.Second); err != nil || !done["done"] {
		t.Fatalf("escape.sh: %v, %v", done, err)
	}
	gone(t, answered)
	toolErr(t, call(mt, "t.escapehang", 1, nil, 20*time.Second), "timeout", false)
	gone(t, hung)
	start := time.Now()
	toolErr(t, call(mt, "t.respawn", 1, nil, 20*time.Second), "timeout", false)
	took := time.Since(start)
	left := 0
	for _, key := range []string{"t.escape", "t.escapehang", "t.respawn"} {
		if pids := leftovers(t, key); len(pids) > 0 {
			left += len(pids)
			t.Errorf("%d processes of %s outlived its calls: %v", len(pids), key, pids)
		}
	}
	t.Logf("summary TestEscapedProcessesAreKilled: respawn.sh (timeout %v) answered after %v; processes of the three tools left: %d",
		time.Duration(timeout), took.Round(time.Millisecond), left)
}

// TestLimits: the command runs with the tool's limits; one that spins
// past cpu_seconds, or holds more than memory_bytes, fails, transient.
func TestLimits(t *testing.T) {
	mt, _ := mesh(t,
		agent.Tool{Key: "t.limits", Command: script(t, "limits.sh"),
			Limits: agent.Limits{CPUSeconds: 5, MemoryBytes: 256 << 20, OpenFiles: 64, Processes: 5000}},
		agent.Tool{Key: "t.spin", Command: script(t, "spin.sh"), Limits: agent.Limits{CPUSeconds: 1}},
		agent.Tool{Key: "t.hog", Command: script(t, "hog.sh"), Limits: agent.Limits{MemoryBytes: 64 << 20}},
		agent.Tool{Key: "t.nohog", Command: script(t, "hog.sh")},
	)
	var got map[string]any
	if err := call(mt, "t.limits", 1, &got, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"open_files": "64", "cpu_seconds": "5", "memory_kib": "262144", "processes": "5000"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the command ran with %s %v, want %v", k, got[k], v)
		}
	}
	te := toolErr(t, call(mt, "t.spin", 1, nil, 20*time.Second), "failed", false)
	if !strings.Contains(te.Message, "CPU time limit exceeded") {
		t.Errorf("spin.sh past cpu_seconds: %q", te.Message)
	}
	te = toolErr(t, call(mt, "t.hog", 1, nil, 20*time.Second), "failed", false)
	var held map[string]int
	if err := call(mt, "t.nohog", 1, &held, 20*time.Second); err != nil || held["bytes"] != 100000000 {
		t.Errorf("hog.sh without limits: %v, %v", held, err)
	}
	t.Logf("summary TestLimits: limits applied before the command ran; past cpu_seconds 1: %q; past memory_bytes 64 MiB: %q", "CPU time limit exceeded", te.Message)
}

// TestUser: as root, the agent runs a tool's command as its user, with
// the user's groups and home; limits.processes counts that user's
// processes.
func TestUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a tool as another user needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody:", err)
	}
	if n := len(processesOf(t, nobody.Uid)); n > 0 {
		t.Skipf("nobody runs %d processes already", n)
	}
	mt, _ := mesh(t,
		agent.Tool{Key: "t.whoami", Command: script(t, "limits.sh"), User: "nobody"},
		agent.Tool{Key: "t.uid", Command: script(t, "limits.sh"), User: nobody.Uid},
		agent.Tool{Key: "t.forks", Command: script(t, "forks.sh"), User: "nobody", Limits: agent.Limits{Processes: 3}},
	)
	for _, key := range []string{"t.whoami", "t.uid"} {
		var got map[string]any
		if err := call(mt, key, 1, &got, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got["uid"]) != nobody.Uid || fmt.Sprint(got["gid"]) != nobody.Gid || got["home"] != nobody.HomeDir {
			t.Errorf("%s ran as %v, want nobody (%s:%s, home %s)", key, got, nobody.Uid, nobody.Gid, nobody.HomeDir)
		}
	}
	te := toolErr(t, call(mt, "t.forks", 1, nil, 20*time.Second), "failed", false)
	t.Logf("summary TestUser: ran as nobody; four processes at once past processes 3: %q", te.Message)
}

// processesOf are the processes of a uid.
func processesOf(t *testing.T, uid string) []string {
	t.Helper()
	names, _ := filepath.Glob("/proc/[0-9]*/status")
	var pids []string
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == uid {
				pids = append(pids, name)
			}
		}
	}
	return pids
}

// TestBadOutput: stdout over the limit and stdout that is not JSON are
// permanent errors.
func TestBadOutput(t *testing.T) {
	mt, _ := mesh(t,
		agent.Tool{Key: "t.big", Command: script(t, "big.sh"), MaxOutputBytes: 1000},
		agent.Tool{Key: "t.text", Command: script(t, "notjson.sh")},
	)
	toolErr(t, call(mt, "t.big", 1, nil, 10*time.Second), "output_too_large", true)
	toolErr(t, call(mt, "t.text", 1, nil, 10*time.Second), "bad_output", true)
}

// TestMaxConcurrency: with 16 calls at once and a limit of 4, the
// command, which counts the runs going at once, never sees more than 4;
// once 4 run, the others wait until they finish.
func TestMaxConcurrency(t *testing.T) {
	dir := t.TempDir()
	// Two FIFOs, opened here for reading and writing so that the runs'
	// opens never block: on one the runs say they started, on the other
	// the test releases them, a line each.
	fifo := func(name string) *os.File {
		path := filepath.Join(dir, name)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	started, release := fifo("started"), fifo("release")
	mt, _ := mesh(t, agent.Tool{Key: "t.busy", Command: script(t, "busy.sh"), MaxConcurrency: 4, Env: map[string]string{"DIR": dir}})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			var out map[string]bool
			if err := call(mt, "t.busy", 1, &out, 60*time.Second); err != nil {
				errs <- err
			}
		})
	}
	lines := bufio.NewReader(started)
	for range 4 { // four at once, the limit, are running
		if _, err := lines.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := release.WriteString(strings.Repeat("go\n", 16)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen, err := os.ReadFile(filepath.Join(dir, "seen"))
	if err != nil {
		t.Fatal(err)
	}
	counts := strings.Fields(string(seen))
	if len(counts) != 16 {
		t.Errorf("%d runs recorded, want 16", len(counts))
	}
	for _, c := range counts {
		if n, _ := strconv.Atoi(c); n > 4 {
			t.Errorf("a run saw %d runs at once, limit 4", n)
		}
	}
}

// TestConfig: a tool without a key or command, a key twice, a bad exit
// status, a negative limit and an unknown user are refused, each named;
// durations read as text, limits and the user as documented.
func TestConfig(t *testing.T) {
	_, err := agent.New(agent.Config{Tools: []agent.Tool{{Key: "a.b"}, {Key: "a.b", Command: "x", PermanentExitCodes: []int{0}}}})
	for _, want := range []string{"tools[0].command", "tools[1].key", "tools[1].permanent_exit_codes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if _, err := agent.New(agent.Config{}); err == nil {
		t.Error("an agent without tools was accepted")
	}
	var cfg agent.Config
	if err := json.Unmarshal([]byte(`{"tools":[{"key":"a.b","command":"x","timeout":"1m30s"}]}`), &cfg); err != nil || time.Duration(cfg.Tools[0].Timeout) != 90*time.Second {
		t.Errorf("timeout read as %v, %v", cfg.Tools[0].Timeout, err)
	}
	_, err = agent.New(agent.Config{Tools: []agent.Tool{
		{Key: "a.b", Command: "x", Limits: agent.Limits{OpenFiles: -1, CPUSeconds: 1}},
		{Key: "a.c", Command: "x", User: "no-such-user-here"},
	}})
	for _, want := range []string{"tools[0].limits.open_files: -1 is negative", "tools[1].user"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %s", err, want)
		}
	}
	if err := json.Unmarshal([]byte(`{"tools":[{"key":"a.b","command":"x","user":"nobody","limits":{"cpu_seconds":2,"memory_bytes":1000000,"open_files":32,"processes":8}}]}`), &cfg); err != nil ||
		cfg.Tools[0].Limits != (agent.Limits{CPUSeconds: 2, MemoryBytes: 1000000, OpenFiles: 32, Processes: 8}) || cfg.Tools[0].User != "nobody" {
		t.Errorf("limits and user read as %+v, %q, %v", cfg.Tools[0].Limits, cfg.Tools[0].User, err)
	}
}
