// Command audit-logger runs the audit logger as a module process under
// meshd, with its database at the path its config's args give:
//
//	modules:
//	  - name: audit-logger
//	    path: ./bin/modules/audit-logger
//	    args: ["--db", "/var/lib/mesh/anchor/audit.db"]
//	    prefetch: 256
//	    concurrency: 256
//	    tools: ["audit.*"]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	db := flag.String("db", "", "path of the audit database (SQLite; created if missing)")
	flag.Parse()
	if *db == "" {
		fmt.Fprintln(os.Stderr, "audit-logger: --db PATH is required")
		os.Exit(2)
	}
	l, err := auditlogger.Open(*db)
	if err == nil {
		err = process.Run(l.Module())
		if cerr := l.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "audit-logger:", err)
		os.Exit(1)
	}
}
