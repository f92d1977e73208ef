package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// repartitionCommand is `meshctl groups repartition GROUP MODULE N`: a live
// change of an ordered group's partition count (ADR 48).
func repartitionCommand() *cli.Command {
	return &cli.Command{
		Name:      "repartition",
		Usage:     "change an ordered group's partition count live (1 to 64; 16 -> 32 and back, say), keeping every key's order: the group's intake member makes the change (new partitions, the old ones retired once what they hold is handled, events that arrive meanwhile held in catch-up queues until then); waits until the change is over (--wait)",
		ArgsUsage: "GROUP MODULE PARTITIONS",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "how long to wait for the change to be over (the old partitions and the catch-up queues handled and gone); 0 returns once it is asked for"},
		},
		Action: repartition,
	}
}

func repartition(c *cli.Context) error {
	if c.NArg() != 3 {
		return usagef("repartition takes GROUP MODULE PARTITIONS, got %q", c.Args().Slice())
	}
	group, module := c.Args().Get(0), c.Args().Get(1)
	if err := wire.ValidateWord("group", group); err != nil {
		return usagef("%v", err)
	}
	if err := wire.ValidateWord("module name", module); err != nil {
		return usagef("%v", err)
	}
	n, err := strconv.Atoi(c.Args().Get(2))
	if err != nil || n < 1 || n > wire.Slots {
		return usagef("PARTITIONS must be 1 to %d, got %q", wire.Slots, c.Args().Get(2))
	}
	conn, url, err := dialBroker(c, "meshctl groups repartition")
	if err != nil {
		return err
	}
	defer conn.Close()
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return fmt.Errorf("read the broker's address: %w", err)
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	began := time.Now()
	e, err := runtime.StartRepartition(ctx, conn, uri.Username, group, module, n)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "group %s (module %s): asked to change from %d to %d partitions (epoch %d)\n", group, module, e.Previous, e.Partitions, e.Number)
	wait := c.Duration("wait")
	if wait == 0 {
		return nil
	}
	deadline := time.Now().Add(wait)
	for {
		got, err := runtime.ReadGroupEpoch(conn, group, module, e.Number-1, e.Previous)
		if err != nil {
			return err
		}
		if got.Number >= e.Number && len(got.Pending) == 0 {
			fmt.Fprintf(c.App.Writer, "done in %v: %d partitions, %s..p%03d\n", time.Since(began).Round(time.Millisecond), got.Partitions,
				wire.PartitionQueueOf(group, module, got.Number, 0), got.Partitions-1)
			return nil
		}
		if time.Now().After(deadline) {
			what := "no member of the group has made it yet (is one running?)"
			if got.Number >= e.Number {
				what = fmt.Sprintf("%d queues of the change are still there, %s first (what they hold is being handled)", len(got.Pending), got.Pending[0])
			}
			return fmt.Errorf("the change to %d partitions is not over after %v: %s; it goes on without meshctl (meshctl groups shows it)", n, wait, what)
		}
		select {
		case <-c.Context.Done():
			return c.Context.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
