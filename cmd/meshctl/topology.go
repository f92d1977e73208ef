package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// topologyCommand is `meshctl topology`: the broker objects and rights the
// mesh needs.
func topologyCommand() *cli.Command {
	return &cli.Command{
		Name:  "topology",
		Usage: "what the mesh needs on the broker",
		Subcommands: []*cli.Command{
			{
				Name: "permissions",
				Usage: "print the rabbitmqctl commands that give a node's broker user the permissions it needs and no more: " +
					"it may declare only the mesh's objects and its own, publish only node.NODE. and its modules' module.MODULE. events " +
					"(and their emit_grants), and serve only the tools its modules are granted",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Required: true, Usage: "the node's configuration `FILE` (mesh.yaml)"},
					&cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
					&cli.StringFlag{Name: "user", Usage: "the broker `USER` (default: the one of the config's amqp_url)"},
					&cli.StringSliceFlag{Name: "consumes", Usage: "an existing `QUEUE` a module consumes (Mesh.Consume, a dispatcher's trigger); repeat for more"},
				},
				Action: topologyPermissions,
			},
		},
	}
}

func topologyPermissions(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("permissions takes no arguments, got %q", c.Args().Slice())
	}
	f, err := nodeconfig.Load(c.String("config"))
	if err != nil {
		return err
	}
	if n := c.String("node"); n != "" {
		f.Node = n
	}
	if f.Node == "" {
		return fmt.Errorf("%s names no node: give --node", c.String("config"))
	}
	p := f.Permissions(c.String("user"), c.StringSlice("consumes"))
	if p.User == "" {
		return fmt.Errorf("no broker user: the config's amqp_url names none; give --user")
	}
	fmt.Fprintf(c.App.Writer, "# node %s: broker user %s on virtual host %s\n", f.Node, p.User, p.VHost)
	for _, cmd := range p.Commands() {
		fmt.Fprintln(c.App.Writer, cmd)
	}
	return nil
}
