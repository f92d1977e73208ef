// Command notifier runs the notifier example module as a module process
// under meshd.
package main

import (
	"log"

	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	if err := process.Run(notifier.Module(nil)); err != nil {
		log.Fatal(err)
	}
}
