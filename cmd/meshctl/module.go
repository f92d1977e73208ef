package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// moduleCommand is `meshctl module`: what the broker keeps of a module.
func moduleCommand() *cli.Command {
	return &cli.Command{
		Name:  "module",
		Usage: "what the broker keeps of a module on a node",
		Subcommands: []*cli.Command{{
			Name: "remove",
			Usage: "delete a module's queues on the broker (NODE.MODULE.events and NODE.MODULE.dead, with their bindings and the " +
				"events waiting in them) and its queue policy, once the module no longer runs: its durable queue otherwise keeps " +
				"filling with what it subscribed to. Says how many events it drops and asks first (--yes does not)",
			ArgsUsage: "NODE.MODULE",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "yes", Usage: "do not ask: delete at once"},
				&cli.StringFlag{Name: "management-url", EnvVars: []string{"MESH_MANAGEMENT_URL"},
					Usage: "the broker's management API, for the queue's policy (default: the AMQP host, port 15672; the AMQP URL's user)"},
			},
			Action: moduleRemove,
		}},
	}
}

// moduleQueueState is one of a module's queues as the broker has it.
type moduleQueueState struct {
	name                string
	messages, consumers int
}

func moduleRemove(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("module remove wants NODE.MODULE, got %d arguments", c.NArg())
	}
	node, module, ok := strings.Cut(c.Args().First(), ".")
	if !ok || wire.ValidateWord("node name", node) != nil || wire.ValidateWord("module name", module) != nil {
		return usagef("module remove wants NODE.MODULE (as meshctl nodes lists them, e.g. berlin.billing), got %q", c.Args().First())
	}
	ctx, conn, url, done, err := brokerSessionAt(c)
	if err != nil {
		return err
	}
	defer done()
	var found []moduleQueueState
	for _, q := range []string{wire.ModuleQueue(node, module), wire.ModuleDeadQueue(node, module)} {
		st, exists, err := inspectQueue(conn, q)
		if err != nil {
			return err
		}
		if !exists {
			continue
		}
		if st.consumers > 0 {
			return fmt.Errorf("queue %s has %d consumer(s): module %s still runs on node %s; remove its entry from that node's mesh.yaml and reload meshd (SIGHUP) first", q, st.consumers, module, node)
		}
		found = append(found, st)
	}
	if len(found) == 0 {
		return fmt.Errorf("node %s has no queue of module %s (no %s): nothing to remove", node, module, wire.ModuleQueue(node, module))
	}
	total := 0
	var what []string
	for _, st := range found {
		total += st.messages
		what = append(what, fmt.Sprintf("%s (%d events)", st.name, st.messages))
	}
	fmt.Fprintf(c.App.Writer, "module %s on node %s: %s; removing drops %d events\n", module, node, strings.Join(what, ", "), total)
	if !c.Bool("yes") {
		if _, err := unix.IoctlGetTermios(int(os.Stdin.Fd()), unix.TCGETS); err != nil { // not a terminal: nobody to ask
			return usagef("not removed: give --yes to remove without asking")
		}
		fmt.Fprint(c.App.Writer, "remove them? [y/N] ")
		answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return errors.New("not removed")
		}
	}
	for _, st := range found {
		// A module that came back meanwhile is not cut off (quorum queues
		// take no if-unused delete: asked again just before).
		if now, exists, err := inspectQueue(conn, st.name); err != nil || !exists || now.consumers > 0 {
			return fmt.Errorf("queue %s changed while asking (module %s started again?): not removed: %v", st.name, module, err)
		}
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		n, err := ch.QueueDelete(st.name, false, false, false)
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("delete queue %s: %w", st.name, err)
		}
		fmt.Fprintf(c.App.Writer, "deleted %s and its bindings: %d events dropped\n", st.name, n)
	}
	api, err := brokerapi.New(url, c.String("management-url"), nil)
	if err == nil {
		err = api.DeletePolicy(ctx, runtime.QueuePolicyName(wire.ModuleQueue(node, module)))
	}
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "meshctl: the queue's policy %s was not checked (%v); delete it by hand if it exists\n", runtime.QueuePolicyName(wire.ModuleQueue(node, module)), err)
	}
	return nil
}

// inspectQueue reads queue's message and consumer counts without
// declaring it; exists is false for a queue that is not there.
func inspectQueue(conn *amqp.Connection, queue string) (st moduleQueueState, exists bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return st, false, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("queue %s: %w", queue, err)
	}
	return moduleQueueState{name: queue, messages: q.Messages, consumers: q.Consumers}, true, nil
}
