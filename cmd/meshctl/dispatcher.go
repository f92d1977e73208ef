package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/modules/dispatcher"
)

// dispatcherCommand reads a dispatcher's firing record (its tool
// dispatcher.fires over mesh.rpc, from any node).
func dispatcherCommand() *cli.Command {
	return &cli.Command{
		Name:  "dispatcher",
		Usage: "what the dispatcher's triggers did; pause and resume them",
		Subcommands: []*cli.Command{{
			Name:      "fires",
			Usage:     "list the firings of a trigger (or of all), oldest first: message id, routing key, attempt, outcome, detail",
			ArgsUsage: "[TRIGGER]",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "limit", Value: 100, Usage: "firings per page (at most 1000)"},
				&cli.Int64Flag{Name: "after", Usage: "start after this `SEQ`"},
				&cli.BoolFlag{Name: "all", Usage: "follow the pages to the end"},
				&cli.BoolFlag{Name: "json", Usage: "print JSON lines for machines"},
				&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the dispatcher's answer"},
			},
			Action: dispatcherFires,
		}, {
			Name:      "pause",
			Usage:     "stop a queue trigger consuming; its queue keeps its messages, and it stays paused across restarts",
			ArgsUsage: "TRIGGER",
			Flags:     []cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the dispatcher's answer"}},
			Action:    func(c *cli.Context) error { return dispatcherPause(c, dispatcher.ToolPause) },
		}, {
			Name:      "resume",
			Usage:     "start a paused trigger consuming again",
			ArgsUsage: "TRIGGER",
			Flags:     []cli.Flag{&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the dispatcher's answer"}},
			Action:    func(c *cli.Context) error { return dispatcherPause(c, dispatcher.ToolResume) },
		}},
	}
}

func dispatcherPause(c *cli.Context, tool string) error {
	if c.NArg() != 1 {
		return usagef("%s wants one TRIGGER, got %d arguments", c.Command.Name, c.NArg())
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	node, err := connect(ctx, c)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	var r dispatcher.PauseResponse
	if err := node.Call(ctx, "meshctl", tool, dispatcher.PauseRequest{Trigger: c.Args().First()}, &r); err != nil {
		return dispatcherErr(err)
	}
	state := "consuming"
	if r.Paused {
		state = "paused: its queue keeps its messages"
	}
	_, err = fmt.Fprintf(c.App.Writer, "trigger %s %s\n", escape(r.Trigger), state)
	return err
}

func dispatcherFires(c *cli.Context) error {
	if c.NArg() > 1 {
		return usagef("fires wants at most one TRIGGER, got %d arguments", c.NArg())
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	node, err := connect(ctx, c)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	req := dispatcher.FiresRequest{Trigger: c.Args().First(), After: c.Int64("after"), Limit: c.Int("limit")}
	w := c.App.Writer
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !c.Bool("json") {
		fmt.Fprintln(tw, "SEQ\tTIME\tTRIGGER\tMESSAGE\tROUTING KEY\tATTEMPT\tOUTCOME\tDETAIL")
	}
	enc := json.NewEncoder(jsonWriter{w})
	for {
		var page dispatcher.FiresResponse
		callCtx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
		err := node.Call(callCtx, "meshctl", dispatcher.ToolFires, req, &page)
		cancel()
		if err != nil {
			return dispatcherErr(err)
		}
		for _, f := range page.Fires {
			if c.Bool("json") {
				if err := enc.Encode(f); err != nil {
					return err
				}
				continue
			}
			redelivered := ""
			if f.Redelivered {
				redelivered = " (redelivered)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d%s\t%s\t%s\n", f.Seq, timeText(f.Time), escape(f.Trigger), escape(f.MessageID), escape(f.RoutingKey),
				f.Attempt, redelivered, escape(f.Outcome), escape(f.Detail))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if page.Next == 0 {
			return nil
		}
		if !c.Bool("all") {
			if !c.Bool("json") {
				fmt.Fprintf(w, "more: --after %d\n", page.Next)
			}
			return nil
		}
		req.After = page.Next
	}
}

// dispatcherErr says where to look when the dispatcher does not answer.
func dispatcherErr(err error) error {
	return fmt.Errorf("ask the dispatcher (is a dispatcher module running, with tools: [\"dispatcher.*\"]?): %w", err)
}
