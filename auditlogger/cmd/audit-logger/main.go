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
//
// With the mesh's history on a stream (history.stream in meshd's config),
// --history indexes it instead (the entry needs history: true, and no
// queue of its own is made); --rebuild builds a lost or corrupt database
// again from it (ADR 35).
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
	flag.BoolVar(&opts.History, "history", false, "index the mesh's history (the stream under history: in meshd's config; the entry needs history: true) instead of a queue of its own")
	flag.StringVar(&opts.KeyFile, "key", "", "the signing key of its checkpoints (made if missing; default the database's path with .key; - signs none)")
	flag.DurationVar(&opts.CheckpointEvery, "checkpoint-every", time.Minute, "how often it signs the chain's head and emits the checkpoint (negative: never)")
	rebuild := flag.Bool("rebuild", false, "move the database aside (DB.rebuilt-TIME) and build it again from the history (with --history)")
	flag.Parse()
	if *db == "" && process.Dir() != "" {
		*db = filepath.Join(process.Dir(), "audit.db") // its own directory (user: in meshd's config)
	}
	if *db == "" {
		fmt.Fprintln(os.Stderr, "audit-logger: --db PATH is required outside meshd (which gives every module a directory of its own, MESH_MODULE_DIR)")
		os.Exit(2)
	}
	if *rebuild {
		if !opts.History {
			fmt.Fprintln(os.Stderr, "audit-logger: --rebuild builds the database from the history: give --history too")
			os.Exit(2)
		}
		if err := auditlogger.MoveAside(*db, time.Now()); err != nil {
			fmt.Fprintln(os.Stderr, "audit-logger:", err)
			os.Exit(1)
		}
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
