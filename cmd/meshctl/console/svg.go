package console

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/meshkit/mesh/auditlogger/store"
)

// The pictures are drawn here, in Go, as SVG the templates write out
// (html/template escapes every label): no script draws them, so they show
// the same with script off, and tests read them from the page.

// svgGraph is the event graph laid out in three layers: the existing
// queues modules consume on the left, the modules in the middle, what
// they emit, subscribe, call and serve on the right, and an edge for each
// declaration, styled by which pattern it is.
type svgGraph struct {
	Width, Height int
	Boxes         []svgBox
	Paths         []svgPath
}

// svgBox is a vertex drawn. Its label is never cut: Lines wrap it to the
// box's width (the box grows), and Full is the whole label, its title.
type svgBox struct {
	X, Y, W, H int
	Kind       string // the vertex kind, its CSS class
	Lines      []svgLine
	Full       string
	Link       string
	ID         string
	Stale      bool // its node has not been heard for three heartbeats
}

// svgLine is a line of a box's label, at its place.
type svgLine struct {
	X, Y int
	Text string
}

// svgPath is an edge drawn.
type svgPath struct {
	D     string // the path
	Class string // emits, subscribes, calls, serves, consumes, dead, unmatched
	Title string // what it is, in words
	LX    int    // where its label goes
	LY    int
	Label string
}

const (
	boxGap     = 10 // between boxes of a column
	lineHeight = 15
	boxPadding = 9 // above the first line and below the last
	charWidth  = 7 // of the label font, about
	topMargin  = 20
	colGap     = 150 // between columns, for the edges and their labels
)

// The columns: queues, modules, then events and tools.
var columns = []struct {
	kinds []string
	width int
}{
	{[]string{"queue"}, 200},
	{[]string{"module"}, 240},
	{[]string{"event", "pattern", "tool"}, 300},
}

// columnOf is the column of a vertex kind.
func columnOf(kind string) int {
	for i, c := range columns {
		for _, k := range c.kinds {
			if k == kind {
				return i
			}
		}
	}
	return len(columns) - 1
}

