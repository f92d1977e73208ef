package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// nodesCommand is `meshctl nodes`: the nodes of the mesh, from their
// heartbeats.
func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:  "nodes",
		Usage: "list the nodes that send heartbeats: their mesh release and the module protocols they serve, their modules (a module process built with another sdk release says it, and the protocol it speaks; a module not running says WAITING or RESTARTING), when they started and when they were last heard",
		Flags: append(waitFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per node"},
		),
		Action: nodes,
	}
}

// rollCallQuiet is how long listenHeartbeats waits, once every node it
// knows of has answered, for one it does not know of yet.
const rollCallQuiet = 700 * time.Millisecond

// listenHeartbeats collects the nodes' heartbeats, the last of each node.
// It calls the roll (runtime.RollCall), so each node answers at once, and
// returns as soon as every node any heartbeat names as a peer has been
// heard and none more for rollCallQuiet; at most --within (a node of
// v0.1.0 answers no roll call: it is heard at its next heartbeat). --wait
// listens that long in full instead, or until interrupted.
func listenHeartbeats(c *cli.Context) (map[string]heardNode, error) {
	heard, _, err := listenMembership(c, false)
	return heard, err
}

// listenMembership is listenHeartbeats that, with schemas, also asks each
// node to announce its modules' schemas again in its answer to the roll
// call, and returns the documents they announced, by digest (each checked
// against its digest).
func listenMembership(c *cli.Context, schemas bool) (map[string]heardNode, map[string][]byte, error) {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	node, err := connect(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	defer node.Close(context.Background())
	heard := map[string]heardNode{}
	docs := map[string][]byte{}
	listen, cancel := context.WithCancel(ctx)
	defer cancel()
	full := c.IsSet("wait")
	var quiet *time.Timer
	ready := func() {
		if full {
			time.AfterFunc(c.Duration("wait"), cancel)
			return
		}
		time.AfterFunc(c.Duration("within"), cancel)
		quiet = time.AfterFunc(time.Duration(math.MaxInt64), cancel) // set once all answered
		rc, rcCancel := context.WithTimeout(listen, 5*time.Second)
		defer rcCancel()
		if _, err := node.Emit(rc, "meshctl", runtime.RollCall, runtime.RollCallRequest{Schemas: schemas}, sdk.WithTTL(5*time.Second)); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "meshctl: could not call the roll (%v); listening for heartbeats for %v\n", err, c.Duration("within"))
		}
	}
	pattern := "node.*.heartbeat"
	if schemas {
		pattern = "node.*.*" // the announcements too
	}
	err = node.Tail(listen, pattern, ready, func(ev runtime.TailedEvent) error {
		if ev.Err == nil && strings.HasSuffix(ev.Event.Type, ".schemas") {
			var an runtime.SchemasAnnouncement
			if json.Unmarshal(ev.Event.Body, &an) == nil {
				for _, s := range an.Schemas {
					if len(s.Schema) > 0 && schema.Digest(s.Schema) == s.Digest { // an announcement's own word is checked
						docs[s.Digest] = s.Schema
					}
				}
			}
			return nil
		}
		hb, ok := heartbeatOf(ev)
		if !ok {
			return nil
		}
		_, known := heard[hb.Node]
		heard[hb.Node] = heardNode{Heartbeat: hb, LastSeen: time.Now().UTC()}
		if quiet != nil && !known && allHeard(heard) {
			quiet.Reset(rollCallQuiet) // a node heard for the first time: wait a moment for one more
		}
		return nil
	})
	return heard, docs, err
}

// allHeard reports whether every node a heard heartbeat names as a peer
// was heard itself.
func allHeard(heard map[string]heardNode) bool {
	for _, h := range heard {
		for _, p := range h.Peers {
			if _, ok := heard[p]; !ok {
				return false
			}
		}
	}
	return true
}

// heartbeatOf reads a tailed node.*.heartbeat event; ok is false for one
// that is not a heartbeat of this runtime.
func heartbeatOf(ev runtime.TailedEvent) (hb runtime.Heartbeat, ok bool) {
	if ev.Err != nil || json.Unmarshal(ev.Event.Body, &hb) != nil || hb.Node == "" {
		return hb, false
	}
	return hb, true
}

