package wire_test

import (
	"errors"
	"hash/fnv"
	"strings"
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
	for _, q := range []string{q, wire.PartitionQueue("eu", "billing", 7), wire.GroupIntake("eu", "billing"),
		wire.PartitionQueueOf("eu", "billing", 12, 31), wire.CatchUpQueue("eu", "billing", 1, 0)} {
		if g, m, ok := wire.GroupOfQueue(q); !ok || g != "eu" || m != "billing" {
			t.Fatalf("GroupOfQueue(%q) = %q, %q, %v", q, g, m, ok)
		}
	}
	if p := wire.PartitionQueue("eu", "billing", 7); p != "group.eu.billing.p007" {
		t.Errorf("PartitionQueue = %q", p)
	}
	if p := wire.PartitionQueueOf("eu", "billing", 0, 7); p != "group.eu.billing.p007" {
		t.Errorf("PartitionQueueOf epoch 0 = %q", p)
	}
	if p, c := wire.PartitionQueueOf("eu", "billing", 2, 7), wire.CatchUpQueue("eu", "billing", 2, 7); p != "group.eu.billing.e2p007" || c != "group.eu.billing.e2c007" {
		t.Errorf("PartitionQueueOf, CatchUpQueue of epoch 2 = %q, %q", p, c)
	}
	// A node named "group" with a module named like a group keeps a queue
	// of three words; a group's has four.
	for _, q := range []string{wire.ModuleQueue("group", "eu"), wire.ModuleDeadQueue("group", "eu"), "group.eu.events", "group..billing.events",
		"group.eu.billing.dead", "group.eu.a.b.events", "mesh.group.eu.billing.events", "group.eu.billing.p7", "group.eu.billing.pxyz", "group.eu.billing",
		"group.eu.billing.c007", "group.eu.billing.ep007", "group.eu.billing.e1x007", "group.eu.billing.exp007", "group.eu.billing.e1p07"} {
		if g, m, ok := wire.GroupOfQueue(q); ok {
			t.Errorf("GroupOfQueue(%q) = %q, %q: a group's queue", q, g, m)
		}
	}
}

// TestSlotIsFNV1a: the slot a foreign publisher must compute, pinned:
// FNV-1a (32 bits) of the key's bytes, modulo 64, named in decimal in
// its header.
func TestSlotIsFNV1a(t *testing.T) {
	for key, want := range map[string]string{"": "mesh-slot-5", "a": "mesh-slot-44"} {
		if got := wire.SlotHeader(key); got != want {
			t.Errorf("SlotHeader(%q) = %s, want %s", key, got, want)
		}
	}
	h := fnv.New32a()
	h.Write([]byte("order-42"))
	if got, want := wire.Slot("order-42"), int(h.Sum32()%wire.Slots); got != want {
		t.Errorf("Slot(order-42) = %d, hash/fnv says %d", got, want)
	}
	for _, bad := range []string{strings.Repeat("k", wire.MaxKeyBytes+1), "a\nb", "\xff"} {
		if err := wire.CheckKey(bad); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("CheckKey(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if err := wire.CheckKey(strings.Repeat("k", wire.MaxKeyBytes)); err != nil {
		t.Errorf("a key of %d bytes: %v", wire.MaxKeyBytes, err)
	}
}
