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

	"github.com/meshkit/mesh/internal/confine"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == confine.Arg {
		// meshd starts a module process through itself, which confines
		// the process and executes the module's binary in its place.
		err := confine.Main(os.Args[2:])
		fmt.Fprintln(os.Stderr, "meshd:", err)
		os.Exit(1)
	}
	hideFromModules()
	if err := dropAmbientCaps(); err != nil {
		fmt.Fprintln(os.Stderr, "meshd:", err)
		os.Exit(1)
	}
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "meshd:", err)
		os.Exit(1)
	}
}
