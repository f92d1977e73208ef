// Command tax runs the tax example module (serves tax.rate) as a module
// process under meshd.
package main

import (
	"log"

	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/sdk"
)

func main() {
	if err := sdk.Run(billing.Tax()); err != nil {
		log.Fatal(err)
	}
}
