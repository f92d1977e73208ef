//go:build linux

package docs_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// TestDemoInAVirtualHostOfItsOwn runs make demo's script with MESH_AMQP_URL
// naming a fresh virtual host: everything it makes, the outside system's
// queue shop.orders too, is made there, nothing in the broker's default
// virtual host, and the demo ends with meshd stopped cleanly.
func TestDemoInAVirtualHostOfItsOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo against the broker")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	amqpURL := brokertest.VHost(t)
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	hadOrders := slices.Contains(queues(t, "/"), "shop.orders")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "demo.sh"))
	cmd.Dir = root
	graphFile := filepath.Join(t.TempDir(), "graph.mmd")
	cmd.Env = append(withoutMesh(os.Environ()), "MESH_AMQP_URL="+amqpURL, "DEMO_SECONDS=4", "DEMO_GRAPH_FILE="+graphFile)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make demo in virtual host %s: %v\n%s", vhost, err, out)
	}
	for _, want := range []string{"== building meshd", "meshd stopped cleanly (exit 0)", "make demo-live"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	if !slices.Contains(queues(t, vhost), "shop.orders") {
		t.Errorf("shop.orders was not made in the demo's virtual host %s", vhost)
	}
	if !hadOrders && slices.Contains(queues(t, "/"), "shop.orders") {
		t.Errorf("the demo in virtual host %s made shop.orders in the default virtual host /", vhost)
	}
	checkREADMEGraph(t, root, graphFile)
	checkDemoNodeGone(t, root, amqpURL, vhost)
}

// checkDemoNodeGone: after the demo, a live node of the same mesh keeps
// sending heartbeats, and nothing piles up for the demo node, which is
// gone: its queues (the audit logger's, bound to "#") do not grow, and
// nothing new reaches mesh.dead-letters (a heartbeat that expired in them
// was dead-lettered there, every interval). The live node is the meshd
// the demo built; five of its heartbeats, seen on a tap, are the sign
// that time passed. A heartbeat carries no TTL (ADR 19, amended).
func checkDemoNodeGone(t *testing.T, root, amqpURL, vhost string) {
	t.Helper()
	before := depths(t, amqpURL, vhost)
	dir := t.TempDir()
	config := filepath.Join(dir, "mesh.yaml")
	yaml := "node: live\namqp_url: " + amqpURL + "\nstate_dir: " + filepath.Join(dir, "state") + "\nheartbeat_interval: 200ms\nmodules: []\n"
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	beats := brokertest.Tap(t, amqpURL, wire.ExchangeEvents, "node.live.heartbeat")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live := exec.CommandContext(ctx, filepath.Join(root, "bin", "meshd"), "run", "--config", config, "--log-level", "error", "--http-addr", "127.0.0.1:0")
	live.Env = withoutMesh(os.Environ())
	var liveLog strings.Builder
	live.Stdout, live.Stderr = &liveLog, &liveLog
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = live.Process.Signal(syscall.SIGTERM)
		_ = live.Wait()
	}()
	for i := range 5 {
		select {
		case d := <-beats:
			if d.Expiration != "" {
				t.Errorf("heartbeat %d carries a TTL (expiration %s ms): one that expires in a stopped node's queue is dead-lettered", i+1, d.Expiration)
			}
		case <-ctx.Done():
			t.Fatalf("the live node sent no heartbeat:\n%s", liveLog.String())
		}
	}
	after := depths(t, amqpURL, vhost)
	for q, n := range after {
		if n > before[q] {
			t.Errorf("queue %s of the demo's mesh grew from %d to %d messages while the demo node was gone and the live node sent five heartbeats", q, before[q], n)
		}
	}
}

// nodeQueueOf says whether queue is one of node's: its modules' and its
// due queue.
func nodeQueueOf(node, queue string) bool {
	return strings.HasPrefix(queue, node+".") || queue == "mesh.node."+node+".due"
}

// depths are the message counts of the demo node's queues and of
// mesh.dead-letters, by name: listed
// by rabbitmqctl, counted by a passive declare (the declare-ok's count is
// the queue's own now; rabbitmqctl's statistics lag by seconds).
func depths(t *testing.T, amqpURL, vhost string) map[string]int {
	t.Helper()
	ch := brokertest.Channel(t, amqpURL)
	defer ch.Close()
	m := map[string]int{}
	for _, name := range queues(t, vhost) {
		if name != wire.QueueDead && !nodeQueueOf("demo", name) {
			continue // the others' (exclusive ones too) are not the demo node's
		}
		q, err := ch.QueueDeclarePassive(name, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue %s: %v", name, err)
		}
		m[name] = q.Messages
	}
	return m
}

// queues lists the queues of vhost by name.
func queues(t *testing.T, vhost string) []string {
	t.Helper()
	out, err := brokertest.CtlOutput("list_queues", "-p", vhost, "--no-table-headers", "name")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))
}

// withoutMesh is env less its MESH_* variables.
func withoutMesh(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "MESH_") })
}

// readmeGraph is the README's picture of the demo's mesh: the Mermaid
// block after its marker.
var readmeGraph = regexp.MustCompile("(?s)(<!-- graph: [^\n]*-->\n```mermaid\n)(.*?)(```)")

// checkREADMEGraph compares the README's picture of the demo's mesh with
// what meshctl graph drew of it (graphFile); MESH_UPDATE_README=1 writes
// the drawing into the README instead.
func checkREADMEGraph(t *testing.T, root, graphFile string) {
	t.Helper()
	drawn, err := os.ReadFile(graphFile)
	if err != nil || !strings.HasPrefix(string(drawn), "flowchart") {
		t.Fatalf("the demo's graph: %v %q", err, drawn)
	}
	path := filepath.Join(root, "README.md")
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := readmeGraph.FindSubmatchIndex(readme)
	if m == nil {
		t.Fatal("the README has no graph block (<!-- graph: ... --> then a mermaid block)")
	}
	current := string(readme[m[4]:m[5]])
	if current == string(drawn) {
		return
	}
	if os.Getenv("MESH_UPDATE_README") != "" {
		updated := string(readme[:m[4]]) + string(drawn) + string(readme[m[5]:])
		if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("README.md's graph rewritten from the demo")
		return
	}
	t.Errorf("README.md's graph is not what meshctl graph draws of the demo (MESH_UPDATE_README=1 go test -run TestDemoInAVirtualHostOfItsOwn ./test/docs rewrites it); it draws:\n%s", drawn)
}
