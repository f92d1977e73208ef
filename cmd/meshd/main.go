// Command meshd runs a mesh node: it owns the node's broker connections and
// topology and runs its modules as module processes. `meshd run --config
// mesh.yaml` runs a node until SIGTERM (SIGHUP reloads its modules'
// config); `meshd config check` validates a configuration without
// starting anything, and `meshd config reference` prints every setting
// (docs/config.md). docs/operator-guide.md is the operator's guide.
package main

import (
	"fmt"
	"os"
)

func main() {
	hideFromModules()
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "meshd:", err)
		os.Exit(1)
	}
}
