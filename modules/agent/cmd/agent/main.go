// Command agent runs the agent module (package agent) as a module process
// under meshd. Its tools come from its entry's config in meshd's config:
//
//	modules:
//	  - name: agent
//	    path: ./bin/modules/agent
//	    tools: ["invoice.*"]
//	    config:
//	      tools:
//	        - key: invoice.create
//	          command: ./examples/agent/invoice.sh
//	          timeout: 10s
//	          max_concurrency: 4
//	          limits: {cpu_seconds: 5, open_files: 64}
//
// The binary is also each run's supervisor, run again by the agent (see
// package agent): keep it where the agent's process can execute it.
package main

import (
	"fmt"
	"os"

	"github.com/meshkit/mesh/modules/agent"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	var cfg agent.Config
	err := process.Settings(&cfg)
	var a *agent.Agent
	if err == nil {
		a, err = agent.New(cfg)
	}
	if err == nil {
		err = process.Run(a.Module())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}
