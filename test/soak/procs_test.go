//go:build soak

package soak

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/proctest"
)

// meshd is one meshd process of the soak, started again after the
// nemesis kills it.
type meshd struct {
	name, bin, config, dir, http string

	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	incarnation int
}

// freeAddr is a 127.0.0.1 address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// start runs meshd, its output in a log file of its own per incarnation.
func (m *meshd) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.incarnation++
	logFile, err := os.Create(filepath.Join(m.dir, fmt.Sprintf("%s.%d.log", m.name, m.incarnation)))
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, "run", "--config", m.config)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start meshd %s: %w", m.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	m.cmd, m.exited = cmd, exited
	return nil
}

// pid is the running meshd's process id.
func (m *meshd) pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// kill SIGKILLs meshd and returns, once it has exited, the module
// processes it had (they exit by themselves when they see it gone).
func (m *meshd) kill() []int {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	children := modulesOf(cmd.Process.Pid)
	_ = cmd.Process.Kill()
	<-exited
	return children
}

// stop ends meshd with SIGTERM, as an operator would; SIGKILL if it has
// not exited within a minute.
func (m *meshd) stop() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// get reads path from meshd's HTTP server.
func (m *meshd) get(path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.http+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return resp.StatusCode, b.String(), nil
}

// awaitReady waits until meshd answers /readyz with 200 (a minute at most).
func (m *meshd) awaitReady() error {
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		m.mu.Lock()
		exited, n := m.exited, m.incarnation
		m.mu.Unlock()
		select {
		case <-exited:
			return fmt.Errorf("meshd %s exited (its log: %s)", m.name, filepath.Join(m.dir, fmt.Sprintf("%s.%d.log", m.name, n)))
		default:
		}
		code, body, err := m.get("/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprint(code, " ", strings.TrimSpace(body), err)
		pause(200 * time.Millisecond)
	}
	return fmt.Errorf("meshd %s is not ready after a minute: %s", m.name, last)
}

// usage is meshd's goroutines and resident memory, from its /metrics.
type usage struct {
	goroutines int
	rss        int64
}

func (u usage) String() string { return fmt.Sprintf("%dg/%dMiB", u.goroutines, u.rss>>20) }

func (m *meshd) usage() (usage, error) {
	code, body, err := m.get("/metrics")
	if err != nil || code != http.StatusOK {
		return usage{}, fmt.Errorf("meshd %s /metrics: %d %v", m.name, code, err)
	}
	var u usage
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "go_goroutines":
			u.goroutines = int(v)
		case "process_resident_memory_bytes":
			u.rss = int64(v)
		}
	}
	return u, nil
}

// moduleBinaries are the base names of the soak's module binaries (build).
var moduleBinaries = map[string]bool{"soakmodule": true, "audit-logger": true, "dispatcher": true, "agent": true}

// modulesOf is the process ids of the module processes parent runs (its
// children running the soak's module binaries; the agent's supervisors
// are its children, not meshd's).
func modulesOf(parent int) []int {
	var out []int
	for _, p := range proctest.List() {
		argv := strings.Fields(p.Cmdline)
		if p.PPID == parent && len(argv) > 0 && moduleBinaries[filepath.Base(argv[0])] {
			out = append(out, p.PID)
		}
	}
	return out
}
