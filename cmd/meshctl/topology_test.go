package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
