package runtime

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/version"
	"github.com/meshkit/mesh/internal/wire"
)

// Membership: every node that is not ephemeral sends node.<node>.heartbeat
// every HeartbeatInterval, with its modules, and follows the others'. A
// peer that sends none for missedHeartbeats of its own intervals is
// reported once, by each node that noticed, as node.<peer>.unreachable; a
// peer that says node.<peer>.left is forgotten without a report.

// missedHeartbeats is how many intervals of silence make a peer
// unreachable.
const missedHeartbeats = 3

// Heartbeat is the body of node.<node>.heartbeat.
type Heartbeat struct {
	Node    string `json:"node"`
	Version string `json:"version,omitempty"` // of the mesh runtime the node runs (Go build info)
	// Release is the mesh release the node runs (v0.2.0; empty from a
	// v0.1.0 node), Commit the commit its binary was built from, and
	// ModuleProtocols the module protocols it serves (BuildInfo).
	Release         string         `json:"release,omitempty"`
	Commit          string         `json:"commit,omitempty"`
	ModuleProtocols *ProtocolRange `json:"module_protocols,omitempty"`
	// Features are the features the node has now (Node.Features): those
	// of its release it has on and the broker did not refuse. A node of
	// v0.1.0 sends none; it has the v0.1.0 ones.
	Features []string `json:"features,omitempty"`
	// Peers are the other nodes it hears now (not unreachable), so a
	// listener knows whom to wait for (meshctl nodes); v0.1.0 sends none.
	Peers    []string        `json:"peers,omitempty"`
	Started  time.Time       `json:"started"`
	Interval time.Duration   `json:"interval_ns"`
	Modules  []ModuleSummary `json:"modules"`
}

// ModuleSummary is a module as membership tells of it: its declarations,
// from which the mesh draws its event graph (meshctl graph).
type ModuleSummary struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
	// Version is the version of the code the module runs, from the Go
	// build info of its binary: the module process's executable, or the
	// node's own for a module loaded in-process. A tagged build says its
	// tag (v1.4.2), a build in a git work tree a pseudo-version with the
	// commit (v0.0.0-20261201073200-1a2b3c4d5e6f, +dirty if it had
	// changes), other builds "(devel)" with the commit when known.
	Version string `json:"version,omitempty"`
	// SDKRelease is the mesh release of the sdk a module process's binary
	// was built with, as it said (v0.2.0 and later), and Protocol the
	// module protocol the node speaks with it; both empty for a module
	// loaded in-process, and SDKRelease for a binary of v0.1.0.
	SDKRelease string `json:"sdk_release,omitempty"`
	Protocol   uint   `json:"protocol,omitempty"`
	// Status is "running" (attached on the node's session), "waiting"
	// (not attached: the node is not connected, or it is attaching) or
	// "restarting" (its process went away and is being started again).
	Status string `json:"status,omitempty"`
	// Emits are the full event types it says it emits
	// (module.<name>.<event>); Calls the tools it says it calls.
	Emits []string `json:"emits,omitempty"`
	Calls []string `json:"calls,omitempty"`
	// Patterns are the topic patterns it subscribes; Tools the tools it
	// serves; Consumes the existing queues it consumes; DeadLetters says
	// it receives the mesh's dead letters; History that it reads the
	// mesh's history (every event: sdk.Module.History).
	Patterns    []string `json:"patterns,omitempty"`
	Tools       []string `json:"tools,omitempty"`
	Consumes    []string `json:"consumes,omitempty"`
	DeadLetters bool     `json:"dead_letters,omitempty"`
	History     bool     `json:"history,omitempty"`
	// Schemas are the versions of its events' body schemas it declares
	// (sdk.Module.Schemas with Event set), each by digest: the documents
	// travel in the node's schemas announcement (SchemasAnnouncement),
	// which the audit log keeps. Reads are the versions the handler of
	// each pattern reads (sdk.Module.Reads).
	Schemas []schema.Declared   `json:"schemas,omitempty"`
	Reads   map[string][]string `json:"reads,omitempty"`
	// ToolSchemas are the versions of the schemas of the tools it serves
	// (sdk.Module.Schemas with Tool set), each by the digests of its
	// request and response schemas, the documents in the announcement
	// too. They are apart from Schemas, whose every entry is a version of
	// an event type's.
	ToolSchemas []schema.Declared `json:"tool_schemas,omitempty"`
	// Outbox is the backlog of the module's outbox (sdk/outbox) as its
	// relay last reported it; nil for a module without one.
	Outbox *OutboxSummary `json:"outbox,omitempty"`
	// Group is the group the module is a member of on the node
	// (ModuleConfig.Group; ADR 48), empty for none, as a node of a
	// release before groups says of every module.
	Group string `json:"group,omitempty"`
	// Partitions is the group's partition count if it keeps order by key
	// (ModuleConfig.Partitions), and Owns the partitions this node's
	// consumers are fed now (as far as the node can tell: an active
	// consumer of an idle partition is not known to be one).
	Partitions int   `json:"partitions,omitempty"`
	Owns       []int `json:"owns,omitempty"`
	// Epoch is the number of the group's partition count: 0 its first,
	// one more at each change (meshctl groups repartition; ADR 48).
	Epoch int `json:"epoch,omitempty"`
	// OrderKey is the group's rule for an event's key
	// (ModuleConfig.OrderKey), empty for the emitter's.
	OrderKey string `json:"order_key,omitempty"`
	// Hot are the keys of the group with the most events held on the
	// node (at most hotKeysHeard, two or more each), the most first.
	Hot []HotKey `json:"hot,omitempty"`
}

