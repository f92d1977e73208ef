// Command meshctl talks to the mesh: emit an event, call a tool, tail
// events live, and list, show, replay or purge dead letters (meshctl dlq)
// and unrouted events (meshctl unrouted).
package main

import (
	"fmt"
	"os"
)

func main() {
	a := app()
	err := a.Run(interspersed(a, os.Args))
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshctl:", err)
	}
	os.Exit(exitCode(err))
}
