package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/delay"
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
	fmt.Fprintf(c.App.Writer, "module %s on node %s: ", module, node)
	return removeQueues(ctx, c, conn, url, found, "module "+module+" started again?")
}

// removeQueues says what found holds (after the line's start the caller
// printed), asks (unless --yes; without a terminal it refuses), and
// deletes each queue and its queue policy. Each is inspected again just
// before: one that gained a consumer meanwhile (again is what may have
// happened, for the error) is not deleted.
func removeQueues(ctx context.Context, c *cli.Context, conn *amqp.Connection, url string, found []moduleQueueState, again string) error {
	total := 0
	var what []string
	for _, st := range found {
		total += st.messages
		what = append(what, fmt.Sprintf("%s (%d events)", st.name, st.messages))
	}
	fmt.Fprintf(c.App.Writer, "%s; removing drops %d events\n", strings.Join(what, ", "), total)
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
	api, apiErr := brokerapi.New(url, c.String("management-url"), nil)
	for _, st := range found {
		// Quorum queues take no if-unused delete: asked again just before.
		if now, exists, err := inspectQueue(conn, st.name); err != nil || !exists || now.consumers > 0 {
			return fmt.Errorf("queue %s changed while asking (%s): not removed: %v", st.name, again, err)
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
		policy := runtime.QueuePolicyName(st.name)
		err = apiErr
		if err == nil {
			err = api.DeletePolicy(ctx, policy)
		}
		if err != nil {
			fmt.Fprintf(c.App.ErrWriter, "meshctl: the queue's policy %s was not checked (%v); delete it by hand if it exists\n", policy, err)
		}
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

// nodeCommand is `meshctl node`: what the broker keeps of a node.
func nodeCommand() *cli.Command {
	return &cli.Command{
		Name:  "node",
		Usage: "what the broker keeps of a node",
		Subcommands: []*cli.Command{{
			Name: "remove",
			Usage: "delete what the broker keeps of a node that is gone for good: each of its modules' queues (NODE.MODULE.events, " +
				"NODE.MODULE.dead, with their bindings and the events waiting in them), its due queue (mesh.node.NODE.due) and " +
				"their queue policies; a stopped node's queues otherwise keep filling with what its modules subscribed to. Refuses " +
				"a node that runs (it holds its lock queue) or a queue with a consumer. Says how many events it drops and asks " +
				"first (--yes does not). The queues are listed through the management API",
			ArgsUsage: "NODE",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "yes", Usage: "do not ask: delete at once"},
				&cli.StringFlag{Name: "management-url", EnvVars: []string{"MESH_MANAGEMENT_URL"},
					Usage: "the broker's management API, which lists the queues (default: the AMQP host, port 15672; the AMQP URL's user)"},
			},
			Action: nodeRemove,
		}},
	}
}

// nodeQueue says whether queue is one node declares for itself and its
// modules and nobody else uses: a module's event or dead-letter queue (or
// the temporary queue of its migration), or its due queue. Node and module
// names are single words, so NODE.MODULE.events is no other node's.
func nodeQueue(node, queue string) bool {
	if queue == delay.DueQueue(node) {
		return true
	}
	rest, ok := strings.CutPrefix(queue, node+".")
	if !ok {
		return false
	}
	for _, suffix := range []string{".events", ".dead", ".events.migrating"} {
		if module, ok := strings.CutSuffix(rest, suffix); ok && wire.ValidateWord("module", module) == nil {
			return true
		}
	}
	return false
}

func nodeRemove(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("node remove wants NODE, got %d arguments", c.NArg())
	}
	node := c.Args().First()
	if err := wire.ValidateWord("node name", node); err != nil {
		return usagef("node remove wants a node's name (as meshctl nodes lists them): %v", err)
	}
	ctx, conn, url, done, err := brokerSessionAt(c)
	if err != nil {
		return err
	}
	defer done()
	// A running node holds its lock queue, exclusive to its connection:
	// the broker refuses anyone else even a passive declare of it.
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close() // the broker closes it on a refusal
	_, err = ch.QueueDeclarePassive(wire.NodeLockQueue(node), false, false, true, false, nil)
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
	case err == nil || errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
		return fmt.Errorf("node %s runs (it holds its lock queue %s): stop its meshd first", node, wire.NodeLockQueue(node))
	default:
		return fmt.Errorf("is node %s running? its lock queue %s: %w", node, wire.NodeLockQueue(node), err)
	}
	api, err := brokerapi.New(url, c.String("management-url"), nil)
	if err != nil {
		return err
	}
	queues, err := api.Queues(ctx)
	if err != nil {
		return fmt.Errorf("list the queues through the management API (give --management-url, or use meshctl module remove NODE.MODULE for each module): %w", err)
	}
	var found []moduleQueueState
	for _, q := range queues {
		if !nodeQueue(node, q.Name) {
			continue
		}
		st, exists, err := inspectQueue(conn, q.Name)
		if err != nil {
			return err
		}
		if !exists {
			continue
		}
		if st.consumers > 0 {
			return fmt.Errorf("queue %s has %d consumer(s): node %s still runs; stop its meshd first", q.Name, st.consumers, node)
		}
		found = append(found, st)
	}
	if len(found) == 0 {
		fmt.Fprintf(c.App.Writer, "node %s has no queues in virtual host %s: nothing to remove\n", node, api.VHost())
		return nil
	}
	slices.SortFunc(found, func(a, b moduleQueueState) int { return strings.Compare(a.name, b.name) })
	fmt.Fprintf(c.App.Writer, "node %s: ", node)
	return removeQueues(ctx, c, conn, url, found, "node "+node+" started again?")
}
