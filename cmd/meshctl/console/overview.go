package console

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// tailed is an event as a tail hears it.
type tailed = runtime.TailedEvent

// overviewView is the overview page's data.
type overviewView struct {
	Problems []problem
	Nodes    []nodeView
	Broker   Broker
	Queues   []queueView // holding messages, moving them, or unhealthy
	Idle     []queueView // the rest
}

// problem is one thing unhealthy, with the page that tells more.
type problem struct {
	Text, Link string
}

type nodeView struct {
	Node
	Stale   bool
	Modules []moduleView
}

type moduleView struct {
	runtime.ModuleSummary
	Healthy bool
}

type queueView struct {
	Queue
	Oldest  string
	Problem string
}

// staleAfter is how many heartbeat intervals of silence make a node
// stale.
const staleAfter = 3

// intervalOf is n's heartbeat interval (the default where it says none).
func intervalOf(n Node) time.Duration {
	if n.Interval <= 0 {
		return runtime.DefaultHeartbeatInterval
	}
	return n.Interval
}

// silent reports whether n has not been heard for staleAfter of its
// heartbeat intervals at now.
func silent(n Node, now time.Time) bool { return now.Sub(n.LastSeen) > staleAfter*intervalOf(n) }

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ask(r)
	defer cancel()
	now := s.cfg.Now()
	b := s.cfg.Mesh.Broker(ctx)
	v := overviewView{Broker: b}
	if !b.Connected {
		v.Problems = append(v.Problems, problem{Text: "the console is not connected to the broker " + b.URL})
	}
	for _, a := range b.Alarms {
		v.Problems = append(v.Problems, problem{Text: "broker alarm: " + a + " (publishers are blocked)"})
	}
	if b.Management != "" {
		v.Problems = append(v.Problems, problem{Text: "queues, rates and alarms unknown: " + b.Management})
	}
	for _, n := range s.cfg.Mesh.Nodes() {
		nv := nodeView{Node: n}
		if silent(n, now) {
			interval := intervalOf(n)
			nv.Stale = true
			v.Problems = append(v.Problems, problem{Text: fmt.Sprintf("node %s silent for %s (heartbeat every %s)", n.Node, roughly(now.Sub(n.LastSeen)), interval)})
		}
		for _, m := range n.Modules {
			mv := moduleView{ModuleSummary: m, Healthy: m.Status == "" || m.Status == "running"}
			if !mv.Healthy {
				v.Problems = append(v.Problems, problem{Text: fmt.Sprintf("module %s on %s is %s", m.Name, n.Node, m.Status)})
			}
			nv.Modules = append(nv.Modules, mv)
		}
		v.Nodes = append(v.Nodes, nv)
	}
	if len(v.Nodes) == 0 {
		v.Problems = append(v.Problems, problem{Text: "no node heard yet (nodes send a heartbeat every heartbeat_interval)"})
	}
	for _, q := range b.Queues {
		qv := queueView{Queue: q, Oldest: "-"}
		if q.Oldest > 0 {
			qv.Oldest = roughly(q.Oldest)
		}
		switch {
		case q.Name == wire.QueueDead && q.Ready+q.Unacked > 0:
			qv.Problem = fmt.Sprintf("%d dead letters", q.Ready+q.Unacked)
			v.Problems = append(v.Problems, problem{Text: qv.Problem + " wait in " + q.Name, Link: "/dlq"})
		case q.Name == wire.QueueUnrouted && q.Ready+q.Unacked > 0:
			qv.Problem = fmt.Sprintf("%d unrouted events", q.Ready+q.Unacked)
			v.Problems = append(v.Problems, problem{Text: qv.Problem + " wait in " + q.Name, Link: "/unrouted"})
		case strings.HasSuffix(q.Name, ".events") && q.Consumers == 0 && q.Ready > 0:
			qv.Problem = "no consumer"
			v.Problems = append(v.Problems, problem{Text: fmt.Sprintf("%s has %d messages and no consumer", q.Name, q.Ready)})
		case q.Redelivered > 0 && q.Name != wire.QueueDead && q.Name != wire.QueueUnrouted: // browsing a keeper queue redelivers it
			qv.Problem = fmt.Sprintf("redelivering %.1f/s", q.Redelivered)
			v.Problems = append(v.Problems, problem{Text: fmt.Sprintf("%s redelivers %.1f messages/s (handlers failing)", q.Name, q.Redelivered)})
		}
		v.Queues = append(v.Queues, qv)
	}
	// What is unhealthy first, then the deepest; the idle ones (nothing
	// in them, nothing amiss) folded away below.
	sort.SliceStable(v.Queues, func(i, j int) bool {
		a, b := v.Queues[i], v.Queues[j]
		if (a.Problem != "") != (b.Problem != "") {
			return a.Problem != ""
		}
		return a.Ready+a.Unacked > b.Ready+b.Unacked
	})
	busy := v.Queues[:0:0]
	for _, q := range v.Queues {
		if q.Problem != "" || q.Ready+q.Unacked > 0 || q.In > 0 || q.Out > 0 {
			busy = append(busy, q)
		} else {
			v.Idle = append(v.Idle, q)
		}
	}
	v.Queues = busy
	s.render(w, r, "overview", view{Title: "Overview", Nav: "overview", Data: v})
}

// graphView is the graph page's data: the drawing and the graph itself.
type graphView struct {
	SVG    svgGraph
	Graph  Graph
	Counts map[string]int
}

func (s *Server) graph(w http.ResponseWriter, r *http.Request) {
	g := s.cfg.Mesh.Graph()
	if r.URL.Query().Get("format") == "json" {
		writeJSON(w, http.StatusOK, g)
		return
	}
	counts := map[string]int{}
	for _, v := range g.Vertices {
		counts[v.Kind]++
		if v.Stale {
			counts["stale"]++
		}
	}
	v := view{Title: "Graph", Nav: "graph", Data: graphView{SVG: layoutGraph(g), Graph: g, Counts: counts}}
	if len(g.Vertices) == 0 {
		v.Err = "no node heard yet: the graph is drawn from the nodes' heartbeats"
	}
	s.render(w, r, "graph", v)
}
