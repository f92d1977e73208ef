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
	"path/filepath"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	db := flag.String("db", "", "path of the audit database (SQLite; created if missing)")
	var opts auditlogger.Options
	flag.DurationVar(&opts.MaxAge, "max-age", 0, "drop events that arrived longer ago than this (0 keeps them)")
	flag.Int64Var(&opts.MaxBytes, "max-bytes", 0, "drop the oldest events while the rows use more bytes than this (0: no bound)")
	flag.DurationVar(&opts.PruneEvery, "prune-every", time.Minute, "how often retention runs")
	flag.Parse()
	if *db == "" && process.Dir() != "" {
		*db = filepath.Join(process.Dir(), "audit.db") // its own directory (user: in meshd's config)
	}
	if *db == "" {
		fmt.Fprintln(os.Stderr, "audit-logger: --db PATH is required outside meshd (which gives every module a directory of its own, MESH_MODULE_DIR)")
		os.Exit(2)
	}
	l, err := auditlogger.Open(*db, opts)
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
