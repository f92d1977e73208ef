// Command meshd runs a mesh node: it owns the node's broker connections and
// topology and runs its modules.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "meshd:", err)
		os.Exit(1)
	}
}
