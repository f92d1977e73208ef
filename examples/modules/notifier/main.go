// Command notifier runs the notifier example module as a module process
// under meshd.
package main

import (
	"log"

	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/sdk"
)

func main() {
	if err := sdk.Run(notifier.Module(nil)); err != nil {
		log.Fatal(err)
	}
}
