package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
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
				Name:   "print",
				Usage:  "print every exchange and queue a node declares (the mesh's, its own and its modules'), with their arguments",
				Flags:  []cli.Flag{configFlag(), &cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"}},
				Action: topologyPrint,
			},
			{
				Name: "check",
				Usage: "compare the live broker with what a node declares: each exchange and queue missing, or declared with other " +
					"arguments, is reported (exit 1); bindings are not checked (AMQP cannot list them)",
				Flags:  []cli.Flag{configFlag(), &cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"}},
				Action: topologyCheck,
			},
			{
				Name: "permissions",
				Usage: "print the rabbitmqctl commands that give a node's broker user the permissions it needs and no more: " +
					"it may declare only the mesh's objects and its own, publish only node.NODE. and its modules' module.MODULE. events " +
					"(and their emit_grants), and serve only the tools its modules are granted",
				Flags: []cli.Flag{
					configFlag(),
					&cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
					&cli.StringFlag{Name: "user", Usage: "the broker `USER` (default: the one of the config's amqp_url)"},
					&cli.StringSliceFlag{Name: "consumes", Usage: "an existing `QUEUE` a module consumes (Mesh.Consume, a dispatcher's trigger); repeat for more"},
				},
				Action: topologyPermissions,
			},
		},
	}
}

// configFlag is the node configuration the topology commands read.
func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Required: true, Usage: "the node's configuration `FILE` (mesh.yaml)"}
}

// nodeObjects reads the node's config and returns it with the broker
// objects the node declares.
func nodeObjects(c *cli.Context) (nodeconfig.File, []runtime.BrokerObject, error) {
	if c.NArg() > 0 {
		return nodeconfig.File{}, nil, fmt.Errorf("%s takes no arguments, got %q", c.Command.Name, c.Args().Slice())
	}
	f, err := nodeconfig.Load(c.String("config"))
	if err != nil {
		return f, nil, err
	}
	if n := c.String("node"); n != "" {
		f.Node = n
	}
	if f.Node == "" {
		return f, nil, fmt.Errorf("%s names no node: give --node", c.String("config"))
	}
	mcs := make(map[string]runtime.ModuleConfig, len(f.Modules))
	for _, m := range f.Modules {
		mcs[m.Name] = m.ModuleConfig()
	}
	return f, append(runtime.MeshObjects(), runtime.NodeObjects(f.Runtime(), mcs)...), nil
}

// argsText is an object's arguments as k=v, sorted.
func argsText(args amqp.Table) string {
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, args[k])
	}
	return strings.Join(parts, " ")
}

func topologyPrint(c *cli.Context) error {
	_, objs, err := nodeObjects(c)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tTYPE\tFLAGS\tARGUMENTS\tBOUND TO")
	for _, o := range objs {
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{o.Durable, "durable"}, {o.Exclusive, "exclusive"}, {o.AutoDelete, "auto-delete"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		binds := o.Binds
		if o.Optional {
			binds += " (only if the module takes dead letters)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", o.Kind, o.Name, o.Type, strings.Join(flags, ","), argsText(o.Args), binds)
	}
	return tw.Flush()
}

func topologyCheck(c *cli.Context) error {
	f, objs, err := nodeObjects(c)
	if err != nil {
		return err
	}
	if !c.IsSet("amqp-url") && f.AMQPURL != "" {
		if err := c.Set("amqp-url", f.AMQPURL); err != nil {
			return err
		}
	}
	_, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	problems := 0
	for _, o := range objs {
		verdict := checkObject(conn, o)
		if !strings.HasPrefix(verdict, "ok") {
			problems++
		}
		fmt.Fprintf(c.App.Writer, "%-8s %s %s\n", strings.SplitN(verdict, " ", 2)[0], o.Kind, o.Name+suffix(verdict))
	}
	if problems > 0 {
		return fmt.Errorf("%d of %d objects missing or declared otherwise", problems, len(objs))
	}
	return nil
}

// suffix is what a verdict says after its first word.
func suffix(verdict string) string {
	if _, rest, ok := strings.Cut(verdict, " "); ok {
		return ": " + rest
	}
	return ""
}

// checkObject compares one object with the broker: "ok", "ok held by a
// running node" (the lock queue), "MISSING ...", or "DIFFERS <the
// broker's reason>". A passive declare says whether it exists; an active
// declare with the expected arguments, of an object that exists, changes
// nothing when they match and is refused (406) when they do not. Each
// declare has a channel of its own, since a refusal closes it.
func checkObject(conn *amqp.Connection, o runtime.BrokerObject) string {
	declare := func(passive bool) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		switch {
		case o.Kind == "exchange" && passive:
			return ch.ExchangeDeclarePassive(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args)
		case o.Kind == "exchange":
			return ch.ExchangeDeclare(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args)
		case passive:
			_, err = ch.QueueDeclarePassive(o.Name, o.Durable, o.AutoDelete, o.Exclusive, false, o.Args)
		default:
			_, err = ch.QueueDeclare(o.Name, o.Durable, o.AutoDelete, o.Exclusive, false, o.Args)
		}
		return err
	}
	var ae *amqp.Error
	err := declare(true)
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		switch {
		case o.Optional:
			return "ok absent (only a module that takes dead letters has it)"
		case o.Exclusive:
			return "MISSING the node is not running"
		}
		return "MISSING"
	case errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
		return "ok held by a running node"
	case err != nil:
		return "ERROR " + err.Error()
	case o.Exclusive:
		return "ok" // exists, and no other connection may redeclare it
	}
	if err := declare(false); err != nil {
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return "DIFFERS " + ae.Reason
		}
		return "ERROR " + err.Error()
	}
	return "ok"
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
