package console

import (
	"strings"
	"testing"
)

// TestWrapCutsNothing: a label wraps at a dot, a slash, a dash or a space
// where it can, each line within the width, and the lines joined are the
// label.
func TestWrapCutsNothing(t *testing.T) {
	for _, s := range []string{
		"module.notifier.notification.sent (schema 1)",
		"berlin/dispatcher (dispatcher)",
		"a-very-long-name-without-dots-that-goes-on-and-on-and-on",
		strings.Repeat("x", 100),
		"",
		"short",
	} {
		lines := wrap(s, 20)
		if joined := strings.Join(lines, ""); strings.ReplaceAll(joined, " ", "") != strings.ReplaceAll(s, " ", "") {
			t.Errorf("wrap(%q) = %q: lines joined differ", s, lines)
		}
		for _, l := range lines {
			if len([]rune(l)) > 20 {
				t.Errorf("wrap(%q): line %q longer than 20", s, l)
			}
		}
	}
	if got := wrap("module.notifier.notification.sent", 20); got[0] != "module.notifier." {
		t.Errorf("wrap breaks %q, want after a dot", got)
	}
}

// TestGraphLayers: queues, modules and events or tools go in three
// columns, each box as tall as its lines, and a stale module is marked.
func TestGraphLayers(t *testing.T) {
	g := Graph{
		Vertices: []Vertex{
			{ID: "m", Kind: "module", Label: "berlin/notifier", Stale: true},
			{ID: "e", Kind: "event", Label: "module.notifier.notification.sent (schema 1)"},
			{ID: "t", Kind: "tool", Label: "invoice.create"},
			{ID: "q", Kind: "queue", Label: "shop.orders"},
		},
		Edges: []Edge{{From: "m", To: "e"}, {From: "m", To: "t"}, {From: "q", To: "m"}},
	}
	out := layoutGraph(g)
	x := map[string]int{}
	for _, b := range out.Boxes {
		x[b.Kind] = b.X
		if b.H < 2*boxPadding+len(b.Lines)*lineHeight-4 {
			t.Errorf("box %s is %d high for %d lines", b.ID, b.H, len(b.Lines))
		}
		if (b.ID == "m") != b.Stale {
			t.Errorf("box %s stale %v", b.ID, b.Stale)
		}
	}
	if !(x["queue"] < x["module"] && x["module"] < x["event"] && x["event"] == x["tool"]) {
		t.Errorf("columns %v", x)
	}
	if len(out.Paths) != 3 {
		t.Errorf("%d edges drawn, want 3", len(out.Paths))
	}
}
