package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// graphCommand is `meshctl graph`: the mesh drawn from its nodes'
// declarations.
func graphCommand() *cli.Command {
	return &cli.Command{
		Name: "graph",
		Usage: "draw the mesh from its nodes' heartbeats: which module emits which events, who subscribes to them, " +
			"who calls and serves which tools, who consumes which queues",
		Flags: append(waitFlags(),
			&cli.StringFlag{Name: "format", Value: "mermaid", Usage: "mermaid, dot (Graphviz), svg (needs Graphviz's dot), or json"},
			&cli.BoolFlag{Name: "json", Usage: "the same as --format json: the vertices and edges as one JSON object"},
		),
		Action: graph,
	}
}

func graph(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("graph takes no arguments, got %q", c.Args().Slice())
	}
	format := c.String("format")
	if c.Bool("json") {
		format = "json"
	}
	switch format {
	case "mermaid", "dot", "svg", "json":
	default:
		return usagef("--format %q: want mermaid, dot, svg or json", format)
	}
	var dot string
	if format == "svg" {
		var err error
		if dot, err = exec.LookPath("dot"); err != nil {
			return errors.New("--format svg needs Graphviz's dot in PATH (apt-get install graphviz), or use --format dot")
		}
	}
	heard, err := listenHeartbeats(c)
	if err != nil {
		return err
	}
	var beats []runtime.Heartbeat
	for _, h := range heard {
		beats = append(beats, h.Heartbeat)
	}
	g := meshGraph(beats)
	switch format {
	case "mermaid":
		return g.mermaid(c.App.Writer)
	case "dot":
		return g.dot(c.App.Writer)
	case "json":
		return g.json(c.App.Writer)
	}
	var src bytes.Buffer
	if err := g.dot(&src); err != nil {
		return err
	}
	cmd := exec.CommandContext(c.Context, dot, "-Tsvg")
	cmd.Stdin, cmd.Stdout = &src, c.App.Writer
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("dot -Tsvg: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// vertex kinds, each drawn its own way.
const (
	vModule  = "module"
	vEvent   = "event"
	vPattern = "pattern" // a subscribed pattern no declared event matches
	vTool    = "tool"
	vQueue   = "queue"
)

// vertex is one vertex: label is what is drawn, name what it stands for
// (an event's label adds its schema versions to its type).
type vertex struct{ id, kind, label, name string }

type edge struct {
	from, to, label string
	dashed          bool
}

// drawing is the mesh's graph: vertices and edges in a stable order.
type drawing struct {
	vertices []vertex
	edges    []edge
	labels   map[string]string // vertex id -> its label
}

// vertex returns the id of the vertex of kind with label, adding it the
// first time; two labels that sanitise alike get distinct ids.
func (d *drawing) vertex(kind, label string) string {
	base := kind + "_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, label)
	id := base
	for i := 2; ; i++ {
		l, taken := d.labels[id]
		if !taken {
			d.labels[id] = label
			d.vertices = append(d.vertices, vertex{id: id, kind: kind, label: label, name: label})
			return id
		}
		if l == label {
			return id
		}
		id = fmt.Sprintf("%s_%d", base, i)
	}
}

// moduleLabel is a module's vertex label: node/name, with its kind.
func moduleLabel(node string, m runtime.ModuleSummary) string {
	label := node + "/" + m.Name
	if m.Kind != "" {
		label += " (" + m.Kind + ")"
	}
	return label
}

// meshGraph draws the mesh the heartbeats declare: a module's emits
// (module → event, labelled with the schema versions declared for it), the events its patterns match (event → module; a
// pattern no declared event matches is drawn dashed), the tools it calls
// and serves (module → tool → module), the queues it consumes (queue →
// module), and mesh.dead-letters for a module that takes dead letters.
func meshGraph(beats []runtime.Heartbeat) *drawing {
	d := &drawing{labels: map[string]string{}}
	slices.SortFunc(beats, func(a, b runtime.Heartbeat) int { return strings.Compare(a.Node, b.Node) })
	var events []string
	for _, hb := range beats {
		for _, m := range hb.Modules {
			events = append(events, m.Emits...)
		}
	}
	slices.Sort(events)
	events = slices.Compact(events)
	for _, hb := range beats {
		for _, m := range hb.Modules {
			mod := d.vertex(vModule, moduleLabel(hb.Node, m))
			for _, e := range m.Emits {
				d.edges = append(d.edges, edge{from: mod, to: d.vertex(vEvent, e)})
			}
			for _, p := range m.Patterns {
				matched := false
				for _, e := range events {
					if wire.MatchPattern(p, e) {
						d.edges = append(d.edges, edge{from: d.vertex(vEvent, e), to: mod, label: p})
						matched = true
					}
				}
				if !matched {
					d.edges = append(d.edges, edge{from: d.vertex(vPattern, p), to: mod, dashed: true})
				}
			}
			for _, t := range m.Calls {
				d.edges = append(d.edges, edge{from: mod, to: d.vertex(vTool, t), label: "calls"})
			}
			for _, t := range m.Tools {
				d.edges = append(d.edges, edge{from: d.vertex(vTool, t), to: mod, label: "serves"})
			}
			for _, q := range m.Consumes {
				d.edges = append(d.edges, edge{from: d.vertex(vQueue, q), to: mod})
			}
			if m.DeadLetters {
				d.edges = append(d.edges, edge{from: d.vertex(vQueue, wire.QueueDead), to: mod, label: "dead letters"})
			}
			if m.History {
				for _, e := range events { // the history holds every event
					d.edges = append(d.edges, edge{from: d.vertex(vEvent, e), to: mod, label: "history"})
				}
			}
		}
	}
	// An event's declared schema versions, in its label (ids stay).
	versions := map[string][]string{}
	for _, hb := range beats {
		for _, m := range hb.Modules {
			for _, s := range m.Schemas {
				if !slices.Contains(versions[s.Type], s.Version) {
					versions[s.Type] = append(versions[s.Type], s.Version)
				}
			}
		}
	}
	for i, v := range d.vertices {
		if vs := versions[v.label]; v.kind == vEvent && len(vs) > 0 {
			d.vertices[i].label += " (schema " + strings.Join(vs, ", ") + ")"
		}
	}
	return d
}

// mermaid writes the graph as a Mermaid flowchart. Labels (what the
// heartbeats say, anyone's who can publish one) are escaped; ids are
// ASCII letters, digits and _ already.
func (d *drawing) mermaid(w io.Writer) error {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	for _, v := range d.vertices {
		label := strings.ReplaceAll(escape(v.label), `"`, "#quot;")
		switch v.kind {
		case vModule:
			fmt.Fprintf(&b, "  %s[\"%s\"]\n", v.id, label)
		case vEvent:
			fmt.Fprintf(&b, "  %s([\"%s\"])\n", v.id, label)
		case vPattern:
			fmt.Fprintf(&b, "  %s[/\"%s\"/]\n", v.id, label)
		case vTool:
			fmt.Fprintf(&b, "  %s{{\"%s\"}}\n", v.id, label)
		case vQueue:
			fmt.Fprintf(&b, "  %s[(\"%s\")]\n", v.id, label)
		}
	}
	for _, e := range d.edges {
		arrow := "-->"
		if e.dashed {
			arrow = "-.->"
		}
		if e.label != "" {
			fmt.Fprintf(&b, "  %s %s|\"%s\"| %s\n", e.from, arrow, strings.ReplaceAll(escape(e.label), `"`, "#quot;"), e.to)
		} else {
			fmt.Fprintf(&b, "  %s %s %s\n", e.from, arrow, e.to)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// dot writes the graph in Graphviz's DOT language, its labels escaped as
// mermaid's are (and then quoted: escape's \x1b is drawn as it reads).
func (d *drawing) dot(w io.Writer) error {
	q := func(s string) string {
		return `"` + strings.ReplaceAll(strings.ReplaceAll(escape(s), `\`, `\\`), `"`, `\"`) + `"`
	}
	shape := map[string]string{vModule: "box", vEvent: "ellipse", vPattern: "parallelogram", vTool: "hexagon", vQueue: "cylinder"}
	var b strings.Builder
	b.WriteString("digraph mesh {\n  rankdir=LR;\n")
	for _, v := range d.vertices {
		style := ""
		if v.kind == vPattern {
			style = ", style=dashed"
		}
		fmt.Fprintf(&b, "  %s [label=%s, shape=%s%s];\n", q(v.id), q(v.label), shape[v.kind], style)
	}
	for _, e := range d.edges {
		var attrs []string
		if e.label != "" {
			attrs = append(attrs, "label="+q(e.label))
		}
		if e.dashed {
			attrs = append(attrs, "style=dashed")
		}
		fmt.Fprintf(&b, "  %s -> %s", q(e.from), q(e.to))
		if len(attrs) > 0 {
			fmt.Fprintf(&b, " [%s]", strings.Join(attrs, ", "))
		}
		b.WriteString(";\n")
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// json writes d as {"vertices": [{id, kind, label}], "edges": [{from, to,
// label, dashed}]}, in the order the other formats draw them.
func (d *drawing) json(w io.Writer) error {
	type jv struct {
		ID    string `json:"id"`
		Kind  string `json:"kind"`
		Label string `json:"label"`
	}
	type je struct {
		From   string `json:"from"`
		To     string `json:"to"`
		Label  string `json:"label,omitempty"`
		Dashed bool   `json:"dashed,omitempty"`
	}
	out := struct {
		Vertices []jv `json:"vertices"`
		Edges    []je `json:"edges"`
	}{Vertices: []jv{}, Edges: []je{}}
	for _, v := range d.vertices {
		out.Vertices = append(out.Vertices, jv{v.id, v.kind, v.label})
	}
	for _, e := range d.edges {
		out.Edges = append(out.Edges, je{e.from, e.to, e.label, e.dashed})
	}
	enc := json.NewEncoder(jsonWriter{w})
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
