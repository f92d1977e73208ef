package main

import (
	"encoding/json"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/wire"
)

// delayedCommand is `meshctl delayed`: what waits in the delay cascade
// (ADR 32).
func delayedCommand() *cli.Command {
	return &cli.Command{
		Name:  "delayed",
		Usage: "see what waits in the delay cascade (delayed events and retries, sdk.After, sdk.At)",
		Subcommands: []*cli.Command{{
			Name: "count",
			Usage: "count the events waiting in each delay level, by how long that level holds them, and those due and not yet " +
				"delivered in the due queue of each --due-of node; exits 1 if the cascade is not declared",
			Flags: []cli.Flag{
				&cli.StringSliceFlag{Name: "due-of", Usage: "also count what came due for the node `NAME` and its mover has not delivered yet (repeat for more)"},
				&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			},
			Action: delayedCount,
		}},
	}
}

// delayedCounts is what delayed count prints as JSON.
type delayedCounts struct {
	// Waiting is the events in the levels, and Levels each non-empty
	// level's: an event in level N has at most 2^(N+1)−1 s left.
	Waiting int          `json:"waiting"`
	Levels  []levelCount `json:"levels"`
	// Due is, by node, what came due and waits for its mover.
	Due map[string]int `json:"due,omitempty"`
}

type levelCount struct {
	Queue    string `json:"queue"`
	Seconds  int64  `json:"seconds"` // the level's TTL
	Messages int    `json:"messages"`
}

// delayedCount reads the depths with passive declares: the levels cannot
// be browsed without taking what waits, so it counts, and by level, not
// by type or source (ADR 32).
func delayedCount(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("delayed count takes no arguments, got %q", c.Args().Slice())
	}
	nodes := c.StringSlice("due-of")
	for _, n := range nodes {
		if err := wire.ValidateWord("node", n); err != nil {
			return usagef("--due-of: %v", err)
		}
	}
	_, conn, _, done, err := brokerSessionAt(c)
	if err != nil {
		return err
	}
	defer done()
	depth := func(queue string) (int, error) {
		ch, err := conn.Channel() // a 404 closes the channel: one each
		if err != nil {
			return 0, err
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return 0, fmt.Errorf("queue %s does not exist: no node with delays on has run on this virtual host", queue)
		}
		return q.Messages, err
	}
	var out delayedCounts
	for _, l := range delay.AllLevels() {
		n, err := depth(l.Name)
		if err != nil {
			return err
		}
		out.Waiting += n
		if n > 0 {
			out.Levels = append(out.Levels, levelCount{Queue: l.Name, Seconds: int64(l.TTL.Seconds()), Messages: n})
		}
	}
	for _, node := range nodes {
		n, err := depth(delay.DueQueue(node))
		if err != nil {
			return fmt.Errorf("node %s: %w (has it run with delays on?)", node, err)
		}
		if out.Due == nil {
			out.Due = map[string]int{}
		}
		out.Due[node] = n
	}
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{c.App.Writer}).Encode(out)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "waiting in the delay cascade: %d\n", out.Waiting)
	for _, l := range out.Levels {
		fmt.Fprintf(w, "  %-14s %8d  (each with at most %s left)\n", l.Queue, l.Messages, left(2*l.Seconds-1))
	}
	for _, node := range nodes {
		fmt.Fprintf(w, "due for node %s, not yet delivered: %d\n", node, out.Due[node])
	}
	return nil
}

// left says s seconds in the largest unit that keeps it readable.
func left(s int64) string {
	switch {
	case s < 2*60:
		return fmt.Sprintf("%d s", s)
	case s < 2*3600:
		return fmt.Sprintf("%d min", s/60)
	case s < 2*86400:
		return fmt.Sprintf("%d h", s/3600)
	case s < 2*365*86400:
		return fmt.Sprintf("%d days", s/86400)
	}
	return fmt.Sprintf("%d years", s/(365*86400))
}