// waitFlags are how long nodes, graph, features and schema listen for
// heartbeats.
func waitFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "within", Value: runtime.DefaultHeartbeatInterval + 2*time.Second,
			Usage: "call the roll and answer once every node heard of has answered, at most after this long (a node of v0.1.0 answers no roll call: it is heard at its next heartbeat)"},
		&cli.DurationFlag{Name: "wait", Usage: "listen this long for heartbeats instead (a node sends one per heartbeat_interval), calling no roll"},
	}
}

// heardWithin is how long listenHeartbeats listened at most.
func heardWithin(c *cli.Context) time.Duration {
	if c.IsSet("wait") {
		return c.Duration("wait")
	}
	return c.Duration("within")
}

// heardNode is a node as meshctl nodes heard of it.
type heardNode struct {
	runtime.Heartbeat
	LastSeen time.Time `json:"last_seen"`
}

func nodes(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("nodes takes no arguments, got %q", c.Args().Slice())
	}
	heard, err := listenHeartbeats(c)
	if err != nil {
		return err
	}
	names := slices.Sorted(maps.Keys(heard))
	if c.Bool("json") {
		enc := json.NewEncoder(jsonWriter{c.App.Writer})
		for _, n := range names {
			if err := enc.Encode(heard[n]); err != nil {
				return err
			}
		}
		return nil
	}
	if len(names) == 0 {
		_, err := fmt.Fprintf(c.App.Writer, "no node heard within %v %s\n", heardWithin(c), brokerPlace(c))
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRELEASE\tPROTOCOLS\tMODULES\tUP SINCE\tLAST HEARD\tHEARTBEAT")
	for _, n := range names {
		h := heard[n]
		var mods []string
		for _, m := range h.Modules {
			mods = append(mods, moduleLine(h.Heartbeat, m))
		}
		// What a heartbeat says is anyone's who can publish one: escaped.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\t%v\n", escape(n), escape(releaseOf(h.Heartbeat)), protocolsOf(h.Heartbeat), escape(strings.Join(mods, ", ")),
			h.Started.Format(time.RFC3339), time.Since(h.LastSeen).Round(time.Second), h.Interval)
	}
	return tw.Flush()
}

// releaseOf is the release a node says it runs; a node of v0.1.0 says
// none, only its Go build version ("(devel)" for a build from a work tree).
func releaseOf(h runtime.Heartbeat) string {
	if h.Release != "" {
		return h.Release
	}
	if h.Version == "" {
		return "v0.1.0?"
	}
	return h.Version + " (v0.1.0?)"
}

// protocolsOf is the module protocols a node serves, "7" for a node of
// v0.1.0, which does not say.
func protocolsOf(h runtime.Heartbeat) string {
	if h.ModuleProtocols == nil {
		return "7"
	}
	return h.ModuleProtocols.String()
}

// moduleLine is a module as meshctl nodes lists it: its name, the sdk
// release of a module process built with another than the node's (and its
// protocol, when it is not the node's newest), or the version of a binary
// built apart from the node, its kind and a status other than running.
func moduleLine(h runtime.Heartbeat, m runtime.ModuleSummary) string {
	mod := m.Name
	switch {
	case m.SDKRelease != "" && m.SDKRelease != h.Release:
		mod += " (sdk " + m.SDKRelease + ")"
	case m.SDKRelease == "" && m.Protocol != 0:
		mod += " (sdk v0.1.0)" // a module process that does not say its sdk: v0.1.0's
	case m.SDKRelease == "" && m.Version != "" && m.Version != h.Version:
		mod += "@" + m.Version // a binary of a node of v0.1.0, built apart from it
	}
	if m.Protocol != 0 && h.ModuleProtocols != nil && m.Protocol != h.ModuleProtocols.Max {
		mod += fmt.Sprintf(" [protocol %d]", m.Protocol)
	}
	if m.Kind != "" {
		mod += " (" + m.Kind + ")"
	}
	if m.Group != "" {
		mod += " [group " + m.Group + "]"
	}
	if m.Status != "" && m.Status != "running" {
		mod += " " + strings.ToUpper(m.Status)
	}
	return mod
}
