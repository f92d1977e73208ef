// Command tax runs the tax example module (serves tax.rate) as a module
// process under meshd.
package main

import (
	"log"

	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	if err := process.Run(billing.Tax()); err != nil {
		log.Fatal(err)
	}
}
