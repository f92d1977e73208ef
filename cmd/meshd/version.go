package main

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
)

// versionCommand is `meshd version`: the release, the commit, the Go
// toolchain and the module protocols this build serves
// (docs/compatibility.md), as text or --json.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the mesh release, the commit and the Go toolchain this meshd was built from, and the module protocols meshd serves",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print one JSON object"}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("version takes no arguments, got %q", c.Args().Slice())
			}
			b := runtime.Build()
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(b)
			}
			_, err := fmt.Fprint(c.App.Writer, b.String())
			return err
		},
	}
}
