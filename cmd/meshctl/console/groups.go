package console

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// groupsView is the groups page: the module groups the heartbeats tell
// of (ADR 48), with their queues as the broker's management API counts
// them.
type groupsView struct {
	Groups []groupView
	// Management is why the queues' counts are unknown, or "".
	Management string
}

// groupView is one group of one module.
type groupView struct {
	Group, Module string
	// Partitions is its partition count when it keeps order by key (0:
	// it does not); Queues are then its partitions and its intake, else
	// its one shared queue.
	Partitions int
	// Epoch is the number of its partition count (one more at each
	// meshctl groups repartition), the highest a member says; Changing
	// says its members disagree (a change is under way).
	Epoch    int
	Changing bool
	Members  []memberView
	Queues   []groupQueueView
	// Hot are its hot keys, the most held first.
	Hot []hotKeyView
}

// memberView is a node running the module in the group.
type memberView struct {
	Node, Status string
	Owns         int // partitions it says it owns (ordered groups)
	Stale        bool
}

// groupQueueView is one of a group's queues, its owner (a partition's
// member whose heartbeat says it owns it) and the broker's counts
// (Known false when the management API did not list it).
type groupQueueView struct {
	Name, Owner               string
	Known                     bool
	Ready, Unacked, Consumers int
	In, Out                   float64
}

// hotKeyView is a key a member holds two or more events of.
type hotKeyView struct {
	runtime.HotKey
	Node string
}

// hotKeysShown is how many hot keys a group shows.
const hotKeysShown = 5

func (s *Server) groupsPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ask(r)
	defer cancel()
	now := s.cfg.Now()
	b := s.cfg.Mesh.Broker(ctx)
	queues := map[string]Queue{}
	for _, q := range b.Queues {
		queues[q.Name] = q
	}
	byKey := map[string]*groupView{}
	for _, n := range s.cfg.Mesh.Nodes() {
		stale := silent(n, now)
		for _, m := range n.Modules {
			if m.Group == "" || wire.ValidateWord("group", m.Group) != nil || wire.ValidateWord("module name", m.Name) != nil {
				continue // what a heartbeat says is anyone's: a name that makes no queue is no group
			}
			partitions := m.Partitions
			if partitions < 0 || partitions > wire.Slots {
				partitions = 0
			}
			key := m.Group + "/" + m.Name
			g := byKey[key]
			if g == nil || (partitions > 0 && m.Epoch > g.Epoch) {
				// The latest partition count a member says (after
				// meshctl groups repartition): one behind it follows it.
				was := g
				g = &groupView{Group: m.Group, Module: m.Name, Partitions: partitions, Epoch: max(m.Epoch, 0)}
				if partitions > 0 {
					for i := range partitions {
						g.Queues = append(g.Queues, groupQueueView{Name: wire.PartitionQueueOf(m.Group, m.Name, g.Epoch, i)})
					}
					g.Queues = append(g.Queues, groupQueueView{Name: wire.GroupIntake(m.Group, m.Name)})
				} else {
					g.Queues = []groupQueueView{{Name: wire.GroupQueue(m.Group, m.Name)}}
				}
				if was != nil {
					g.Members, g.Changing = was.Members, true
					for i := range g.Members {
						g.Members[i].Owns = 0
					}
				}
				byKey[key] = g
			} else if partitions > 0 && m.Epoch != g.Epoch {
				g.Changing = true
			}
			status := m.Status
			if status == "" {
				status = "running"
			}
			mv := memberView{Node: n.Node, Status: status, Stale: stale}
			if g.Partitions > 0 && partitions == g.Partitions && m.Epoch == g.Epoch {
				for _, i := range m.Owns {
					if i >= 0 && i < g.Partitions {
						g.Queues[i].Owner = n.Node
						mv.Owns++
					}
				}
				for _, k := range m.Hot[:min(hotKeysShown, len(m.Hot))] { // a heartbeat's list is the sender's: bounded here
					g.Hot = append(g.Hot, hotKeyView{HotKey: k, Node: n.Node})
				}
			}
			g.Members = append(g.Members, mv)
		}
	}
	v := groupsView{Management: b.Management}
	for _, g := range byKey {
		for i := range g.Queues {
			if q, ok := queues[g.Queues[i].Name]; ok {
				gq := &g.Queues[i]
				gq.Known, gq.Ready, gq.Unacked, gq.Consumers, gq.In, gq.Out = true, q.Ready, q.Unacked, q.Consumers, q.In, q.Out
			}
		}
		slices.SortFunc(g.Members, func(a, b memberView) int { return strings.Compare(a.Node, b.Node) })
		slices.SortFunc(g.Hot, func(a, b hotKeyView) int { return runtime.HotterFirst(a.HotKey, b.HotKey) })
		g.Hot = g.Hot[:min(hotKeysShown, len(g.Hot))]
		v.Groups = append(v.Groups, *g)
	}
	slices.SortFunc(v.Groups, func(a, b groupView) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Module, b.Module))
	})
	s.render(w, r, "groups", view{Title: "Groups", Nav: "groups", Data: v})
}

// ownsText says how many partitions a member owns, for the page.
func ownsText(m memberView, partitions int) string {
	if partitions == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d partitions", m.Owns, partitions)
}
