// Command module runs one conformance module as a module process:
//
//	module NAME LOGFILE
package main

import (
	"fmt"
	"os"

	"github.com/meshkit/mesh/sdk/process"
	"github.com/meshkit/mesh/test/conformance"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: module NAME LOGFILE")
		os.Exit(2)
	}
	m, err := conformance.Module(os.Args[1], conformance.NewProbe(os.Args[2]))
	if err == nil {
		err = process.Run(m)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