// layoutGraph lays g out in three layers (columns): queues, modules,
// events and tools. Modules keep the order of g's vertices; every other
// vertex goes beside the modules it connects (by the mean of their rows),
// which uncrosses most edges.
func layoutGraph(g Graph) svgGraph {
	var out svgGraph
	at := map[string]svgBox{}
	row := map[string]int{}
	for _, v := range g.Vertices {
		if v.Kind == "module" {
			row[v.ID] = len(row)
		}
	}
	sum, n := map[string]float64{}, map[string]int{}
	for _, e := range g.Edges {
		for _, pair := range [][2]string{{e.From, e.To}, {e.To, e.From}} {
			if r, ok := row[pair[1]]; ok {
				if _, isModule := row[pair[0]]; !isModule {
					sum[pair[0]] += float64(r)
					n[pair[0]]++
				}
			}
		}
	}
	mean := func(id string) float64 {
		if n[id] == 0 {
			return float64(len(row))
		}
		return sum[id] / float64(n[id])
	}
	vertices := append([]Vertex(nil), g.Vertices...)
	sort.SliceStable(vertices, func(i, j int) bool {
		a, b := vertices[i], vertices[j]
		if (a.Kind == "module") != (b.Kind == "module") {
			return a.Kind == "module"
		}
		return a.Kind != "module" && mean(a.ID) < mean(b.ID)
	})
	xs := make([]int, len(columns))
	x := 20
	for i, c := range columns {
		xs[i] = x
		x += c.width + colGap
	}
	ys := make([]int, len(columns))
	for i := range ys {
		ys[i] = topMargin
	}
	for _, v := range vertices {
		c := columnOf(v.Kind)
		b := svgBox{X: xs[c], Y: ys[c], W: columns[c].width, Kind: v.Kind, Full: v.Label, Link: v.Link, ID: v.ID, Stale: v.Stale}
		lines := wrap(v.Label, (b.W-16)/charWidth)
		b.H = 2*boxPadding + len(lines)*lineHeight - 4
		for i, l := range lines {
			b.Lines = append(b.Lines, svgLine{X: b.X + 8, Y: b.Y + boxPadding + 10 + i*lineHeight, Text: l})
		}
		ys[c] += b.H + boxGap
		at[v.ID] = b
		out.Boxes = append(out.Boxes, b)
	}
	for _, e := range g.Edges {
		from, ok1 := at[e.From]
		to, ok2 := at[e.To]
		if !ok1 || !ok2 {
			continue
		}
		p := svgPath{Class: edgeClass(e, from, to)}
		// From the side of one box that faces the other, to the other's.
		x1, x2 := from.X+from.W, to.X
		if from.X > to.X {
			x1, x2 = from.X, to.X+to.W
		}
		y1, y2 := from.Y+from.H/2, to.Y+to.H/2
		if from.X == to.X { // same column: a loop out to the side
			x1, x2 = from.X+from.W, to.X+to.W
			p.D = fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1+60, y1, x2+60, y2, x2, y2)
		} else {
			mid := (x1 + x2) / 2
			p.D = fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, mid, y1, mid, y2, x2, y2)
		}
		p.LX, p.LY = (x1+x2)/2, (y1+y2)/2-3
		// A subscription's pattern is said on its edge when it is not
		// the event's type itself (a wildcard, "#"); the whole of it is
		// the edge's title.
		if e.Label != "" && p.Class == "subscribes" && e.Label != from.Full {
			p.Label = fit(e.Label, 20)
			// Beside the module it subscribes (edges of subscriptions
			// run right to left), where the labels of one
			// event's many subscribers do not pile up.
			p.LX, p.LY = x2+8, y2-6
		}
		p.Title = fmt.Sprintf("%s %s %s", from.Full, verbOf(p.Class), to.Full)
		if e.Label != "" {
			p.Title += " (" + e.Label + ")"
		}
		out.Paths = append(out.Paths, p)
	}
	out.Width = x - colGap + 20
	out.Height = topMargin
	for _, y := range ys {
		out.Height = max(out.Height, y+topMargin)
	}
	return out
}

// wrap breaks s into lines of at most n runes, after a dot, a slash, a
// dash, a space or an opening parenthesis where it can, anywhere where a
// word is longer than a line: nothing is cut.
func wrap(s string, n int) []string {
	n = max(n, 4)
	var lines []string
	r := []rune(s)
	for len(r) > n {
		cut := -1
		for i := n; i > n/3; i-- {
			if c := r[i-1]; c == '.' || c == '/' || c == '-' || c == ' ' || c == '_' {
				cut = i
				break
			}
			if r[i] == '(' {
				cut = i
				break
			}
		}
		if cut < 0 {
			cut = n
		}
		lines = append(lines, strings.TrimRight(string(r[:cut]), " "))
		r = []rune(strings.TrimLeft(string(r[cut:]), " "))
	}
	if len(r) > 0 || len(lines) == 0 {
		lines = append(lines, string(r))
	}
	return lines
}

// edgeClass says which pattern an edge is.
func edgeClass(e Edge, from, to svgBox) string {
	switch {
	case e.Dashed:
		return "unmatched"
	case from.Kind == "module" && to.Kind == "event":
		return "emits"
	case from.Kind == "event" && to.Kind == "module":
		return "subscribes"
	case from.Kind == "module" && to.Kind == "tool":
		return "calls"
	case from.Kind == "tool":
		return "serves"
	case e.Label == "dead letters":
		return "dead"
	case from.Kind == "queue":
		return "consumes"
	}
	return "other"
}

func verbOf(class string) string {
	switch class {
	case "emits":
		return "emits"
	case "subscribes":
		return "is consumed by"
	case "calls":
		return "calls"
	case "serves":
		return "is served by"
	case "consumes", "dead":
		return "is consumed by"
	case "unmatched":
		return "(no declared event matches) is subscribed by"
	}
	return "→"
}

