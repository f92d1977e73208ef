// Command countplugin runs countmodule as a module process, for the
// benchmark: countplugin EXPECT.
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/meshkit/mesh/cmd/meshbench/countmodule"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	expect, err := strconv.ParseInt(os.Args[len(os.Args)-1], 10, 64)
	if err == nil {
		err = process.Run(countmodule.Module(expect))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "countplugin:", err)
		os.Exit(1)
	}
}
