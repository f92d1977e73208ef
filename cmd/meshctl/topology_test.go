package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestTopologyPermissions prints the rabbitmqctl commands for a node's
// user, from its config; --node and --user override the config.
func TestTopologyPermissions(t *testing.T) {
	cfg := filepath.Join(testdir.Reachable(t), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(`node: n1
amqp_url: amqp://mesh-n1:secret@127.0.0.1:5672/prod
modules:
  - name: shop
    path: /bin/true
    tools: ["shop.*"]
    calls: ["tax.rate"]
    consumes: ["shop.incoming"]
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
		`n1\.(?:shop)\.(?:events|dead)`, `serve\.(?:shop\.[^.]+|delays\.n1\.[^.]+)`, // its tools, and its delays module's
		"rabbitmqctl set_topic_permissions -p 'prod' 'mesh-n1' 'mesh.events' '^(?:node\\.n1\\..*|node\\.[^.]+\\.unreachable|module\\.(?:shop)\\..*)$' '.*'",
		// It may publish requests only of the tools it may call, and read
		// the queues it may consume.
		"rabbitmqctl set_topic_permissions -p 'prod' 'mesh-n1' 'mesh.rpc' '^(?:tax\\.rate)$' '^(?:shop\\.[^.]+|delays\\.n1\\.[^.]+)$'",
		`shop\.incoming`,
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
	// --json: the same permissions, and the same commands, for machines.
	var p struct {
		Node, User, VHost, Configure, Write, Read string
		Topics                                    []struct{ Exchange, Write, Read string }
		Commands                                  []string
	}
	js := run("topology", "permissions", "--config", cfg, "--json")
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatalf("permissions --json: %v\n%s", err, js)
	}
	text := run("topology", "permissions", "--config", cfg)
	if p.Node != "n1" || p.User != "mesh-n1" || p.VHost != "prod" || len(p.Topics) != 2 || !strings.Contains(p.Configure, `n1\.(?:shop)`) ||
		len(p.Commands) == 0 || !strings.Contains(text, strings.Join(p.Commands, "\n")) {
		t.Errorf("permissions --json: %+v\ntext:\n%s", p, text)
	}
}

// TestTopologyPrintAndCheck: print lists the mesh's objects and the node's
// with their arguments and bindings; check finds a running node's broker
// as declared, then reports a queue declared with another type, a deleted
// exchange, a hand-deleted binding and a binding the mesh did not make,
// and exits 1. Without the management API the bindings are UNCHECKED.
func TestTopologyPrintAndCheck(t *testing.T) {
	url := brokertest.VHost(t)
	state := testdir.Reachable(t)
	cfg := filepath.Join(testdir.Reachable(t), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`node: n1
amqp_url: %s
state_dir: %s
modules:
  - name: shop
    path: /bin/true
  - name: mail
    path: /bin/true
    queue_type: classic
  - name: ledger
    path: /bin/true
    group: books
    partitions: 4
`, url, state)), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		a := app()
		var out bytes.Buffer
		a.Writer, a.ErrWriter = &out, &out
		err := a.Run(interspersed(a, append([]string{"meshctl"}, args...)))
		return out.String(), err
	}
	out, err := run("topology", "print", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exchange  mesh.events", "alternate-exchange=mesh.events.unrouted", "queue     n1.shop.events",
		"x-delivery-limit=", "x-queue-type=quorum", "n1.mail.events", "x-queue-type=classic", "mesh.node.n1.lock",
		`mesh.events.dead "#"`, "the patterns the module subscribes (no binding record here)",
		"exchange  mesh.delay ", "queue     mesh.delay.27", "x-message-ttl=134217728000", "x-dead-letter-strategy=at-least-once",
		"queue     mesh.node.n1.due", `mesh.delay.due "#.n1"`, "exchange  group.books.ledger ", "alternate-exchange=group.books.ledger.intake",
		"queue     group.books.ledger.p003", "x-single-active-consumer=true", "queue     group.books.ledger.intake"} {
		if !strings.Contains(out, want) {
			t.Errorf("print lacks %q:\n%s", want, out)
		}
	}

	// After meshctl groups repartition, the node's record of its group's
	// epoch says the count: print shows the epoch's exchange and
	// partitions, not the entry's.
	changed := filepath.Join(testdir.Reachable(t), "changed")
	if err := os.MkdirAll(filepath.Join(changed, "bindings"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(changed, "bindings", "group.books.ledger.epoch.json"), []byte(`["{\"epoch\":2,\"partitions\":8,\"previous\":4,\"settled\":true}"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg2 := filepath.Join(testdir.Reachable(t), "changed.yaml")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg2, []byte(strings.Replace(string(b), "state_dir: "+state, "state_dir: "+changed, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run("topology", "print", "--config", cfg2)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exchange  group.books.ledger.e2 ", "queue     group.books.ledger.e2p007"} {
		if !strings.Contains(out, want) {
			t.Errorf("print after a change of the count lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "group.books.ledger.p003") {
		t.Errorf("print after a change of the count shows the entry's partitions:\n%s", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "n1", AMQPURL: url, StateDir: state, Delays: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	for _, m := range []struct {
		name string
		mc   runtime.ModuleConfig
	}{{"shop", runtime.ModuleConfig{}}, {"mail", runtime.ModuleConfig{QueueType: runtime.QueueClassic}}, {"ledger", runtime.ModuleConfig{Group: "books", Partitions: 4}}} {
		if _, err := n.Load(ctx, sdk.Module{Name: m.name, Setup: func(s sdk.Mesh) error {
			return s.On("mesh.topo.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
		}}, m.mc); err != nil {
			t.Fatal(err)
		}
	}
	out, err = run("topology", "print", "--config", cfg)
	if err != nil || !strings.Contains(out, `mesh.events "mesh.topo.#"`) {
		t.Errorf("print with the node's binding record: %v\n%s", err, out)
	}
	out, err = run("topology", "check", "--config", cfg)
	if err != nil {
		t.Fatalf("check of a node's own broker: %v\n%s", err, out)
	}
	// By default: no ok line, one summary.
	if strings.Contains(out, "ok ") || !regexp.MustCompile(`(?m)^checked [0-9]+ exchanges, [0-9]+ queues and [0-9]+ bindings of node n1: all as declared \(--all lists every one\)$`).MatchString(out) {
		t.Errorf("check without --all printed:\n%s", out)
	}
	// The test broker accepts guest/guest, and the node logs in as guest:
	// warned of, no difference.
	for _, want := range []string{"WARNING   user guest: the broker at " + brokertest.Host() + " accepts guest/guest from this host: any local process can publish as any node and module",
		"WARNING   user guest: this node logs in to the broker at " + brokertest.Host() + " as guest"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
	out, err = run("topology", "check", "--config", cfg, "--all")
	if err != nil {
		t.Fatalf("check --all of a node's own broker: %v\n%s", err, out)
	}
	for _, want := range []string{"ok        queue mesh.node.n1.lock: held by a running node",
		`ok        binding mesh.events "mesh.topo.#" -> n1.shop.events`, `ok        binding mesh.events "mesh.topo.#" -> n1.mail.events`,
		`ok        binding mesh.events.dead "#" -> mesh.dead-letters`, `ok        binding mesh.events.unrouted "" -> mesh.unrouted`,
		`ok        queue mesh.delay.00`, `ok        binding mesh.delay "1.#" -> mesh.delay.27`, `ok        binding mesh.delay.01 "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.1.#" -> mesh.delay.00`, `ok        binding mesh.delay.due "#.n1" -> mesh.node.n1.due`} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "DIFFERS") || strings.Contains(out, "MISSING") || strings.Contains(out, "UNCHECKED") {
		t.Errorf("check printed:\n%s", out)
	}
	// No management API there: the objects are checked, the bindings
	// said UNCHECKED, and that is no difference.
	out, err = run("topology", "check", "--config", cfg, "--management-url", "http://127.0.0.1:1")
	if err != nil || !strings.Contains(out, "UNCHECKED binding (all): the management API does not answer at http://127.0.0.1:1") ||
		!strings.Contains(out, "no differences, but 1 UNCHECKED") {
		t.Errorf("check without the management API: %v\n%s", err, out)
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
	// By hand: a binding deleted, one added, one of the mesh's deleted.
	if err := ch.QueueUnbind("n1.shop.events", "mesh.topo.#", "mesh.events", nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("n1.mail.events", "stray.#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueUnbind("mesh.dead-letters", "#", "mesh.events.dead", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete("mesh.delay.05", false, false, false); err != nil {
		t.Fatal(err)
	}
	out, err = run("topology", "check", "--config", cfg, "--all")
	if err == nil || !strings.Contains(err.Error(), "6 differences") || !strings.Contains(out, ": 6 differ from what the node declares (above)") {
		t.Errorf("check of a broken topology: %v\n%s", err, out)
	}
	for _, want := range []string{"MISSING   exchange mesh.rpc", "DIFFERS   queue n1.shop.dead: PRECONDITION_FAILED",
		`MISSING   binding mesh.events "mesh.topo.#" -> n1.shop.events`, `EXTRA     binding mesh.events "stray.#" -> n1.mail.events`,
		`ok        binding mesh.events "mesh.topo.#" -> n1.mail.events`, `MISSING   binding mesh.events.dead "#" -> mesh.dead-letters`,
		"MISSING   queue mesh.delay.05"} {
		if !strings.Contains(out, want) {
			t.Errorf("check lacks %q:\n%s", want, out)
		}
	}
	// --json: one object per finding, the same findings.
	out, _ = run("topology", "check", "--config", cfg, "--json")
	var missing int
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var fd struct{ Verdict, Kind, Name, Detail string }
		if err := json.Unmarshal([]byte(line), &fd); err != nil {
			t.Fatalf("check --json line %q: %v", line, err)
		}
		if fd.Verdict == "MISSING" && fd.Kind == "binding" {
			missing++
		}
	}
	if missing != 2 {
		t.Errorf("check --json: %d missing bindings, want 2:\n%s", missing, out)
	}
}
