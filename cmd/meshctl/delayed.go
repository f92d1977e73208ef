package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// delayedCommand is `meshctl delayed`: what waits in the delay cascade
// (ADR 32).
func delayedCommand() *cli.Command {
	return &cli.Command{
		Name:  "delayed",
		Usage: "see what waits in the delay cascade (delayed events and retries, sdk.After, sdk.At)",
		Subcommands: []*cli.Command{{
			Name:  "ls",
			Usage: "list what the node --via scheduled and has not delivered yet (delayed events and retries), soonest due first",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "via", Required: true, Usage: "the `NODE` whose schedules to list (each node lists what it scheduled)"},
				&cli.StringFlag{Name: "type", Usage: "only events whose type matches the AMQP topic `PATTERN`"},
				&cli.StringFlag{Name: "source", Usage: "only events emitted by `SOURCE` (a module, meshctl)"},
				&cli.IntFlag{Name: "limit", Value: 1000, Usage: "list at most `N`"},
				&cli.BoolFlag{Name: "json", Usage: "print one JSON object per line"},
			},
			Action: delayedLs,
		}, {
			Name:      "cancel",
			Usage:     "cancel a delayed event the node --via scheduled, before it is due: its mover drops it then; exits 1 if the node does not hold it (delivered already, or scheduled elsewhere)",
			ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "via", Required: true, Usage: "the `NODE` that scheduled it"},
			},
			Action: delayedCancel,
		}, {
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

// delayedLs asks the node's delays module for its book.
func delayedLs(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("delayed ls takes no arguments, got %q", c.Args().Slice())
	}
	var list runtime.DelayedList
	req := runtime.DelayedListRequest{Type: c.String("type"), Source: c.String("source"), Limit: c.Int("limit")}
	if err := callDelays(c, "ls", req, &list); err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(jsonWriter{c.App.Writer})
		for _, e := range list.Entries {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tDUE\tIN\tTYPE\tSOURCE\tNOTE")
	now := time.Now()
	for _, e := range list.Entries {
		retry := ""
		if e.Queue != "" {
			retry = fmt.Sprintf("a retry into %s, after %d attempts", e.Queue, e.Attempts)
		}
		if e.Cancelled {
			retry = strings.TrimPrefix(retry+"; cancelled", "; ")
		}
		// The entries come from the node's book: its ids, types and
		// sources are escaped as any broker text is.
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", escape(e.ID), e.Due.UTC().Format(time.RFC3339), e.Due.Sub(now).Round(time.Second),
			escape(e.Type), escape(e.Source), escape(retry))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if list.Total > len(list.Entries) {
		fmt.Fprintf(c.App.ErrWriter, "meshctl: %d of %d listed (--limit)\n", len(list.Entries), list.Total)
	}
	return nil
}

// delayedCancel asks the node's delays module to cancel one event.
func delayedCancel(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("delayed cancel wants one ID, got %d arguments", c.NArg())
	}
	var e schedbookEntry
	if err := callDelays(c, "cancel", runtime.DelayedCancelRequest{ID: c.Args().Get(0)}, &e); err != nil {
		return err
	}
	via := c.String("via")
	fmt.Fprintf(c.App.Writer, "cancelled %s (%s, due %s): node %s drops it when it comes due\n",
		escape(e.ID), escape(e.Type), e.Due.UTC().Format(time.RFC3339), via)
	return nil
}

// schedbookEntry is the part of a book entry cancel prints.
type schedbookEntry struct {
	ID, Type string
	Due      time.Time
}

// callDelays calls the tool what of the delays module of the node --via,
// as meshctl; a node that answers none is named with the likely reason.
func callDelays(c *cli.Context, what string, req, resp any) error {
	via := c.String("via")
	if err := wire.ValidateWord("node", via); err != nil {
		return usagef("--via: %v", err)
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	node, err := connect(ctx, c)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	err = node.Call(ctx, "meshctl", runtime.DelayedTool(via, what), req, resp)
	if errors.Is(err, sdk.ErrNoServer) {
		return fmt.Errorf("node %s answers no %s: it does not run, or runs without delays: %w", via, runtime.DelayedTool(via, "*"), err)
	}
	return err
}
