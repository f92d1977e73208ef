package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
)

// startMeshd builds meshd and runs it with the config text (its node name,
// broker URL and the rest), serving HTTP on a free port. It returns the
// process, the HTTP address, its log and the config file's path.
func startMeshd(t *testing.T, ctx context.Context, config string) (*exec.Cmd, string, *lockedBuffer, string) {
	t.Helper()
	dir := testdir.Reachable(t)
	bin := filepath.Join(dir, "meshd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	addr := freeport.Addr(t) // meshd listens on it
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(config+fmt.Sprintf("\nstate_dir: %s\nhttp_addr: %s\n", filepath.Join(dir, "state"), addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "run", "--config", cfg)
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // if a test left it frozen
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, addr, logs, cfg
}

// httpGet returns the status and body of GET http://addr/path, or 0 if it
// does not answer.
func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// eventually polls cond until it holds or ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool, log *lockedBuffer) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within the test's time; meshd log:\n%s", what, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestReadyzFollowsTheBroker: meshd's /readyz is 200 while it has the
// broker, 503 naming why once the broker is cut off, and 200 again when it
// is back; /metrics counts the lost and regained session.
func TestReadyzFollowsTheBroker(t *testing.T) {
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, addr, logs, _ := startMeshd(t, ctx, fmt.Sprintf("node: ready\namqp_url: %s\nreconnect_min: 20ms\nreconnect_max: 200ms",
		strings.Replace(url, brokertest.Host(), proxy.Addr(), 1)))
	eventually(t, ctx, "/readyz 200", func() bool { code, _ := httpGet(addr, "/readyz"); return code == http.StatusOK }, logs)
	proxy.Down()
	eventually(t, ctx, "/readyz 503 with the broker cut off", func() bool {
		code, body := httpGet(addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not connected")
	}, logs)
	if _, body := httpGet(addr, "/metrics"); !strings.Contains(body, `mesh_connected{node="ready"`) || !metric(body, "mesh_disconnects_total", 1) {
		t.Errorf("/metrics with the broker cut off:\n%s", body)
	}
	proxy.Up()
	eventually(t, ctx, "/readyz 200 with the broker back", func() bool { code, _ := httpGet(addr, "/readyz"); return code == http.StatusOK }, logs)
	if _, body := httpGet(addr, "/metrics"); !metric(body, "mesh_reconnects_total", 1) || !metric(body, "mesh_connected", 1) {
		t.Errorf("/metrics with the broker back:\n%s", body)
	}
}

// metric says whether the Prometheus text has a sample of name (with any
// labels) whose value is want.
func metric(text, name string, want float64) bool {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		if f := strings.Fields(line); len(f) >= 2 {
			if _, err := fmt.Sscan(f[len(f)-1], &v); err == nil && v == want {
				return true
			}
		}
	}
	return false
}

// TestFrozenNodeIsUnreachable: a meshd frozen with SIGSTOP stops sending
// heartbeats; another node reports it as node.frozen.unreachable, once,
// and hears it again when it is thawed (SIGCONT).
func TestFrozenNodeIsUnreachable(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const every = 200 * time.Millisecond
	watcher, err := runtime.New(ctx, runtime.Config{Node: "watcher", AMQPURL: url, StateDir: testdir.Reachable(t), HeartbeatInterval: every,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(context.Background())
	reports := brokertest.Tap(t, url, "mesh.events", "node.frozen.unreachable")
	cmd, _, logs, _ := startMeshd(t, ctx, fmt.Sprintf("node: frozen\namqp_url: %s\nheartbeat_interval: %s", url, every))
	peer := func() (runtime.Peer, bool) {
		for _, p := range watcher.Peers() {
			if p.Node == "frozen" {
				return p, true
			}
		}
		return runtime.Peer{}, false
	}
	eventually(t, ctx, "the watcher hears meshd", func() bool { _, ok := peer(); return ok }, logs)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-reports:
		var body struct {
			Node       string `json:"node"`
			ReportedBy string `json:"reported_by"`
		}
		if err := json.Unmarshal(d.Body, &body); err != nil || body.Node != "frozen" || body.ReportedBy != "watcher" {
			t.Errorf("report %s: %v", d.Body, err)
		}
	case <-ctx.Done():
		t.Fatal("no node.frozen.unreachable report")
	}
	if p, _ := peer(); !p.Unreachable {
		t.Error("the watcher does not say frozen is unreachable")
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the watcher hears meshd again", func() bool { p, ok := peer(); return ok && !p.Unreachable }, logs)
	select {
	case d := <-reports:
		t.Errorf("a second report: %s", d.Body)
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd after SIGTERM: %v\n%s", err, logs.String())
	}
}
