package runtime_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMembership: two nodes hear each other's heartbeats, with their
// modules. When one is cut off, the other reports it as
// node.<peer>.unreachable, once, naming itself; when it comes back, it is
// reachable again. A node that says it left is forgotten, unreported.
func TestMembership(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	const every = 200 * time.Millisecond
	beat := func(c *runtime.Config) {
		c.HeartbeatInterval = every
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	}
	a := testNode(t, url, "alpha", beat)
	b := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "beta", beat)
	load(t, b, sdk.Module{Name: "shop"}, runtime.ModuleConfig{})
	raw := rawConn(t, url)
	unreachable, alphaBeats := watchQueue(t, raw, "node.beta.unreachable"), watchQueue(t, raw, "node.alpha.heartbeat")

	heardOf := func(n *runtime.Node, peer string) (runtime.Peer, bool) {
		for _, p := range n.Peers() {
			if p.Node == peer {
				return p, true
			}
		}
		return runtime.Peer{}, false
	}
	waitFor(t, 15*time.Second, func() bool {
		p, ok := heardOf(a, "beta")
		return ok && len(p.Modules) == 1 && p.Modules[0].Name == "shop" && p.Modules[0].Status == "running"
	})
	if p, _ := heardOf(a, "beta"); p.Interval != every || p.Unreachable || p.Started.IsZero() || p.Version == "" {
		t.Errorf("alpha heard of beta as %+v", p)
	}
	waitFor(t, 15*time.Second, func() bool { _, ok := heardOf(b, "alpha"); return ok })

	// A report before the cut (a machine so loaded that beta's beats
	// paused for three intervals) is not the one this test is after.
	if _, err := raw.QueuePurge(unreachable, false); err != nil {
		t.Fatal(err)
	}
	proxy.Down()
	report := nextFrom(t, raw, unreachable)
	var body struct {
		Node       string `json:"node"`
		ReportedBy string `json:"reported_by"`
	}
	if err := json.Unmarshal(report.Body, &body); err != nil {
		t.Fatalf("report %s: %v", report.Body, err)
	}
	if report.Headers[wire.HeaderSource] != "alpha" || body.ReportedBy != "alpha" || body.Node != "beta" {
		t.Errorf("report %s from %v", report.Body, report.Headers[wire.HeaderSource])
	}
	if p, _ := heardOf(a, "beta"); !p.Unreachable {
		t.Error("alpha does not say beta is unreachable")
	}
	// Once: alpha goes on checking with every heartbeat; after five more
	// of them there is still no second report.
	for range 5 {
		nextFrom(t, raw, alphaBeats)
	}
	if n := queueDepth(t, raw, unreachable); n != 0 {
		t.Errorf("%d more reports of beta", n)
	}
	proxy.Up()
	waitFor(t, 15*time.Second, func() bool { p, ok := heardOf(a, "beta"); return ok && !p.Unreachable })

	// Beta leaves as meshd makes a node leave, with its heartbeats
	// stopped first: its last heartbeat, confirmed before Close returns,
	// is in alpha's queue before the departure, so no heartbeat after it
	// can make alpha hear of beta again. (With beta still beating, alpha
	// would rightly hear of it again at its next heartbeat: the test
	// then raced that heartbeat.)
	if err := b.Close(emitCtx(t)); err != nil {
		t.Fatal(err)
	}
	left, _ := json.Marshal(map[string]any{})
	if err := raw.Publish(wire.ExchangeEvents, "node.beta.left", false, false, amqp.Publishing{
		MessageId: "01J0000000000000000000LEFT", ContentType: "application/json", Body: left,
		Headers: amqp.Table{wire.HeaderSource: "beta"},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() bool { _, ok := heardOf(a, "beta"); return !ok })
}

// TestCutOffNodeReportsNoOne: a node cut off from the broker hears no
// heartbeats, and does not take that for its peers' silence: after it is
// back (its spool drained, its heartbeats heard again), no report that a
// peer was unreachable came from it.
func TestCutOffNodeReportsNoOne(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	const every = 100 * time.Millisecond
	beat := func(c *runtime.Config) {
		c.HeartbeatInterval = every
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	}
	testNode(t, url, "alpha", beat)
	b := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "beta", beat)
	raw := rawConn(t, url)
	falseReports, betaBeats := watchQueue(t, raw, "node.alpha.unreachable"), watchQueue(t, raw, "node.beta.heartbeat")
	waitFor(t, 15*time.Second, func() bool {
		for _, p := range b.Peers() {
			if p.Node == "alpha" {
				return true
			}
		}
		return false
	})
	skippedAtCut := b.Stats().HeartbeatsSkipped
	proxy.Down()
	// Beta sends no heartbeat while it is cut off (none is spooled): ten
	// it skipped are more than the three intervals of silence that make
	// a report.
	waitFor(t, 30*time.Second, func() bool { return b.Stats().HeartbeatsSkipped >= skippedAtCut+10 })
	proxy.Up()
	waitFor(t, 30*time.Second, func() bool { st := b.Stats(); return st.Connected && st.SpoolEvents == 0 })
	if _, err := raw.QueuePurge(betaBeats, false); err != nil {
		t.Fatal(err)
	}
	nextFrom(t, raw, betaBeats) // beta sends from its new session: what it spooled went before
	if n := queueDepth(t, raw, falseReports); n != 0 {
		t.Errorf("beta, cut off, reported alpha unreachable %d times", n)
	}
}
