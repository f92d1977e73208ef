package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestTopologyPermissions prints the rabbitmqctl commands for a node's
// user, from its config; --node and --user override the config.
func TestTopologyPermissions(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(`node: n1
amqp_url: amqp://mesh-n1:secret@127.0.0.1:5672/prod
modules:
  - name: shop
    path: /bin/true
    tools: ["shop.*"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		a := app()
		var out bytes.Buffer
		a.Writer = &out
		if err := a.Run(interspersed(a, append([]string{"meshctl"}, args...))); err != nil {
			t.Fatalf("meshctl %v: %v", args, err)
		}
		return out.String()
	}
	out := run("topology", "permissions", "--config", cfg)
	for _, want := range []string{
		"rabbitmqctl set_permissions -p 'prod' 'mesh-n1' '^(?:mesh\\.events|",
		`n1\.(?:shop)\.(?:events|dead)`, `serve\.(?:shop\.[^.]+)`,
		"rabbitmqctl set_topic_permissions -p 'prod' 'mesh-n1' 'mesh.events' '^(?:node\\.n1\\..*|node\\.[^.]+\\.unreachable|module\\.(?:shop)\\..*)$' '.*'",
		"rabbitmqctl set_topic_permissions -p 'prod' 'mesh-n1' 'mesh.rpc' '.*' '^(?:shop\\.[^.]+)$'",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret") {
		t.Errorf("the output shows the password:\n%s", out)
	}
	out = run("topology", "permissions", "--config", cfg, "--node", "n2", "--user", "ops", "--consumes", "shop.orders")
	if !strings.Contains(out, "'ops'") || !strings.Contains(out, `n2\.(?:shop)`) || !strings.Contains(out, `shop\.orders`) {
		t.Errorf("--node, --user and --consumes not applied:\n%s", out)
	}
}

// TestTopologyPrintAndCheck: print lists the mesh's objects and the node's
// with their arguments; check finds a running node's broker as declared,
// then reports a queue declared with another type and a deleted exchange,
// and exits 1.
func TestTopologyPrintAndCheck(t *testing.T) {
	url := brokertest.VHost(t)
	cfg := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`node: n1
amqp_url: %s
modules:
  - name: shop
    path: /bin/true
  - name: mail
    path: /bin/true
    queue_type: classic
`, url)), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		a := app()
		var out bytes.Buffer
		a.Writer = &out
		err := a.Run(interspersed(a, append([]string{"meshctl"}, args...)))
		return out.String(), err
	}
	out, err := run("topology", "print", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exchange  mesh.events", "alternate-exchange=mesh.events.unrouted", "queue     n1.shop.events",
		"x-delivery-limit=", "x-queue-type=quorum", "n1.mail.events", "x-queue-type=classic", "mesh.node.n1.lock"} {
		if !strings.Contains(out, want) {
			t.Errorf("print lacks %q:\n%s", want, out)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "n1", AMQPURL: url, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	for _, m := range []struct {
		name string
		mc   runtime.ModuleConfig
	}{{"shop", runtime.ModuleConfig{}}, {"mail", runtime.ModuleConfig{QueueType: runtime.QueueClassic}}} {
		if _, err := n.Load(ctx, sdk.Module{Name: m.name, Setup: func(s sdk.Mesh) error {
			return s.On("mesh.topo.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
		}}, m.mc); err != nil {
			t.Fatal(err)
		}
	}
	out, err = run("topology", "check", "--config", cfg)
	if err != nil {
		t.Fatalf("check of a node's own broker: %v\n%s", err, out)
	}
	if !strings.Contains(out, "ok       queue mesh.node.n1.lock: held by a running node") || strings.Contains(out, "DIFFERS") {
		t.Errorf("check printed:\n%s", out)
	}

	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ch, err := raw.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete("mesh.rpc", false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete("n1.shop.dead", false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("n1.shop.dead", true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	out, err = run("topology", "check", "--config", cfg)
	if err == nil || !strings.Contains(err.Error(), "2 of") {
		t.Errorf("check of a broken topology: %v\n%s", err, out)
	}
	if !strings.Contains(out, "MISSING  exchange mesh.rpc") || !strings.Contains(out, "DIFFERS  queue n1.shop.dead: PRECONDITION_FAILED") {
		t.Errorf("check printed:\n%s", out)
	}
}
