package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
)

// TestRunAnnouncesAndStopsOnSIGTERM builds meshd, runs it against a fresh
// virtual host, and checks it announces the node, and on SIGTERM announces
// its leaving and exits 0.
func TestRunAnnouncesAndStopsOnSIGTERM(t *testing.T) {
	url := brokertest.VHost(t)
	bin := filepath.Join(testdir.Reachable(t), "meshd")
	// The commit as the Makefile stamps it where the go command stamps none.
	const commit = "0123456789ab"
	if out, err := exec.Command("go", "build", "-ldflags", "-X github.com/meshkit/mesh/internal/version.commit="+commit, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// meshd version: the release, the commit and the protocols it serves.
	out, err := exec.Command(bin, "version", "--json").Output()
	var build runtime.BuildInfo
	if err != nil || json.Unmarshal(out, &build) != nil || build.Release != runtime.Build().Release || build.ModuleProtocols != runtime.Build().ModuleProtocols ||
		(build.Commit != commit && !strings.HasPrefix(build.Commit, runtime.Build().Commit)) {
		t.Errorf("meshd version --json: %s %v, want release %s", out, err, runtime.Build().Release)
	}
	if out, err := exec.Command(bin, "--version").Output(); err != nil || !strings.Contains(string(out), runtime.Build().Release+" (") || !strings.Contains(string(out), "module protocols "+runtime.Build().ModuleProtocols.String()) {
		t.Errorf("meshd --version: %q %v", out, err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The topology may not exist yet: declare the exchange as meshd does.
	if err := ch.ExchangeDeclare("mesh.events.unrouted", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("mesh.events", "topic", true, false, false, false, amqp.Table{"alternate-exchange": "mesh.events.unrouted"}); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "node.#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	httpAddr := freeport.Addr(t) // meshd listens on it
	cmd := exec.CommandContext(ctx, bin, "run")
	cmd.Env = append(os.Environ(), "MESH_NODE=anchor", "MESH_AMQP_URL="+url, "MESH_STATE_DIR="+testdir.Reachable(t), "MESH_HTTP_ADDR="+httpAddr)
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	next := func(want string) {
		t.Helper()
		for {
			select {
			case d := <-deliveries:
				if d.RoutingKey == "node.anchor.heartbeat" {
					// Membership: the node tells the mesh it runs, and which
					// release and module protocols.
					var hb runtime.Heartbeat
					if err := json.Unmarshal(d.Body, &hb); err != nil || hb.Release != build.Release || hb.ModuleProtocols == nil || *hb.ModuleProtocols != build.ModuleProtocols {
						t.Errorf("heartbeat %s: %v, want release %s", d.Body, err, build.Release)
					}
					continue
				}
				if d.RoutingKey != want {
					t.Errorf("got %s, want %s", d.RoutingKey, want)
				}
				return
			case <-ctx.Done():
				t.Fatalf("no %s event; meshd log:\n%s", want, logs.String())
			}
		}
	}
	next("node.anchor.joined")
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %s", path, resp.Status)
		}
		if path != "/metrics" {
			continue
		}
		// OpenTelemetry's metrics, for Prometheus, labelled with the node.
		for _, want := range []string{"# TYPE mesh_connected gauge", `mesh_connected{node="anchor"`, "} 1\n",
			"# TYPE mesh_publish_confirmed_total counter", "go_goroutines", "process_resident_memory_bytes",
			// Which release each node runs, for an upgrade's dashboard.
			"# TYPE mesh_build_info gauge", `mesh_build_info{commit="` + build.Commit + `",goversion="` + build.GoVersion + `",module_protocol_max="` + fmt.Sprint(build.ModuleProtocols.Max) + `",module_protocol_min="` + fmt.Sprint(build.ModuleProtocols.Min) + `",node="anchor",release="` + build.Release + `"} 1`} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next("node.anchor.left")
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exited with %v; log:\n%s", err, logs.String())
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("the broker password is in the log:\n%s", logs.String())
	}
	// The test broker accepts guest/guest, and the node logs in as guest:
	// meshd says both at start.
	for _, want := range []string{"accepts guest/guest from this host", "this node logs in to the broker at " + brokertest.Host() + " as guest"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("meshd's log does not say %q:\n%s", want, logs.String())
		}
	}
}

func TestRunRequiresANode(t *testing.T) {
	t.Setenv("MESH_NODE", "")
	if err := app().Run([]string{"meshd", "run"}); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("run without a node: %v", err)
	}
	if err := app().Run([]string{"meshd", "run", "--node", "a.b", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("run with a dotted node name: %v", err)
	}
}

// TestRunModulesFromConfig runs meshd with a config file that loads a module
// binary: an event reaches the module process, what it emits carries the
// host's source and node, and SIGTERM stops everything with exit 0.
func TestRunModulesFromConfig(t *testing.T) {
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	meshd, module := buildMeshdAndEcho(t, dir)
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
node: anchor
amqp_url: %s
state_dir: %s
grace: 5s
defaults:
  max_attempts: 3
modules:
  - name: echo
    path: %s
    prefetch: 8
    tools: ["echo.*"]
`, url, filepath.Join(dir, "state"), module)), 0o600); err != nil {
		t.Fatal(err)
	}

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshd, "run", "--config", cfg)
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	// Wait until the module's queue is consumed, then ping it.
	for {
		q, err := ch.QueueDeclarePassive("anchor.echo.events", true, false, false, false, nil)
		if err == nil && q.Consumers > 0 {
			break
		}
		if err != nil {
			if ch, err = conn.Channel(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the module never consumed; meshd log:\n%s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "module.echo.#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	pongs, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := ulid.Make().String()
	if err := ch.PublishWithContext(ctx, "mesh.events", "mesh.test.ping", false, false, amqp.Publishing{
		Headers: amqp.Table{"x-event-id": id, "x-source": "test", "x-node": "test",
			"x-time": time.Now().UTC().Format(time.RFC3339)},
		ContentType: "application/json", Body: []byte(`{"do":"pong"}`),
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-pongs:
		if d.RoutingKey != "module.echo.pong" || d.Headers["x-source"] != "echo" || d.Headers["x-node"] != "anchor" || d.Headers["x-causation-id"] != id {
			t.Errorf("pong %s %v", d.RoutingKey, d.Headers)
		}
	case <-ctx.Done():
		t.Fatalf("no pong; meshd log:\n%s", logs.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exited with %v; log:\n%s", err, logs.String())
	}

	// SIGTERM in the middle of a stream: meshd exits 0, and once it runs
	// again every event has been handled; none is lost.
	const total = 200
	run := func() (*exec.Cmd, *lockedBuffer) {
		cmd := exec.CommandContext(ctx, meshd, "run", "--config", cfg)
		logs := &lockedBuffer{}
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, logs
	}
	cmd, logs2 := run()
	defer cmd.Process.Kill()
	seen := make(map[string]bool)
	next := func() {
		select {
		case d := <-pongs:
			var body struct{ Ping string }
			_ = json.Unmarshal(d.Body, &body)
			seen[body.Ping] = true
		case <-ctx.Done():
			t.Fatalf("only %d of %d pongs; meshd log:\n%s", len(seen), total, logs2.String())
		}
	}
	for i := range total {
		if err := ch.PublishWithContext(ctx, "mesh.events", "mesh.test.ping", false, false, amqp.Publishing{
			Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "test", "x-node": "test",
				"x-time": time.Now().UTC().Format(time.RFC3339)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"do":"pong"}`),
		}); err != nil {
			t.Fatal(err)
		}
		if i == total/4 {
			next() // the module is handling the stream
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd stopped mid-stream exited with %v; log:\n%s", err, logs2.String())
	}
	cmd, logs2 = run()
	defer cmd.Process.Kill()
	for len(seen) < total {
		next()
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exited with %v", err)
	}

	// meshd killed with SIGKILL: its module process notices and exits
	// instead of living on as an orphan.
	cmd, logs2 = run()
	var child int
	for child == 0 {
		out, _ := exec.Command("pgrep", "-P", fmt.Sprint(cmd.Process.Pid)).Output()
		fmt.Sscan(string(out), &child)
		select {
		case <-ctx.Done():
			t.Fatalf("meshd started no module process; log:\n%s", logs2.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for alive(child) {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatal("the module process outlived meshd")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// buildMeshdAndEcho builds meshd and the runtime's echo module binary
// into dir and returns their paths.
func buildMeshdAndEcho(t *testing.T, dir string) (meshd, module string) {
	t.Helper()
	meshd, module = filepath.Join(dir, "meshd"), filepath.Join(dir, "echomodule")
	for _, b := range []struct{ out, pkg string }{{meshd, "."}, {module, "../../runtime/testdata/echomodule"}} {
		if out, err := exec.Command("go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return meshd, module
}

// alive reports whether pid runs (a zombie nobody reaped has exited).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// TestConfigErrorsNameTheFields: a bad config file is refused with one
// error per broken field.
func TestConfigErrorsNameTheFields(t *testing.T) {
	dir := testdir.Reachable(t)
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(`
node: "bad node"
modules:
  - name: a.b
    path: /nonexistent/module
  - name: ok
    path: ""
    queue_type: stream
    prefetch: -1
  - name: dispatcher
    kind: dispatcher
    path: /nonexistent/dispatcher
    handler_timeout: 20s
    config:
      triggers:
        - name: slow
          timeout: 1m
defaults:
  config: {shared: true}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MESH_NODE", "")
	err := app().Run([]string{"meshd", "run", "--config", cfg})
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"node:", "modules[0].name:", "modules[0].path:", "modules[1].path: is empty", "modules[1]: queue_type:", "prefetch:",
		"modules[2].config.triggers[0].timeout: 1m0s is longer than the module's handler_timeout 20s", "defaults: name, path, args, user and config"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if err := os.WriteFile(cfg, []byte("node: anchor\nnodes: typo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := app().Run([]string{"meshd", "run", "--config", cfg}); err == nil || !strings.Contains(err.Error(), "nodes") {
		t.Errorf("unknown field: %v", err)
	}
	// Flags override the file.
	if err := os.WriteFile(cfg, []byte("node: \"bad node\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// (A broker that does not answer is waited for; one that refuses the
	// credentials fails the start.)
	err = app().Run([]string{"meshd", "run", "--config", cfg, "--node", "anchor", "--amqp-url", "amqp://guest:wrong@" + brokertest.Host() + "/"})
	if err == nil || strings.Contains(err.Error(), "node:") || !strings.Contains(err.Error(), "connect") {
		t.Errorf("--node did not override the file's node: %v", err)
	}
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
