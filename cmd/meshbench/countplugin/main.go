// Command countplugin runs countmodule as a module process, for the
// benchmark: countplugin [-name NAME] EXPECT.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/meshkit/mesh/cmd/meshbench/countmodule"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	name := flag.String("name", "count", "the module's name")
	flag.Parse()
	expect, err := strconv.ParseInt(flag.Arg(0), 10, 64)
	if err == nil {
		err = process.Run(countmodule.Named(*name, expect))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "countplugin:", err)
		os.Exit(1)
	}
}
