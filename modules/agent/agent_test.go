package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
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

// TestConfig: a tool without a key or command, a key twice and a bad
// exit status are refused, each named; durations read as text.
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
}
