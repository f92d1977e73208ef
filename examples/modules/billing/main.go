// Command billing runs the billing example module (serves invoice.create,
// calls tax.rate) as a module process under meshd.
package main

import (
	"log"

	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	if err := process.Run(billing.Module()); err != nil {
		log.Fatal(err)
	}
}
