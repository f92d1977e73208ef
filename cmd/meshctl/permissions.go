package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// permissionsCommand is `meshctl topology permissions`: the broker
// permissions of a node's user, or of the operator's (meshctl's).
func permissionsCommand() *cli.Command {
	return &cli.Command{
		Name: "permissions",
		Usage: "print the rabbitmqctl commands that give a broker user the permissions it needs and no more. " +
			"--for node (the default): a node's user, from its config: it may declare only the mesh's objects and its own, " +
			"publish only node.NODE. and its modules' module.MODULE. events (and their emit_grants), and serve only the tools " +
			"its modules are granted. --for operator: the user meshctl connects as (emit, tail, call, nodes, graph, audit, " +
			"dispatcher, dlq, unrouted): it may declare only the mesh's objects and its own reply and tail queues, and read " +
			"no module's queue",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"},
				Usage: "the node's configuration `FILE` (mesh.yaml); with --for operator, only its virtual host is taken"},
			&cli.StringFlag{Name: "for", Value: "node", Usage: "whose permissions: `node` or operator"},
			&cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
			&cli.StringFlag{Name: "user", Usage: "the broker `USER` (default: the one of the config's amqp_url; for the operator, the one of --amqp-url)"},
			&cli.StringSliceFlag{Name: "consumes", Usage: "an existing `QUEUE` a module consumes (Mesh.Consume, a dispatcher's trigger); repeat for more"},
			&cli.BoolFlag{Name: "json", Usage: "print the permissions as one JSON object, with the commands"},
		},
		Action: topologyPermissions,
	}
}

func topologyPermissions(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("permissions takes no arguments, got %q", c.Args().Slice())
	}
	switch c.String("for") {
	case "node":
		return nodePermissions(c)
	case "operator":
		return operatorPermissions(c)
	}
	return usagef("--for %q: want node or operator", c.String("for"))
}

func nodePermissions(c *cli.Context) error {
	if c.String("config") == "" {
		return usagef("a node's permissions come from its config: give --config (or --for operator)")
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
	if c.IsSet("amqp-url") { // MESH_AMQP_URL or --amqp-url, over the file's, as for meshd
		f.AMQPURL = c.String("amqp-url")
	}
	p := f.Permissions(c.String("user"), c.StringSlice("consumes"))
	if p.User == "" {
		return fmt.Errorf("no broker user: the broker's URL names none; give --user")
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(struct {
			For  string `json:"for"`
			Node string `json:"node"`
			nodeconfig.Permissions
			Commands []string `json:"commands"`
		}{"node", f.Node, p, p.Commands()})
	}
	if err := printPermissions(c, fmt.Sprintf("node %s", f.Node), p); err != nil {
		return err
	}
	if f.Runtime().QueuePolicies {
		// Optional (ADR 43): without the tag the node declares its attempt
		// limits as queue arguments, as v0.1.0 did.
		_, err := fmt.Fprintf(c.App.Writer, "# optional, for max_attempts that change in place (queue_policies, ADR 43); the tag lets the user set any policy of the virtual host:\n# rabbitmqctl set_user_tags %s policymaker\n",
			"'"+strings.ReplaceAll(p.User, "'", `'\''`)+"'")
		return err
	}
	return nil
}

// operatorPermissions prints the operator's. The user is --user, or the
// one of meshctl's own broker URL (--amqp-url, --amqp-urls or their
// environment variables); never the one of a node's config, whose user is
// the node's.
func operatorPermissions(c *cli.Context) error {
	for _, flag := range []string{"node", "consumes"} {
		if c.IsSet(flag) {
			return usagef("--%s is for a node's permissions, not the operator's", flag)
		}
	}
	user, vhost, history := c.String("user"), "/", ""
	switch {
	case c.IsSet("amqp-url") || c.IsSet("amqp-urls"):
		var urlUser string
		urlUser, vhost = nodeconfig.BrokerAccount(brokerURLs(c)[0])
		if user == "" {
			user = urlUser
		}
	case c.String("config") != "":
		f, err := nodeconfig.Load(c.String("config"))
		if err != nil {
			return err
		}
		_, vhost = nodeconfig.BrokerAccount(f.Runtime().Brokers()[0])
		history = f.History.Stream
		if user == "" {
			return usagef("give --user: the operator's broker user (the config's amqp_url names the node's)")
		}
	}
	if user == "" {
		return usagef("give --user, the operator's broker user, or --amqp-url naming it")
	}
	p := nodeconfig.OperatorPermissions(user, vhost, history)
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(struct {
			For string `json:"for"`
			nodeconfig.Permissions
			Commands []string `json:"commands"`
		}{"operator", p, p.Commands()})
	}
	return printPermissions(c, "operator (meshctl)", p)
}

// printPermissions prints a comment line saying whose p are, then the
// commands.
func printPermissions(c *cli.Context, whose string, p nodeconfig.Permissions) error {
	if _, err := fmt.Fprintf(c.App.Writer, "# %s: broker user %s on virtual host %s\n", whose, p.User, p.VHost); err != nil {
		return err
	}
	for _, cmd := range p.Commands() {
		if _, err := fmt.Fprintln(c.App.Writer, cmd); err != nil {
			return err
		}
	}
	return nil
}
