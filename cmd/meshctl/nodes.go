package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
)

// nodesCommand is `meshctl nodes`: the nodes of the mesh, from their
// heartbeats.
func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:  "nodes",
		Usage: "list the nodes that send heartbeats: their runtime version, their modules (with the version of a module binary built apart from the node; a module not running says WAITING or RESTARTING), when they started and when they were last heard",
		Flags: []cli.Flag{
			waitFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per node"},
		},
		Action: nodes,
	}
}

// listenHeartbeats collects the nodes' heartbeats for --wait (or until
// interrupted), the last of each node.
func listenHeartbeats(c *cli.Context) (map[string]heardNode, error) {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	node, err := connect(ctx, c)
	if err != nil {
		return nil, err
	}
	defer node.Close(context.Background())
	heard := map[string]heardNode{}
	listen, cancel := context.WithCancel(ctx)
	defer cancel()
	err = node.Tail(listen, "node.*.heartbeat", func() { time.AfterFunc(c.Duration("wait"), cancel) }, func(ev runtime.TailedEvent) error {
		hb, ok := heartbeatOf(ev)
		if !ok {
			return nil
		}
		heard[hb.Node] = heardNode{Heartbeat: hb, LastSeen: time.Now().UTC()}
		return nil
	})
	return heard, err
}

// heartbeatOf reads a tailed node.*.heartbeat event; ok is false for one
// that is not a heartbeat of this runtime.
func heartbeatOf(ev runtime.TailedEvent) (hb runtime.Heartbeat, ok bool) {
	if ev.Err != nil || json.Unmarshal(ev.Event.Body, &hb) != nil || hb.Node == "" {
		return hb, false
	}
	return hb, true
}

// waitFlag is how long nodes and graph listen for heartbeats.
func waitFlag() cli.Flag {
	return &cli.DurationFlag{Name: "wait", Value: runtime.DefaultHeartbeatInterval + 2*time.Second,
		Usage: "listen this long for the nodes' heartbeats (a node sends one per heartbeat_interval)"}
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
		_, err := fmt.Fprintf(c.App.Writer, "no node heard within %v\n", c.Duration("wait"))
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERSION\tMODULES\tUP SINCE\tLAST HEARD\tHEARTBEAT")
	for _, n := range names {
		h := heard[n]
		var mods []string
		for _, m := range h.Modules {
			mod := m.Name
			if m.Version != "" && m.Version != h.Version {
				mod += "@" + m.Version // a module binary built apart from the node
			}
			if m.Kind != "" {
				mod += " (" + m.Kind + ")"
			}
			if m.Status != "" && m.Status != "running" {
				mod += " " + strings.ToUpper(m.Status)
			}
			mods = append(mods, mod)
		}
		// What a heartbeat says is anyone's who can publish one: escaped.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%v\n", escape(n), escape(h.Version), escape(strings.Join(mods, ", ")), h.Started.Format(time.RFC3339),
			time.Since(h.LastSeen).Round(time.Second), h.Interval)
	}
	return tw.Flush()
}
