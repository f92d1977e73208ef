// Command dispatcher runs the dispatcher module (package dispatcher) as a
// module process under meshd. Its triggers come from its entry's config in
// meshd's config:
//
//	modules:
//	  - name: dispatcher
//	    kind: dispatcher
//	    path: ./bin/modules/dispatcher
//	    tools: ["dispatcher.*"]
//	    config:
//	      store: /var/lib/mesh/anchor/dispatcher.db
//	      triggers:
//	        - name: orders
//	          queue: legacy.orders
//	          tool: invoice.create
//	          inputs: {currency: EUR}
//	          max_concurrent_runs: 4
//	          timeout: 20s
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	var cfg dispatcher.Config
	err := process.Settings(&cfg)
	if cfg.Store == "" && process.Dir() != "" {
		cfg.Store = filepath.Join(process.Dir(), "dispatcher.db") // its own directory (user: in meshd's config)
	}
	var d *dispatcher.Dispatcher
	if err == nil {
		d, err = dispatcher.Open(cfg)
	}
	if err == nil {
		err = process.Run(d.Module())
		if cerr := d.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}