// hotKeysHeard is how many hot keys a heartbeat tells of a module.
const hotKeysHeard = 3

// OutboxSummary is a module's outbox backlog in a heartbeat.
type OutboxSummary struct {
	// Unsent counts the rows committed and not yet published, Oldest is
	// when the oldest of them was written (absent for none).
	Unsent int64      `json:"unsent"`
	Oldest *time.Time `json:"oldest,omitempty"`
	// SetAside counts the rows the node refused for good.
	SetAside int64 `json:"set_aside,omitempty"`
}

// SchemasEvent is the event name (node.<node>.schemas) a node emits its
// modules' schema documents on, once each time a module that declares
// some starts: the audit log is where meshctl schema finds a document by
// digest, including versions no live module declares any longer.
func SchemasEvent(node string) string { return "node." + node + ".schemas" }

// SchemasAnnouncement is the body of node.<node>.schemas: one module's
// declared schemas, with their documents (its events' and its tools',
// told apart by Declared.Tool).
type SchemasAnnouncement struct {
	Node    string            `json:"node"`
	Module  string            `json:"module"`
	Schemas []AnnouncedSchema `json:"schemas"`
}

// AnnouncedSchema is one declared version with its document: an event's
// body schema, or a tool's request schema (null when it declares none)
// and its response schema.
type AnnouncedSchema struct {
	schema.Declared
	Schema   json.RawMessage `json:"schema"`
	Response json.RawMessage `json:"response,omitempty"`
}

// Peer is another node as this one last heard of it.
type Peer struct {
	Heartbeat
	// LastSeen is when its last heartbeat arrived.
	LastSeen time.Time
	// Unreachable says its heartbeats stopped and this node reported it.
	Unreachable bool
}

// peers is what a node knows of the others.
type peers struct {
	mu    sync.Mutex
	known map[string]*Peer
	// since is when the node began to hear the others on its current
	// session (zero while it does not): a node cut off from the broker
	// hears no one, and must not take that for the others' silence.
	since time.Time
	// following is the session it hears them on.
	following *session
	// answered is when it last answered a roll call; later says an answer
	// is due at answered+rollCallEvery (laterSchemas: with the schemas).
	answered     time.Time
	later        bool
	laterSchemas bool
}

// RollCall is the event type that asks every node to send its heartbeat
// now rather than at its next interval (meshctl nodes sends it, so it
// answers in a moment, not a heartbeat interval). A node answers at most
// once per rollCallEvery, whoever asks.
const RollCall = "mesh.membership.roll-call"

