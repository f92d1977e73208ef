package runtime_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshkit/mesh/runtime"
)

// TestNodeObjectsEventQueueOnlyWithPatterns: a module's event queue is
// expected (not optional) only when the node's binding record says it
// subscribes patterns; a module that subscribes none, such as an agent
// serving tools, has none, so topology check must not report it missing.
func TestNodeObjectsEventQueueOnlyWithPatterns(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "bindings"), 0o755); err != nil {
		t.Fatal(err)
	}
	for queue, record := range map[string]string{"n1.shop.events": `["module.a.#"]`, "n1.tax.events": `[]`} {
		if err := os.WriteFile(filepath.Join(state, "bindings", queue+".json"), []byte(record), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := runtime.NodeObjects(runtime.Config{Node: "n1", StateDir: state},
		map[string]runtime.ModuleConfig{"shop": {}, "tax": {}, "new": {}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"n1.shop.events": false, "n1.tax.events": true, "n1.new.events": true}
	seen := 0
	for _, o := range objs {
		optional, ok := want[o.Name]
		if !ok {
			continue
		}
		seen++
		if got := o.When != ""; got != optional {
			t.Errorf("%s: optional %v (%q), want %v", o.Name, got, o.When, optional)
		}
	}
	if seen != len(want) {
		t.Errorf("saw %d of the %d event queues", seen, len(want))
	}
}
