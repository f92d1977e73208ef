package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/queuemove"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// queueCommand is meshctl queue: the module queues' settings.
func queueCommand() *cli.Command {
	return &cli.Command{
		Name:  "queue",
		Usage: "a module queue's settings",
		Subcommands: []*cli.Command{{
			Name: "migrate",
			Usage: "move a module's queue to the settings its entry in the node's config gives it, with its messages, where RabbitMQ " +
				"cannot change them in place (queue_type, max_priority, or a queue of v0.1.0 whose attempt limit is an argument, to a " +
				"limit by policy): its messages go to a temporary queue QUEUE.migrating, with confirms, the module stops consuming " +
				"(the node lets go at its next consumer check), the queue is declared anew and bound as before, and the messages " +
				"come back. Run it again to resume one that was interrupted. max_attempts alone needs no migration on a node that " +
				"keeps policies: reload it (ADR 43)",
			Flags: []cli.Flag{configFlag(),
				&cli.StringFlag{Name: "module", Required: true, Usage: "the module `NAME` whose queue moves (an entry of the config)"},
				&cli.StringFlag{Name: "node", Usage: "the node's `NAME` (default: the config's)"},
				&cli.StringFlag{Name: "management-url", EnvVars: []string{"MESH_MANAGEMENT_URL"},
					Usage: "the broker's management API, http(s)://HOST:PORT (default: the AMQP host, port 15672; the AMQP URL's user)"},
				&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "how long to wait for the queue's consumers to go"}},
			Action: queueMigrate,
		}},
	}
}

// queueMigrate is meshctl queue migrate.
func queueMigrate(c *cli.Context) error {
	f, objs, err := nodeObjects(c)
	if err != nil {
		return err
	}
	module := c.String("module")
	queue := wire.ModuleQueue(f.Node, module)
	var target *runtime.BrokerObject
	for i, o := range objs {
		if o.Kind == "queue" && o.Name == queue {
			target = &objs[i]
		}
	}
	if target == nil {
		return usagef("%s has no module %q", c.String("config"), module)
	}
	if !c.IsSet("amqp-url") && !c.IsSet("amqp-urls") && f.AMQPURL != "" {
		if err := c.Set("amqp-url", f.AMQPURL); err != nil {
			return err
		}
	}
	ctx, conn, url, done, err := brokerSessionAt(c)
	if err != nil {
		return err
	}
	defer done()
	tc, err := tlsSettings(c).ClientConfig()
	if err != nil {
		return err
	}
	api, err := brokerapi.New(url, c.String("management-url"), tc)
	if err != nil {
		return err
	}
	plan := queuemove.Plan{Queue: queue, Temp: runtime.MigrationQueue(queue), Args: target.Args}
	if f.Runtime().QueuePolicies {
		can, err := api.CanSetPolicies(ctx)
		if err != nil {
			return fmt.Errorf("the management API (it reads the queue's bindings and arguments): %w", err)
		}
		if declared, limits := runtime.PolicyArgs(target.Args); limits != nil && can {
			p := runtime.QueuePolicy(queue, limits)
			plan.Policy = &p
			if f.Runtime().QueueLimitPolicyOnly {
				// Without the argument, as the node declares a new queue
				// then; with it otherwise, so v0.1.0 may declare it (ADR 43).
				plan.Args = declared
			}
		}
	}
	w := c.App.Writer
	m := &queuemove.Mover{Conn: conn, API: api, ConsumerWait: c.Duration("wait"),
		Progress: func(step string) { fmt.Fprintln(w, escape(step)) }}
	rep, err := m.Migrate(ctx, plan)
	if errors.Is(err, queuemove.ErrNoQueue) {
		return fmt.Errorf("%w: the node declares it when the module starts; there is nothing to move", err)
	}
	if err != nil {
		return fmt.Errorf("migrate %s (run the same command again to resume): %w", queue, err)
	}
	if rep.Already {
		fmt.Fprintf(w, "%s already has the arguments its entry gives it: %s\n", queue, argsText(plan.Args))
		return nil
	}
	fmt.Fprintf(w, "%s migrated to %s", queue, argsText(plan.Args))
	if plan.Policy != nil {
		fmt.Fprintf(w, ", attempt limit in policy %s", plan.Policy.Name)
	}
	fmt.Fprintf(w, " (%d bindings; %d messages moved back)\n", len(rep.Bindings), rep.MovedIn)
	return nil
}