// RollCallRequest is a roll call's body. Schemas asks each node to
// announce its modules' declared schemas again (node.NODE.schemas), with
// their documents, after its heartbeat: meshctl emit reads the document of
// the version it sends from them.
type RollCallRequest struct {
	Schemas bool `json:"schemas,omitempty"`
}

const rollCallEvery = time.Second

// forgetAfter is how long an unreachable peer is remembered: one that
// never comes back (nor says it left) is forgotten then, so what a node
// knows of the others stays bounded by the live ones.
func forgetAfter(interval time.Duration) time.Duration { return max(time.Hour, 100*interval) }

// Peers returns the other nodes this node has heard of, by name.
func (n *Node) Peers() []Peer {
	n.members.mu.Lock()
	defer n.members.mu.Unlock()
	out := make([]Peer, 0, len(n.members.known))
	for _, p := range n.members.known {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// heartbeat is this node's heartbeat now.
func (n *Node) heartbeat() Heartbeat {
	build := Build()
	hb := Heartbeat{Node: n.cfg.Node, Version: runtimeVersion(), Release: build.Release, Commit: build.Commit, ModuleProtocols: &build.ModuleProtocols,
		Started: n.started, Interval: n.cfg.HeartbeatInterval}
	for _, f := range n.Features() {
		hb.Features = append(hb.Features, string(f))
	}
	for _, p := range n.Peers() {
		if !p.Unreachable {
			hb.Peers = append(hb.Peers, p.Node)
		}
	}
	mods, plugins := n.loaded()
	restarting := map[*Module]bool{}
	versions := map[*Module]string{}
	processes := map[*Module]*PluginModule{}
	for _, pm := range plugins {
		if pm.restarting() {
			restarting[pm.module] = true
		}
		versions[pm.module] = pm.version()
		processes[pm.module] = pm
	}
	s := n.session()
	for _, m := range mods {
		sum := m.summary()
		if v, ok := versions[m]; ok {
			sum.Version = v
			sum.SDKRelease, sum.Protocol = processes[m].SDKRelease(), processes[m].Protocol()
		} else {
			sum.Version = ownVersion
		}
		switch {
		case restarting[m]:
			sum.Status = "restarting"
		case s != nil && m.attachedOn.Load() == s:
			sum.Status = "running"
		default:
			sum.Status = "waiting"
		}
		hb.Modules = append(hb.Modules, sum)
	}
	slices.SortFunc(hb.Modules, func(a, b ModuleSummary) int { return strings.Compare(a.Name, b.Name) })
	return hb
}

// BuildInfo is what a binary of mesh says of itself: meshd version,
// meshctl version, the heartbeats and /metrics' mesh_build_info.
type BuildInfo struct {
	// Release is the mesh release it was built from (v0.2.0).
	Release string `json:"release"`
	// Commit is the commit it was built from, "+dirty" for a work tree
	// with changes, empty when the go command stamped none.
	Commit string `json:"commit,omitempty"`
	// GoVersion is the Go toolchain that built it.
	GoVersion string `json:"go_version,omitempty"`
	// ModuleProtocols is the window of module protocols meshd serves: a
	// module binary built for any of them runs unchanged.
	ModuleProtocols ProtocolRange `json:"module_protocols"`
}

// ProtocolRange is a range of module protocol versions, both ends
// included ({"min":7,"max":8}).
type ProtocolRange = plugin.Range

// Build is this binary's BuildInfo.
func Build() BuildInfo {
	return BuildInfo{Release: version.Release(), Commit: version.Commit(), GoVersion: version.GoVersion(), ModuleProtocols: plugin.Window()}
}

// String is BuildInfo as meshd version prints it, one fact a line.
func (b BuildInfo) String() string {
	commit := b.Commit
	if commit == "" {
		commit = "unknown (" + version.NoCommit + ")"
	}
	first := plugin.Release(b.ModuleProtocols.Min)
	if first == "" {
		first = b.Release
	}
	return fmt.Sprintf("release: %s\ncommit: %s\ngo: %s\nmodule protocols: %s (module binaries built with the sdk of %s to %s)\n",
		b.Release, commit, b.GoVersion, b.ModuleProtocols, first, b.Release)
}

// Line is BuildInfo on one line, as --version prints it:
// "v0.2.0 (commit 1a2b3c4d5e6f, module protocols 7)".
func (b BuildInfo) Line() string {
	if b.Commit == "" {
		return fmt.Sprintf("%s (module protocols %s)", b.Release, b.ModuleProtocols)
	}
	return fmt.Sprintf("%s (commit %s, module protocols %s)", b.Release, b.Commit, b.ModuleProtocols)
}

// ownVersion is the version of the running binary (binaryVersion).
var ownVersion = func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return buildVersion(info)
}()

// binaryVersion is the version of the Go binary at path, as buildVersion
// says it, or "" if its build info cannot be read.
func binaryVersion(path string) string {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return ""
	}
	return buildVersion(info)
}

