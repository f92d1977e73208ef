package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
)

// featuresCommand is `meshctl features`: each feature of the mesh and the
// nodes that have it or lack it, from their heartbeats
// (docs/adr/0040-features-and-permissions.md).
func featuresCommand() *cli.Command {
	return &cli.Command{
		Name: "features",
		Usage: "list the mesh's features (delays, history, ...) with the nodes that have each and those that lack it, from their heartbeats: " +
			"a node lacks one its release does not know (a node of v0.1.0 has delays and history), its config turns off, or its broker user has no permission for",
		Flags: append(waitFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per feature"},
		),
		Action: features,
	}
}

func features(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("features takes no arguments, got %q", c.Args().Slice())
	}
	heard, err := listenHeartbeats(c)
	if err != nil {
		return err
	}
	var hbs []runtime.Heartbeat
	for _, n := range slices.Sorted(maps.Keys(heard)) {
		hbs = append(hbs, heard[n].Heartbeat)
	}
	states := runtime.MeshFeatures(hbs)
	if c.Bool("json") {
		enc := json.NewEncoder(jsonWriter{c.App.Writer})
		for _, st := range states {
			if err := enc.Encode(st); err != nil {
				return err
			}
		}
		return nil
	}
	if len(hbs) == 0 {
		_, err := fmt.Fprintf(c.App.Writer, "no node heard within %v %s\n", heardWithin(c), brokerPlace(c))
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tON EVERY NODE\tNODES WITH IT\tNODES LACKING IT")
	for _, st := range states {
		every := "yes"
		if len(st.Lacks) > 0 {
			every = "no"
		}
		// What a heartbeat says is anyone's who can publish one: escaped.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", escape(string(st.Feature)), every, escape(orNone(st.Has)), escape(orNone(st.Lacks)))
	}
	return tw.Flush()
}

// orNone is the names joined, or "-" for none.
func orNone(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ", ")
}
