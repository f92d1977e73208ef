// Command meshctl talks to the mesh: emit an event, tail events live.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "meshctl:", err)
		os.Exit(1)
	}
}
