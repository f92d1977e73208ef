package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// buildExample builds an example module into dir, with ldflags.
func buildExample(t *testing.T, dir, name, ldflags string) string {
	t.Helper()
	bin := filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "../../examples/modules/"+name).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return bin
}

// stale is the ldflags of a module binary of a protocol no meshd of this
// release serves.
const stale = "-X github.com/meshkit/mesh/internal/plugin.protocolVersion=99"

// TestAStaleModuleNeverStopsTheNode: a module binary of a protocol outside
// meshd's window beside a good one: meshd runs, the good module serves,
// /readyz is 503 naming the stale one and why, node.NODE.module.failed says
// so on the wire and the metric counts it; once its binary is replaced, the
// next try starts it (node.NODE.module.started), /readyz is 200 and its
// queue has its consumer. With required: true on its entry, meshd exits
// instead, naming it.
func TestAStaleModuleNeverStopsTheNode(t *testing.T) {
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	tax := buildExample(t, dir, "tax", "")
	notifier := buildExample(t, dir, "notifier", stale)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
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
	if err := ch.QueueBind(q.Name, "node.anchor.module.*", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	reports, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func(queue string) int {
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		q, err := c.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return q.Consumers
	}

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	config := fmt.Sprintf("node: anchor\namqp_url: %s\nmodules:\n  - name: tax\n    kind: agent\n    path: %s\n    tools: [\"tax.rate\"]\n  - name: notifier\n    path: %s\n    calls: [\"invoice.*\"]", url, tax, notifier)
	cmd, addr, logs, _ := startMeshd(t, ctx, config)
	// next is the next report of the notifier's (the runtime announces the
	// others' node.anchor.module.started).
	next := func(want string) map[string]any {
		t.Helper()
		for {
			select {
			case d := <-reports:
				var body map[string]any
				if err := json.Unmarshal(d.Body, &body); err != nil {
					t.Fatalf("%s: %s: %v", d.RoutingKey, d.Body, err)
				}
				if body["module"] != "notifier" {
					continue
				}
				if d.RoutingKey != want {
					t.Fatalf("got %s %s, want %s", d.RoutingKey, d.Body, want)
				}
				return body
			case <-ctx.Done():
				t.Fatalf("no %s; meshd log:\n%s", want, logs.String())
				return nil
			}
		}
	}
	failed := next("node.anchor.module.failed")
	if failed["module"] != "notifier" || !strings.Contains(fmt.Sprint(failed["error"]), "module protocol 99") || failed["attempt"] != float64(1) {
		t.Errorf("node.anchor.module.failed: %v", failed)
	}
	eventually(t, ctx, "the good module serving", func() bool { return consumers("serve.tax.rate") == 1 }, logs)
	// The tax tool's consumer can be up before meshd's loading of the
	// modules ends: /readyz says "loading the modules" until it has.
	var code int
	var body string
	eventually(t, ctx, "meshd done loading the modules", func() bool {
		code, body = httpGet(addr, "/readyz")
		return !strings.Contains(body, "loading the modules")
	}, logs)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "notifier") || !strings.Contains(body, "module protocol 99") || !strings.Contains(body, "upgrade meshd") {
		t.Errorf("/readyz with a stale module: %d %s", code, body)
	}
	if _, body := httpGet(addr, "/metrics"); !strings.Contains(body, `mesh_modules_start_failures_total{module="notifier"`) || !strings.Contains(body, "mesh_modules_not_running{") {
		t.Errorf("/metrics lacks the module's failures:\n%s", body)
	}
	if !strings.Contains(logs.String(), "a module did not start; the node runs without it") {
		t.Errorf("the log does not say the module did not start:\n%s", logs.String())
	}

	// The operator replaces the binary (as a package upgrade does: a new
	// file renamed over the old); the next try starts it.
	fixed := buildExample(t, t.TempDir(), "notifier", "")
	b, err := os.ReadFile(fixed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notifier+".new", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(notifier+".new", notifier); err != nil {
		t.Fatal(err)
	}
	// It may fail once more before the rename is seen: the first report
	// after it that is not a failure is the start.
	for {
		select {
		case d := <-reports:
			var body map[string]any
			if json.Unmarshal(d.Body, &body) != nil || body["module"] != "notifier" || d.RoutingKey == "node.anchor.module.failed" {
				continue
			}
			if d.RoutingKey != "node.anchor.module.started" {
				t.Fatalf("got %s %s, want node.anchor.module.started", d.RoutingKey, d.Body)
			}
		case <-ctx.Done():
			t.Fatalf("the replaced module never started; meshd log:\n%s", logs.String())
		}
		break
	}
	eventually(t, ctx, "/readyz 200", func() bool { code, _ := httpGet(addr, "/readyz"); return code == http.StatusOK }, logs)
	if n := consumers("anchor.notifier.events"); n != 1 {
		t.Errorf("%d consumers on the recovered module's queue, want 1", n)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exit: %v\n%s", err, logs.String())
	}

	// required: true keeps fail-fast.
	notifier = buildExample(t, dir, "notifier", stale)
	cmd, _, logs, _ = startMeshd(t, ctx, strings.Replace(config, "  - name: notifier\n", "  - name: notifier\n    required: true\n", 1))
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(logs.String(), "module notifier (required: true) did not start") || !strings.Contains(logs.String(), "module protocol 99") {
		t.Errorf("meshd with a required stale module: %v, want exit 1 naming it\n%s", err, logs.String())
	}
}
