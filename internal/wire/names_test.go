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
