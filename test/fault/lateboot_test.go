//go:build fault

package fault

import (
	"context"
	"fmt"
	"io"
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

// TestBrokerAfterTheNode: the broker application is stopped when meshd
// and an in-process node start. Both start anyway: meshd answers /healthz,
// /readyz says not ready, the node spools what is emitted. When the broker
// starts, both connect: meshd's module process serves its tool, /readyz
// says ready, and every event emitted before the broker came up is
// handled once. Lost 0.
func TestBrokerAfterTheNode(t *testing.T) {
	url := brokertest.VHost(t)
	ensureBrokerRuns(t)
	dir := testdir.Reachable(t)
	meshd, module := filepath.Join(dir, "meshd"), filepath.Join(dir, "echomodule")
	for _, b := range []struct{ out, pkg string }{{meshd, "../../cmd/meshd"}, {module, "../../runtime/testdata/echomodule"}} {
		if out, err := exec.Command("go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	httpAddr := freeport.Addr(t) // meshd listens on it
	config := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`node: lateboot
amqp_url: %s
state_dir: %s
http_addr: %s
reconnect_max: 500ms
modules:
  - name: echo
    path: %s
    tools: [echo.upper]
`, url, filepath.Join(dir, "state"), httpAddr, module)), 0o600); err != nil {
		t.Fatal(err)
	}

	rabbitmqctl(t, "stop_app")
	logPath := filepath.Join(dir, "meshd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(meshd, "run", "--config", config)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	dump := func() string { out, _ := os.ReadFile(logPath); return string(out) }
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if !waitFor(time.Minute, func() bool { code, _ := get("/healthz"); return code == http.StatusOK }) {
		select {
		case err := <-exited:
			t.Fatalf("meshd exited with the broker away: %v\n%s", err, dump())
		default:
		}
		t.Fatalf("meshd never answered /healthz with the broker away\n%s", dump())
	}
	// /healthz answers as soon as meshd runs; its modules are still
	// starting (each module process's start, mutual TLS included), which
	// /readyz says first. Once they are, it names the broker.
	var code int
	var body string
	waitFor(time.Minute, func() bool {
		code, body = get("/readyz")
		return !strings.Contains(body, "loading the modules")
	})
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not connected") {
		t.Errorf("/readyz with the broker away: %d %q", code, body)
	}

	n := newNode(t, url, "early", func(c *runtime.Config) { c.StartWithoutBroker = true })
	if n.Connected() {
		t.Fatal("the node is connected to a stopped broker")
	}
	handled := newIDSet()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := n.Load(ctx, sinkModule(handled), runtime.ModuleConfig{Prefetch: 64, Concurrency: 4})
	if err != nil {
		t.Fatalf("load with the broker away: %v", err)
	}
	confirmed := newIDSet()
	const early = 200
	for i := range early {
		id, err := m.Mesh().Emit(ctx, "tick", map[string]int{"i": i})
		if err != nil {
			t.Fatalf("emit with the broker away: %v", err)
		}
		confirmed.add(id)
	}
	spooled := n.Stats().SpoolEvents

	rabbitmqctl(t, "start_app")
	waitBroker(t)
	if !waitFor(2*time.Minute, func() bool { return handled.len() >= early }) {
		t.Errorf("%d of %d events emitted before the broker came up were handled", handled.len(), early)
	}
	if !waitFor(time.Minute, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }) {
		code, body := get("/readyz")
		t.Errorf("/readyz after the broker came up: %d %q\n%s", code, body, dump())
	}
	var got string
	if err := n.Call(ctx, "test", "echo.upper", "late", &got); err != nil || !strings.HasPrefix(got, "LATE") {
		t.Errorf("meshd's module after the late broker: %q, %v\n%s", got, err, dump())
	}
	select {
	case err := <-exited:
		t.Fatalf("meshd exited: %v\n%s", err, dump())
	default:
	}
	st := n.Stats()
	if handled.overOnce() > 0 {
		t.Errorf("%d events reached the handler more than once", handled.overOnce())
	}
	summary{
		emitted: early, confirmed: confirmed.len(), handled: handled.len(), duplicates: int(st.Duplicates),
		deadLettered: int(st.DeadLettered), lost: confirmed.missingFrom(handled),
		extra: fmt.Sprintf("spooled before the broker came up=%d resent=%d reconnects=%d", spooled, st.Resent, st.Reconnects),
	}.report(t)
}
