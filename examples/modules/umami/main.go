// Command umami runs the umami example module as a module process under
// meshd.
package main

import (
	"log"
	"time"

	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	if err := process.Run(umami.Module(time.Second)); err != nil {
		log.Fatal(err)
	}
}
