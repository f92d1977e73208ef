// Command umami runs the umami example module as a module process under
// meshd.
package main

import (
	"log"
	"time"

	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/sdk"
)

func main() {
	if err := sdk.Run(umami.Module(time.Second)); err != nil {
		log.Fatal(err)
	}
}