// buildVersion is a binary's version from its build info: its main
// module's version (a tag, or a pseudo-version the go command derived
// from the git work tree), or, for "(devel)", that followed by the
// commit's first 12 digits and "+dirty" for a modified tree.
func buildVersion(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if rev == "" {
		return v
	}
	return strings.TrimSpace(v + " " + rev + dirty)
}

// runtimeVersion is the version of this module (github.com/meshkit/mesh)
// in the running binary's build info: a tag, a pseudo-version, or
// "(devel)" for a build from a work tree.
func runtimeVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if info.Main.Path == "github.com/meshkit/mesh" {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == "github.com/meshkit/mesh" {
			return d.Version
		}
	}
	return ""
}

// summary is what membership tells of m.
func (m *Module) summary() ModuleSummary {
	sum := ModuleSummary{Name: m.def.Name, Kind: string(m.def.Kind), Calls: slices.Clone(m.def.Calls), DeadLetters: m.def.DeadLetters != nil,
		History: m.def.History != nil, Reads: m.contracts.Reads(), Group: m.cfg.Group, Partitions: m.cfg.Partitions, OrderKey: m.cfg.OrderKey}
	if m.cfg.Partitions > 0 {
		e := m.currentEpoch()
		sum.Partitions, sum.Epoch = e.Count, e.Number
		sum.Owns = m.ownedPartitions()
		sum.Hot = m.hotKeys(hotKeysHeard)
	}
	for _, d := range m.contracts.Declared() {
		if d.Tool != "" {
			sum.ToolSchemas = append(sum.ToolSchemas, d)
		} else {
			sum.Schemas = append(sum.Schemas, d)
		}
	}
	for _, e := range m.def.Emits {
		sum.Emits = append(sum.Emits, wire.ModuleEventType(m.def.Name, e))
	}
	if ob := m.counts.outbox.Load(); ob != nil {
		sum.Outbox = &OutboxSummary{Unsent: ob.Unsent, SetAside: ob.SetAside}
		if !ob.Oldest.IsZero() {
			oldest := ob.Oldest.UTC()
			sum.Outbox.Oldest = &oldest
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.running.Load() {
		return sum // Setup has not said yet
	}
	for _, s := range m.subs {
		sum.Patterns = append(sum.Patterns, s.pattern)
	}
	for _, t := range m.tools {
		sum.Tools = append(sum.Tools, t.key)
	}
	for _, q := range m.queues {
		sum.Consumes = append(sum.Consumes, q.Key)
	}
	return sum
}

// beat sends a heartbeat every HeartbeatInterval and checks the peers for
// silence, until the node closes.
func (n *Node) beat() {
	t := time.NewTicker(n.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		n.sendHeartbeat()
		n.checkPeers(time.Now())
		select {
		case <-t.C:
		case <-n.rollCalled:
		case <-n.life.Done():
			return
		}
	}
}

// sendHeartbeat emits the node's heartbeat, unless the node is cut off
// from the broker or blocked by it: nobody needs an old heartbeat, so
// none is spooled to be delivered late (the next goes out on time).
//
// A heartbeat carries no time to live on the broker (ADR 19, amended): a
// copy that expired in a queue without a consumer (the audit logger's "#"
// queue of a node that stopped) would be dead-lettered, every interval,
// into mesh.dead-letters and every dead-letter queue granted "#". It
// waits there with the node's other events instead, for its audit logger
// to record when the node comes back, or until meshctl node remove
// deletes the queues of a node that is gone. The nodes that follow
// heartbeats do so from queues that drop a stale one (watchPeers).
func (n *Node) sendHeartbeat() {
	if s := n.session(); s == nil || s.isBlocked() {
		n.stats.heartbeatsSkipped.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(n.life, n.cfg.HeartbeatInterval)
	defer cancel()
	_, err := n.Emit(ctx, n.cfg.Node, "node."+n.cfg.Node+".heartbeat", n.heartbeat())
	if err != nil && n.life.Err() == nil {
		n.log.Debug("heartbeat not sent", "err", err)
	}
}

// answerRollCall has beat send a heartbeat now, and with schemas
// announces every module's declared schemas again. Within rollCallEvery
// of its last answer it answers once more when that time is up, whatever
// asked meanwhile (the answers coalesce: a flood costs one a second).
func (n *Node) answerRollCall(now time.Time, schemas bool) {
	n.members.mu.Lock()
	if wait := rollCallEvery - now.Sub(n.members.answered); wait > 0 {
		n.members.laterSchemas = n.members.laterSchemas || schemas
		if !n.members.later {
			n.members.later = true
			time.AfterFunc(wait, func() {
				n.members.mu.Lock()
				s := n.members.laterSchemas
				n.members.later, n.members.laterSchemas = false, false
				n.members.mu.Unlock()
				if n.life.Err() == nil {
					n.answerRollCall(time.Now(), s)
				}
			})
		}
		n.members.mu.Unlock()
		return
	}
	n.members.answered = now
	n.members.mu.Unlock()
	select {
	case n.rollCalled <- struct{}{}:
	default: // one is pending
	}
	if schemas {
		mods, _ := n.loaded()
		for _, m := range mods {
			n.announceSchemas(m)
		}
	}
}

// checkPeers reports, once, each peer silent for missedHeartbeats of its
// intervals while this node could hear it: not while this node is cut off
// from the broker, nor before it has followed the others for that long
// on its new session. A peer unreachable for forgetAfter is forgotten.
func (n *Node) checkPeers(now time.Time) {
	var silent []Peer
	n.members.mu.Lock()
	since := n.members.since
	for name, p := range n.members.known {
		if p.Unreachable && now.Sub(p.LastSeen) > forgetAfter(p.Interval) {
			delete(n.members.known, name)
			continue
		}
		if since.IsZero() {
			continue // hearing no one: this node is the one cut off
		}
		if !p.Unreachable && now.Sub(p.LastSeen) > missedHeartbeats*p.Interval && now.Sub(since) > missedHeartbeats*p.Interval {
			p.Unreachable = true
			silent = append(silent, *p)
		}
	}
	n.members.mu.Unlock()
	for _, p := range silent {
		n.log.Warn("a peer node stopped sending heartbeats", "peer", p.Node, "last_seen", p.LastSeen)
		ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
		_, err := n.Emit(ctx, n.cfg.Node, "node."+p.Node+".unreachable", map[string]any{
			"node": p.Node, "last_seen": p.LastSeen.UTC(), "reported_by": n.cfg.Node, "modules": p.Modules,
		})
		cancel()
		if err != nil && n.life.Err() == nil {
			n.log.Warn("could not report an unreachable peer", "peer", p.Node, "err", err)
		}
	}
}

// membership says whether the node takes part in membership.
func (n *Node) membership() bool { return !n.cfg.Ephemeral && n.cfg.HeartbeatInterval > 0 }

// followPeers starts following the others on s, if the node takes part;
// a failure is logged (membership is not worth failing a session for).
func (n *Node) followPeers(s *session) {
	if !n.membership() {
		return
	}
	if err := n.watchPeers(s); err != nil && !s.isLost() {
		n.log.Warn("membership: not following the other nodes on this session", "err", err)
	}
}

// watchPeers follows the others' heartbeats and departures on s, from a
// queue of its own that goes with the session.
func (n *Node) watchPeers(s *session) error {
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("membership: open channel: %w", err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{
		"x-queue-type": QueueClassic,
		"x-max-length": int64(10_000), // a stalled watcher drops the oldest
		// A heartbeat older than two intervals says nothing of now (a
		// stalled watcher would take a peer gone since for alive): it is
		// dropped, not dead-lettered (the queue has no dead-letter
		// exchange). Heartbeats carry no TTL of their own (sendHeartbeat).
		"x-message-ttl": max(2*n.cfg.HeartbeatInterval.Milliseconds(), 1),
	})
	if err == nil {
		// node.*.schemas is bound so that an announcement is routed
		// wherever a node runs (the audit logger keeps it; heard skips it).
		for _, key := range []string{"node.*.heartbeat", "node.*.left", "node.*.schemas", RollCall} {
			if err = ch.QueueBind(q.Name, key, wire.ExchangeEvents, false, nil); err != nil {
				break
			}
		}
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
	}
	if err != nil {
		ch.Close()
		return fmt.Errorf("membership: follow the other nodes: %w", err)
	}
	n.members.mu.Lock()
	n.members.since, n.members.following = time.Now(), s
	n.members.mu.Unlock()
	go func() {
		for d := range deliveries {
			n.heard(d)
		}
		// The session went: the node hears no one until the next.
		n.members.mu.Lock()
		if n.members.following == s {
			n.members.since, n.members.following = time.Time{}, nil
		}
		n.members.mu.Unlock()
	}()
	return nil
}

// heard takes one heartbeat or departure of a peer.
func (n *Node) heard(d amqp.Delivery) {
	if d.RoutingKey == RollCall {
		var req RollCallRequest
		_ = json.Unmarshal(d.Body, &req) // a body that says nothing more is a plain roll call
		n.answerRollCall(time.Now(), req.Schemas)
		return
	}
	words := strings.Split(d.RoutingKey, ".")
	if len(words) != 3 || words[1] == n.cfg.Node {
		return
	}
	peer := words[1]
	n.members.mu.Lock()
	defer n.members.mu.Unlock()
	switch words[2] {
	case "left":
		delete(n.members.known, peer)
		return
	case "schemas":
		return
	}
	var hb Heartbeat
	if err := json.Unmarshal(d.Body, &hb); err != nil || hb.Node != peer || hb.Interval <= 0 {
		return // not a heartbeat this runtime sends
	}
	p := n.members.known[peer]
	if p == nil {
		p = &Peer{}
		n.members.known[peer] = p
	}
	if p.Unreachable {
		n.log.Info("a peer node sends heartbeats again", "peer", peer)
	}
	p.Heartbeat, p.LastSeen, p.Unreachable = hb, time.Now(), false
}

// announceSchemas emits m's declared schemas with their documents
// (SchemasAnnouncement) on node.<node>.schemas, without holding up the
// module: spooled while the broker is away, given up with the node.
func (n *Node) announceSchemas(m *Module) {
	decls := m.contracts.Declared()
	if len(decls) == 0 {
		return
	}
	a := SchemasAnnouncement{Node: n.cfg.Node, Module: m.def.Name}
	compact := func(digest string) json.RawMessage {
		doc, ok := m.contracts.Doc(digest)
		var b bytes.Buffer
		if !ok || json.Compact(&b, doc) != nil {
			return nil // none declared (a tool's request or response); compiled, so JSON
		}
		return b.Bytes()
	}
	for _, d := range decls {
		a.Schemas = append(a.Schemas, AnnouncedSchema{Declared: d, Schema: compact(d.Digest), Response: compact(d.ResponseDigest)})
	}
	go func() {
		ctx, cancel := context.WithTimeout(n.life, n.cfg.EmitTimeout)
		defer cancel()
		if _, err := n.Emit(ctx, n.cfg.Node, SchemasEvent(n.cfg.Node), a); err != nil && n.life.Err() == nil {
			m.log.Warn("the module's schemas were not announced: meshctl schema finds their documents only in a later announcement", "err", err)
		}
	}()
}
