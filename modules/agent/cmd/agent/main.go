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
