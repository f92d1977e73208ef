//go:build linux

package docs_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	cmd.Env = append(withoutMesh(os.Environ()), "MESH_AMQP_URL="+amqpURL, "DEMO_SECONDS=4")
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