// fit cuts s to n runes, with an ellipsis.
func fit(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 1)]) + "…"
}

// svgTimeline is a trace drawn as a sequence diagram: a lane per source
// (module), time going down, an event a dot on its source's lane, an
// arrow from each cause to its effect.
type svgTimeline struct {
	Width, Height int
	Lanes         []svgLane
	Marks         []svgMark
	Arrows        []svgArrow
}

type svgLane struct {
	X     int
	Label string
}

type svgMark struct {
	X, Y   int
	Label  string // the type and the time since the first event
	Full   string
	Link   string
	Focus  bool
	Failed bool // dead-lettered somewhere
}

type svgArrow struct {
	X1, Y1, X2, Y2 int
}

const (
	laneWidth   = 190
	laneTop     = 50
	markSpacing = 38
)

// layoutTimeline draws the trace tr (of the event focus).
func layoutTimeline(tr store.Trace, focus string) svgTimeline {
	var evs []store.Event
	seen := map[string]bool{}
	add := func(ev store.Event) {
		if !seen[ev.ID] {
			seen[ev.ID] = true
			evs = append(evs, ev)
		}
	}
	for _, c := range tr.Causes {
		add(c)
	}
	var walk func(c *store.Caused)
	walk = func(c *store.Caused) {
		add(c.Event)
		for _, k := range c.Caused {
			walk(k)
		}
	}
	if tr.Root != nil {
		walk(tr.Root)
	}
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := whenOf(evs[i]), whenOf(evs[j])
		if !a.Equal(b) {
			return a.Before(b)
		}
		return evs[i].Seq < evs[j].Seq
	})
	var out svgTimeline
	lane := map[string]int{}
	for _, ev := range evs {
		src := laneOf(ev)
		if _, ok := lane[src]; !ok {
			lane[src] = len(out.Lanes)
			out.Lanes = append(out.Lanes, svgLane{X: 40 + len(out.Lanes)*laneWidth + laneWidth/2, Label: fit(src, 24)})
		}
	}
	pos := map[string]svgMark{}
	var t0 time.Time
	if len(evs) > 0 {
		t0 = whenOf(evs[0])
	}
	for i, ev := range evs {
		m := svgMark{X: out.Lanes[lane[laneOf(ev)]].X, Y: laneTop + 20 + i*markSpacing, Full: ev.Type + " " + ev.ID,
			Link: eventLink(ev.ID), Focus: ev.ID == focus}
		m.Label = fit(ev.Type, 34) + "  +" + whenOf(ev).Sub(t0).Round(time.Millisecond).String()
		for _, f := range ev.Fates {
			if f.Kind == store.FateDead {
				m.Failed = true
			}
		}
		pos[ev.ID] = m
		out.Marks = append(out.Marks, m)
	}
	for _, ev := range evs {
		if c, ok := pos[ev.CausationID]; ok {
			e := pos[ev.ID]
			out.Arrows = append(out.Arrows, svgArrow{X1: c.X, Y1: c.Y, X2: e.X, Y2: e.Y})
		}
	}
	out.Width = 40 + max(len(out.Lanes), 1)*laneWidth + 260
	out.Height = laneTop + 40 + max(len(evs), 1)*markSpacing
	return out
}

// laneOf is the lane an event is drawn on: its source, or its node for an
// event without one.
func laneOf(ev store.Event) string {
	switch {
	case ev.Source != "":
		return ev.Source
	case ev.Node != "":
		return "node " + ev.Node
	}
	return "(outside)"
}

// whenOf is when an event was emitted, or when it arrived when its emit
// time is unknown.
func whenOf(ev store.Event) time.Time {
	if !ev.Time.IsZero() {
		return ev.Time
	}
	return ev.Arrived
}
