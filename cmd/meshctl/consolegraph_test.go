package main

import (
	"testing"
	"time"

	"github.com/meshkit/mesh/cmd/meshctl/console"
	"github.com/meshkit/mesh/runtime"
)

// TestConsoleGraphMarksSilentNodes: the modules of a node not heard for
// three of its heartbeats are marked stale on the console's graph; those
// of a node heard just now are not.
func TestConsoleGraphMarksSilentNodes(t *testing.T) {
	hb := func(node string) runtime.Heartbeat {
		return runtime.Heartbeat{Node: node, Interval: 10 * time.Second, Modules: []runtime.ModuleSummary{{Name: "shop", Emits: []string{"module.shop.sold"}}}}
	}
	m := &consoleMesh{heard: map[string]console.Node{
		"alive": {Heartbeat: hb("alive"), LastSeen: time.Now()},
		"gone":  {Heartbeat: hb("gone"), LastSeen: time.Now().Add(-31 * time.Second)},
	}}
	stale := map[string]bool{}
	for _, v := range m.Graph().Vertices {
		if v.Kind == "module" {
			stale[v.Label] = v.Stale
		}
	}
	if len(stale) != 2 || stale["alive/shop"] || !stale["gone/shop"] {
		t.Errorf("modules drawn, stale: %v; want alive/shop live and gone/shop stale", stale)
	}
}
