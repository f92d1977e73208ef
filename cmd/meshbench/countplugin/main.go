// Command countplugin runs countmodule as a module process, for the
// benchmark: countplugin [-name NAME] EXPECT. With MESHBENCH_PLUGIN_CPUPROFILE
// set (meshbench passes it on through a launcher, /usr/bin/env), each
// process writes a CPU profile to that path with its PID appended.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"

	"github.com/meshkit/mesh/cmd/meshbench/countmodule"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	name := flag.String("name", "count", "the module's name")
	flag.Parse()
	if path := os.Getenv("MESHBENCH_PLUGIN_CPUPROFILE"); path != "" {
		if f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid())); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	expect, err := strconv.ParseInt(flag.Arg(0), 10, 64)
	if err == nil {
		err = process.Run(countmodule.Named(*name, expect))
	}
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "countplugin:", err)
		os.Exit(1)
	}
}
