package wire_test

import (
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

func TestConsumeGrantedKeepsTheMeshsQueues(t *testing.T) {
	for _, c := range []struct {
		grant, queue string
		want         bool
	}{
		{"#", "shop.orders", true},
		{"shop.*", "shop.orders", true},
		{"#", "mesh.dead-letters", false},
		{"mesh.#", "mesh.history", false},
		{"mesh.*", "mesh.unrouted", false},
		{"mesh.node.*.due", "mesh.node.a.due", false},
		{"mesh.dead-letters", "mesh.dead-letters", true},
		{"mesh.delay.3", "mesh.delay.3", true},
	} {
		if got := wire.ConsumeGranted(c.grant, c.queue); got != c.want {
			t.Errorf("ConsumeGranted(%q, %q) = %v, want %v", c.grant, c.queue, got, c.want)
		}
	}
}

func TestAGroupQueueNeverMeetsANodesQueue(t *testing.T) {
	q := wire.GroupQueue("eu", "billing")
	if q != "group.eu.billing.events" {
		t.Fatalf("GroupQueue = %q", q)
	}
	if g, m, ok := wire.GroupOfQueue(q); !ok || g != "eu" || m != "billing" {
		t.Fatalf("GroupOfQueue(%q) = %q, %q, %v", q, g, m, ok)
	}
	// A node named "group" with a module named like a group keeps a queue
	// of three words; a group's has four.
	for _, q := range []string{wire.ModuleQueue("group", "eu"), wire.ModuleDeadQueue("group", "eu"), "group.eu.events", "group..billing.events",
		"group.eu.billing.dead", "group.eu.a.b.events", "mesh.group.eu.billing.events"} {
		if g, m, ok := wire.GroupOfQueue(q); ok {
			t.Errorf("GroupOfQueue(%q) = %q, %q: a group's queue", q, g, m)
		}
	}
}
