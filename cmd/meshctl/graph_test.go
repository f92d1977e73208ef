package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshkit/mesh/runtime"
)

// TestMeshGraph: the graph joins emitters to subscribers through the event
// types their patterns match, callers to servers through tools, consumed
// queues and dead letters to their modules; a pattern nothing declared
// matches is drawn dashed. Mermaid and DOT say the same.
func TestMeshGraph(t *testing.T) {
	beats := []runtime.Heartbeat{
		{Node: "n2", Modules: []runtime.ModuleSummary{
			{Name: "billing", Patterns: []string{"module.shop.order.*", "module.crm.#"}, Tools: []string{"billing.charge"}, DeadLetters: true},
		}},
		{Node: "n1", Modules: []runtime.ModuleSummary{
			{Name: "shop", Emits: []string{"module.shop.order.created"}, Calls: []string{"billing.charge"}},
			{Name: "dispatcher", Kind: "dispatcher", Consumes: []string{"shop.orders"}},
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
