package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestMeshGraph: the graph joins emitters to subscribers through the event
// types their patterns match, callers to servers through tools, consumed
// queues, dead letters and the history to their modules; a pattern nothing declared
// matches is drawn dashed. Mermaid and DOT say the same.
func TestMeshGraph(t *testing.T) {
	beats := []runtime.Heartbeat{
		{Node: "n2", Modules: []runtime.ModuleSummary{
			{Name: "billing", Patterns: []string{"module.shop.order.*", "module.crm.#"}, Tools: []string{"billing.charge"}, DeadLetters: true},
		}},
		{Node: "n1", Modules: []runtime.ModuleSummary{
			{Name: "shop", Emits: []string{"module.shop.order.created"}, Calls: []string{"billing.charge"}},
			{Name: "dispatcher", Kind: "dispatcher", Consumes: []string{"shop.orders"}},
			{Name: "audit-logger", History: true},
		}},
	}
	g := meshGraph(beats)
	var m, d bytes.Buffer
	if err := g.mermaid(&m); err != nil {
		t.Fatal(err)
	}
	if err := g.dot(&d); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"flowchart LR",
		`module_n1_shop["n1/shop"]`, `event_module_shop_order_created(["module.shop.order.created"])`,
		`module_n1_shop --> event_module_shop_order_created`,
		`event_module_shop_order_created -->|"module.shop.order.*"| module_n2_billing`,
		`pattern_module_crm__ -.-> module_n2_billing`,
		`module_n1_shop -->|"calls"| tool_billing_charge`, `tool_billing_charge -->|"serves"| module_n2_billing`,
		`queue_shop_orders[("shop.orders")]`, `queue_shop_orders --> module_n1_dispatcher__dispatcher_`,
		`queue_mesh_dead_letters -->|"dead letters"| module_n2_billing`,
		`event_module_shop_order_created -->|"history"| module_n1_audit_logger`,
	} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("mermaid lacks %q:\n%s", want, m.String())
		}
	}
	for _, want := range []string{
		"digraph mesh {", `"module_n1_shop" -> "event_module_shop_order_created";`,
		`"event_module_shop_order_created" -> "module_n2_billing" [label="module.shop.order.*"];`,
		`"pattern_module_crm__" [label="module.crm.#", shape=parallelogram, style=dashed];`,
		`"tool_billing_charge" [label="billing.charge", shape=hexagon];`,
	} {
		if !strings.Contains(d.String(), want) {
			t.Errorf("dot lacks %q:\n%s", want, d.String())
		}
	}
	// JSON: the same vertices and edges, for machines.
	var j bytes.Buffer
	if err := g.json(&j); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Vertices []struct{ ID, Kind, Label string }
		Edges    []struct {
			From, To, Label string
			Dashed          bool
		}
	}
	if err := json.Unmarshal(j.Bytes(), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, j.String())
	}
	if len(got.Vertices) != len(g.vertices) || len(got.Edges) != len(g.edges) {
		t.Errorf("json has %d vertices and %d edges, the drawing %d and %d", len(got.Vertices), len(got.Edges), len(g.vertices), len(g.edges))
	}
	var dashed int
	for _, e := range got.Edges {
		if e.Dashed {
			dashed++
			if e.From != "pattern_module_crm__" || e.To != "module_n2_billing" {
				t.Errorf("dashed edge %+v", e)
			}
		}
	}
	if dashed != 1 {
		t.Errorf("%d dashed edges in json, want 1:\n%s", dashed, j.String())
	}
}

// TestGraphSVGWithoutDot: --format svg without Graphviz says what to
// install, before it listens to anything.
func TestGraphSVGWithoutDot(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	a := app()
	err := a.Run([]string{"meshctl", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/", "graph", "--format", "svg"})
	if err == nil || !strings.Contains(err.Error(), "Graphviz") {
		t.Errorf("graph --format svg without dot: %v", err)
	}
	if err := app().Run([]string{"meshctl", "graph", "--format", "png"}); err == nil || !strings.Contains(err.Error(), "mermaid, dot, svg or json") {
		t.Errorf("graph --format png: %v", err)
	}
}

// TestGraphOfTheExamples: the example modules, run on a node that sends
// heartbeats, are drawn as they declare themselves: an edge from each
// module to each event it declares it emits and each tool it declares it
// calls, from each tool to the module that serves it, and from the event
// notifier subscribes to notifier.
func TestGraphOfTheExamples(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "demo", AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	defs := []sdk.Module{billing.Module(), billing.Tax(), notifier.Module(io.Discard), umami.Module(time.Hour)}
	for _, def := range defs {
		if _, err := n.Load(ctx, def, runtime.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	deliveries := brokertest.Tap(t, url, "mesh.events", "node.demo.heartbeat")
	var hb runtime.Heartbeat
	for running := 0; running < len(defs); {
		select {
		case d := <-deliveries:
			hb = runtime.Heartbeat{}
			if err := json.Unmarshal(d.Body, &hb); err != nil {
				t.Fatalf("heartbeat %s: %v", d.Body, err)
			}
			running = 0
			for _, m := range hb.Modules {
				if m.Status == "running" {
					running++
				}
			}
		case <-ctx.Done():
			t.Fatalf("no heartbeat with the %d modules running; last: %+v", len(defs), hb)
		}
	}
	var out bytes.Buffer
	if err := meshGraph([]runtime.Heartbeat{hb}).mermaid(&out); err != nil {
		t.Fatal(err)
	}
	id := strings.NewReplacer(".", "_", "-", "_").Replace
	module := func(def sdk.Module) string { // "demo/billing (agent)", sanitised
		if def.Kind != "" {
			return "module_demo_" + id(def.Name) + "__" + id(string(def.Kind)) + "_"
		}
		return "module_demo_" + id(def.Name)
	}
	want := []string{
		`tool_invoice_create -->|"serves"| ` + module(defs[0]),
		`tool_tax_rate -->|"serves"| ` + module(defs[1]),
		`event_module_umami_site_created -->|"module.umami.site.created"| ` + module(defs[2]),
	}
	for _, def := range defs {
		for _, e := range def.Emits {
			want = append(want, module(def)+" --> event_"+id("module."+def.Name+"."+e))
		}
		for _, tool := range def.Calls {
			want = append(want, module(def)+` -->|"calls"| tool_`+id(tool))
		}
	}
	if len(want) != 7 {
		t.Errorf("the examples declare %d edges, this test knows 7: update it", len(want))
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("the graph lacks %q:\n%s", w, out.String())
		}
	}
	for _, v := range meshGraph([]runtime.Heartbeat{hb}).vertices {
		if v.kind == vEvent && v.name == "module.umami.site.created" && v.label != v.name+" (schema 1)" {
			t.Errorf("site.created is drawn as %q", v.label) // the console links its name, draws its label
		}
	}
	if !strings.Contains(out.String(), `event_module_umami_site_created(["module.umami.site.created (schema 1)"])`) {
		t.Errorf("the graph does not label site.created with its schema's version:\n%s", out.String())
	}
	if got := strings.Count(out.String(), "-->"); got != len(want) {
		t.Errorf("the graph has %d edges, the declarations %d:\n%s", got, len(want), out.String())
	}
}
