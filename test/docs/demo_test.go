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
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
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
