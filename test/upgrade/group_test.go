package upgrade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestAGroupBesideAPreviousReleaseNode (issue 61, item 5): beta and gamma,
// nodes of this release, run the notifier as an ordered group (group:
// notifiers, partitions: 4); alpha, a node of the previous release (its
// meshd and notifier built from the git history), runs the notifier on
// its own queue, as that release does, beside them. A foreign loader
// sends keyed site events. The previous release does not join and
// nothing breaks: every site event is notified once by alpha and once by
// the group (by beta or gamma, never both), the group's four partitions
// are shared by beta and gamma alone (mesh_group_partitions_owned 2 and
// 2), `meshctl groups` names them as the members, alpha logs no error;
// and when gamma stops, beta owns all four and the notifications go on.
func TestAGroupBesideAPreviousReleaseNode(t *testing.T) {
	old := previousRelease(t)
	cur, meshctl := thisRelease(t)
	url := brokertest.VHost(t)
	declareEvents(t, url)
	seen := newNotifiers()
	go seen.follow(brokertest.Tap(t, url, "mesh.events", "module.umami.site.created", "module.notifier.notification.sent"))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := testdir.Reachable(t)
	nodes := map[string]*node{}
	for _, name := range []string{"alpha", "beta", "gamma"} {
		nodes[name] = &node{t: t, name: name, addr: freeAddr(t), cfg: filepath.Join(dir, name+".yaml")}
	}
	config := func(name, notifier, extra string) string {
		return fmt.Sprintf(`node: %s
amqp_url: %s
state_dir: %s
http_addr: %s
heartbeat_interval: 1s
grace: 5s
modules:
  - name: notifier
    path: %s
    calls: ["invoice.*"]
%s`, name, url, filepath.Join(dir, name+"-state"), nodes[name].addr, notifier, extra)
	}
	group := "    group: notifiers\n    partitions: 4\n"
	write := func(name, text string) {
		if err := os.WriteFile(nodes[name].cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alpha", config("alpha", old.notifier, ""))
	write("beta", config("beta", cur.notifier, group+fmt.Sprintf(`  - name: billing
    kind: agent
    path: %s
    tools: ["invoice.create"]
    calls: ["tax.rate"]
  - name: tax
    kind: agent
    path: %s
    tools: ["tax.rate"]
`, cur.billing, cur.tax)))
	write("gamma", config("gamma", cur.notifier, group))
	nodes["beta"].start(ctx, cur.meshd)
	nodes["gamma"].start(ctx, cur.meshd)
	nodes["alpha"].start(ctx, old.meshd)
	for _, n := range nodes {
		n.ready(ctx)
	}

	load := startLoad(t, url, true)
	owned := func(name string) int {
		return int(nodes[name].metric(`mesh_group_partitions_owned{module="notifier"`))
	}
	nodes["beta"].until(ctx, "the group's four partitions shared by beta and gamma", func() bool {
		return owned("beta") == 2 && owned("gamma") == 2
	})
	from := seen.sites()
	nodes["beta"].until(ctx, "30 more site events notified by alpha and by the group", func() bool {
		return seen.notifiedByBoth(from) >= 30
	})
	out, err := exec.CommandContext(ctx, meshctl, "--amqp-url", url, "groups", "--json").Output()
	if err != nil {
		t.Fatalf("meshctl groups --json: %v", err)
	}
	var g struct {
		Group   string            `json:"group"`
		Members map[string]string `json:"members"`
	}
	if err := json.Unmarshal(out, &g); err != nil || g.Group != "notifiers" {
		t.Fatalf("meshctl groups --json (one group, one line): %s (%v)", out, err)
	}
	if members := slices.Sorted(maps.Keys(g.Members)); !slices.Equal(members, []string{"beta", "gamma"}) {
		t.Errorf("meshctl groups names the members %v, want beta and gamma (alpha, of %s, has no group): %s", members, old.release, out)
	}

	nodes["gamma"].stop()
	nodes["beta"].until(ctx, "beta owning the four partitions once gamma stopped", func() bool { return owned("beta") == 4 })
	from = seen.sites()
	nodes["beta"].until(ctx, "30 more site events notified with gamma gone", func() bool { return seen.notifiedByBoth(from) >= 30 })
	load.stop()
	nodes["beta"].until(ctx, "every site event notified by alpha and by the group", func() bool { return len(seen.unfinished()) == 0 })
	if twice := seen.byBothMembers(); len(twice) > 0 {
		t.Errorf("site events the group notified on both beta and gamma: %v", twice)
	}
	for _, line := range strings.Split(nodes["alpha"].logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("alpha (%s) logged an error beside the group: %s", old.release, line)
		}
	}
	t.Logf("%d site events (%d from the loader), each notified by alpha (%s) and once by the group", seen.sites(), load.sent(), old.release)
	nodes["alpha"].stop()
	nodes["beta"].stop()
}

// notifiers is what the tap saw: the site events, in order, and the
// nodes whose notifier notified each.
type notifiers struct {
	mu    sync.Mutex
	order []string
	by    map[string]map[string]bool // site event id → notifying nodes
}

func newNotifiers() *notifiers { return &notifiers{by: map[string]map[string]bool{}} }

func (n *notifiers) follow(ds <-chan amqp.Delivery) {
	for d := range ds {
		id, _ := d.Headers["x-event-id"].(string)
		n.mu.Lock()
		switch d.RoutingKey {
		case "module.umami.site.created":
			if n.by[id] == nil {
				n.by[id] = map[string]bool{}
				n.order = append(n.order, id)
			}
		case "module.notifier.notification.sent":
			cause, _ := d.Headers["x-causation-id"].(string)
			node, _ := d.Headers["x-node"].(string)
			if n.by[cause] == nil {
				n.by[cause] = map[string]bool{}
				n.order = append(n.order, cause)
			}
			n.by[cause][node] = true
		}
		n.mu.Unlock()
	}
}

// sites is how many site events the tap saw.
func (n *notifiers) sites() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.order)
}

// done says whether alpha and one member of the group notified site.
func (n *notifiers) done(site string) bool {
	by := n.by[site]
	return by["alpha"] && (by["beta"] || by["gamma"])
}

// notifiedByBoth is how many site events after the first from were
// notified by alpha and by the group.
func (n *notifiers) notifiedByBoth(from int) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, s := range n.order[from:] {
		if n.done(s) {
			c++
		}
	}
	return c
}

// unfinished are the site events not yet notified by alpha and the group.
func (n *notifiers) unfinished() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, s := range n.order {
		if !n.done(s) {
			out = append(out, s)
		}
	}
	return out
}

// byBothMembers are the site events both beta and gamma notified.
func (n *notifiers) byBothMembers() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for s, by := range n.by {
		if by["beta"] && by["gamma"] {
			out = append(out, s)
		}
	}
	return out
}
