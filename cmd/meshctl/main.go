// Command meshctl talks to the mesh: emit an event, call a tool, tail
// events live, and list, show, replay or purge dead letters (meshctl dlq)
// and unrouted events (meshctl unrouted). It asks the audit logger what
// happened (meshctl audit), lists the nodes and draws the mesh from their
// heartbeats (meshctl nodes, graph), prints and checks the broker topology
// and a node's least-privilege permissions (meshctl topology), and writes
// a new module (meshctl new module). The broker is MESH_AMQP_URL or
// --amqp-url; flags go before or after the arguments; `meshctl help` and
// the README's "Commands" list the rest.
package main

import (
	"fmt"
	"os"
)

func main() {
	a := app()
	err := a.Run(interspersed(a, os.Args))
	if err != nil {
		// An error can carry what came from the wire: a tool's message, a
		// header the broker or a module set.
		fmt.Fprintln(os.Stderr, "meshctl:", escapeLines(err.Error()))
	}
	os.Exit(exitCode(err))
}
