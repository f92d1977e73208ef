// Command ledger runs the ledger example module (serves ledger.book, emits
// module.ledger.order.booked through its outbox) as a module process
// under meshd. Its database is ledger.db in the directory meshd gives the
// module (process.Dir), or in the working directory when it has none.
package main

import (
	"context"
	"log"
	"path/filepath"

	"github.com/meshkit/mesh/examples/ledger"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	m, db, err := ledger.Module(context.Background(), filepath.Join(process.Dir(), "ledger.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := process.Run(m); err != nil {
		log.Fatal(err)
	}
}
