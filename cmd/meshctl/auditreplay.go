package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/replay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime/nodeconfig"
	"github.com/meshkit/mesh/sdk"
)

// auditReplayCommand is `meshctl audit replay`.
func auditReplayCommand(timeout cli.Flag) *cli.Command {
	return &cli.Command{
		Name:  "replay",
		Usage: "send the events a filter selects onto the mesh again, with their ids, headers and bodies, up to a cutoff fixed at the start",
		Description: "Events stored after the replay starts are never included, so a replay never replays itself. Each goes out with\n" +
			"its original id, headers and body plus x-replay-id, persistent and confirmed, to mesh.events (every subscriber) or,\n" +
			"with --target NODE.MODULE, to that module's queue only. Consumers' de-duplication by id still applies. Events that\n" +
			"break the wire contract are not replayed. The audit logger records each event sent as a fate of the event.\n\n" +
			"With --history the events come from the mesh's history stream (history.stream in --config, or --stream), by emit\n" +
			"time: the cutoff is a marker the replay writes into the stream, and only what the stream holds before it is sent.\n" +
			"The stream is read from 5 minutes before --from (its start without --from) to the marker, and filtered by --from,\n" +
			"--to, --type, --source, --node, --user and --id; earlier replays' copies are skipped. The audit logger, if one\n" +
			"answers, records what was sent; a dry run does not ask it (and writes its marker all the same).",
		Flags: append(auditFilterFlags(),
			&cli.StringFlag{Name: "target", Value: wire.ExchangeEvents, Usage: "`mesh.events`, or NODE.MODULE (its queue NODE.MODULE.events) for one module only"},
			&cli.Float64Flag{Name: "factor", Usage: "keep the original spacing of the events (their emit times), `F` times faster (1: as recorded)"},
			&cli.BoolFlag{Name: "original", Usage: "keep the original spacing (--factor 1)"},
			&cli.DurationFlag{Name: "delay", Usage: "put `D` between one event and the next"},
			&cli.Float64Flag{Name: "rate", Usage: "send at most `N` events a second"},
			&cli.BoolFlag{Name: "dry-run", Usage: "list what would be replayed; send nothing"},
			&cli.BoolFlag{Name: "progress", EnvVars: []string{"MESH_PROGRESS"},
				Usage: fmt.Sprintf("show a progress bar on stderr even when it is not a terminal (on a terminal it shows past %d events)", progressThreshold)},
			&cli.IntFlag{Name: "page", Value: store.MaxPage, Usage: "events read from the audit logger (or the stream, with --history) at a time (at most 1000)"},
			&cli.BoolFlag{Name: "history", Usage: "read the events from the mesh's history stream (history.stream in the config) by time, instead of the audit logger's index"},
			&cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Usage: "the node's configuration `FILE` (mesh.yaml), for --history: its history.stream"},
			&cli.StringFlag{Name: "stream", Usage: "with --history, the history stream's `NAME` (default: history.stream in --config)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON for machines"},
			timeout),
		Action: auditReplay,
	}
}

// auditLog is the audit logger, through its tools (call), as the log a
// replay reads and records to: the events f selects, page at a time.
type auditLog struct {
	call func(tool string, req, resp any) error
	f    store.Filter
	page int
}

func (l *auditLog) Cutoff(context.Context) (int64, error) {
	var st store.Stats
	err := l.call(auditlogger.ToolStats, nil, &st)
	return st.LastSeq, err
}

func (l *auditLog) Count(_ context.Context, upTo int64) (int64, error) {
	f := l.f
	f.UpTo = upTo
	var n int64
	err := l.call(auditlogger.ToolCount, f, &n)
	return n, err
}

func (l *auditLog) Page(_ context.Context, after, upTo int64) ([]replay.Event, int64, error) {
	f := l.f
	f.UpTo = upTo
	var page auditlogger.QueryResponse
	if err := l.call(auditlogger.ToolQuery, auditlogger.QueryRequest{Filter: f, Page: store.Page{After: after, Limit: l.page}}, &page); err != nil {
		return nil, 0, err
	}
	evs := make([]replay.Event, len(page.Events))
	for i, ev := range page.Events {
		evs[i] = replay.Event{ID: ev.ID, Type: ev.Type, Headers: ev.Headers, Body: ev.Body, Time: ev.Time, UserID: ev.UserID}
	}
	return evs, page.Next, nil
}

func (l *auditLog) Record(_ context.Context, replayID, destination string, sent []replay.Sent) error {
	for start := 0; start < len(sent); start += auditlogger.MaxReplayedPerCall {
		req := auditlogger.ReplayedRequest{ReplayID: replayID, Destination: destination}
		for _, s := range sent[start:min(start+auditlogger.MaxReplayedPerCall, len(sent))] {
			req.Sent = append(req.Sent, auditlogger.ReplayedEvent{ID: s.ID, Time: s.Time})
		}
		if err := l.call(auditlogger.ToolReplayed, req, nil); err != nil {
			return err
		}
	}
	return nil
}

// replayTarget reads --target: mesh.events, NODE.MODULE or a module's
// queue name. It returns the queue, or "" for mesh.events.
func replayTarget(s string) (string, error) {
	if s == wire.ExchangeEvents || s == "" {
		return "", nil
	}
	words := strings.Split(s, ".")
	if len(words) == 3 && words[2] == "events" {
		words = words[:2]
	}
	if len(words) != 2 {
		return "", usagef("--target %q: want mesh.events or NODE.MODULE", s)
	}
	for _, w := range []struct{ what, name string }{{"node name", words[0]}, {"module name", words[1]}} {
		if err := wire.ValidateWord(w.what, w.name); err != nil {
			return "", fmt.Errorf("--target %q: %w", s, err)
		}
	}
	queue := wire.ModuleQueue(words[0], words[1])
	if err := wire.ValidateQueueName(queue); err != nil {
		return "", fmt.Errorf("--target %q: %w", s, err)
	}
	return queue, nil
}

// replayPace reads the pace flags.
func replayPace(c *cli.Context) (replay.Pace, error) {
	p := replay.Pace{Factor: c.Float64("factor"), Delay: c.Duration("delay"), Rate: c.Float64("rate")}
	if c.Bool("original") {
		if p.Factor != 0 {
			return p, usagef("--original is --factor 1: give one of them")
		}
		p.Factor = 1
	}
	if err := p.Check(); err != nil {
		return p, fmt.Errorf("%w (--factor/--original, --delay, --rate)", err)
	}
	return p, nil
}

// historyRefused are the filter flags a replay from the history cannot
// apply: it reads the stream by time and the event's own fields, with no
// index of causes, headers or bodies, and no record of dead letters.
var historyRefused = []string{"causation", "header", "body", "malformed", "dead"}

// historyStream is the stream --history reads: --stream, or
// history.stream in --config.
func historyStream(c *cli.Context) (string, error) {
	if s := c.String("stream"); s != "" {
		return s, nil
	}
	path := c.String("config")
	if path == "" {
		return "", usagef("--history reads the mesh's history stream: give --stream NAME, or --config FILE (its history.stream)")
	}
	f, err := nodeconfig.Load(path)
	if err != nil {
		return "", err
	}
	s := f.Runtime().History.Stream
	if s == "" {
		return "", usagef("%s keeps no history (no history.stream): give --stream NAME", path)
	}
	return s, nil
}

// historyLog is the history stream as the log a replay reads, recording
// what it sends to the audit logger a (nil: none) if it answers.
func historyLog(c *cli.Context, conn *amqp.Connection, cfg replay.HistoryConfig, a *auditCaller) (*replay.HistoryLog, error) {
	if a != nil {
		switch err := a.call(auditlogger.ToolStats, nil, &store.Stats{}); {
		case errors.Is(err, sdk.ErrNoServer):
			fmt.Fprintln(c.App.ErrWriter, "meshctl: no audit logger answers: what this replay sends is not recorded")
		case err != nil:
			return nil, err
		default:
			cfg.Record = (&auditLog{call: a.call}).Record
		}
	}
	return replay.NewHistoryLog(conn, cfg)
}

func auditReplay(c *cli.Context) error {
	history := c.Bool("history")
	if history {
		for _, flag := range historyRefused {
			if c.IsSet(flag) {
				return usagef("--%s: a replay from the history (--history) selects by time, type, source, node, user and id only", flag)
			}
		}
	} else if c.IsSet("stream") {
		return usagef("--stream names the history stream --history reads: give --history too")
	}
	f, err := auditFilterOf(c)
	if err != nil {
		return err
	}
	if f.Malformed != nil && *f.Malformed {
		return errors.New("events that break the wire contract are not replayed (they would only be dead-lettered again)")
	}
	no := false
	f.Malformed = &no
	queue, err := replayTarget(c.String("target"))
	if err != nil {
		return err
	}
	pace, err := replayPace(c)
	if err != nil {
		return err
	}
	if n := c.Int("page"); n <= 0 || n > store.MaxPage {
		return usagef("--page %d: want 1 to %d", n, store.MaxPage)
	}
	o := replay.Options{Queue: queue, Pace: pace, DryRun: c.Bool("dry-run"), Progress: progressOf(c)}
	if !o.DryRun {
		o.ID = ulid.Make().String()
	}
	var hc replay.HistoryConfig
	if history {
		if hc.Stream, err = historyStream(c); err != nil {
			return err
		}
		hc.PageSize, hc.MarkerID = c.Int("page"), o.ID
		hc.Selection = replay.HistorySelection{From: f.From, To: f.To, Types: f.Types, Sources: f.Sources, Nodes: f.Nodes, UserIDs: f.UserIDs, IDs: f.IDs}
		if err := hc.Validate(); err != nil {
			return &usageError{err}
		}
	}
	var a *auditCaller // a dry run from the history needs no audit logger
	if !history || !o.DryRun {
		if a, err = newAuditCaller(c); err != nil {
			return err
		}
		defer a.close()
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	var log replay.Log
	cutoff := func(res replay.Result) string { return fmt.Sprintf("seq %d", res.Cutoff) }
	if history {
		if log, err = historyLog(c, conn, hc, a); err != nil {
			return err
		}
		cutoff = func(res replay.Result) string {
			return fmt.Sprintf("offset %d of stream %s", res.Cutoff, escape(hc.Stream))
		}
	} else {
		log = &auditLog{call: a.call, f: f, page: c.Int("page")}
	}

	w := c.App.Writer
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if o.DryRun {
		if !c.Bool("json") {
			fmt.Fprintln(tw, "EMITTED\tTYPE\tSOURCE\tID")
		}
		o.Listed = func(ev replay.Event) {
			if c.Bool("json") {
				_ = json.NewEncoder(jsonWriter{w}).Encode(map[string]any{"id": ev.ID, "type": ev.Type, "time": ev.Time, "source": ev.Headers[wire.HeaderSource]})
				return
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", timeText(ev.Time), escape(ev.Type), escape(ev.Headers[wire.HeaderSource]), escape(ev.ID))
		}
	}
	res, err := replay.Run(ctx, conn, log, o)
	_ = tw.Flush()
	if err != nil {
		if res.Sent > 0 {
			fmt.Fprintf(c.App.ErrWriter, "replay %s stopped after %d of %d events\n", res.ID, res.Sent, res.Selected)
		}
		return err
	}
	if c.Bool("json") {
		if o.DryRun {
			return nil
		}
		out := map[string]any{"replay_id": res.ID, "destination": res.Destination, "cutoff": res.Cutoff, "sent": res.Sent}
		if history {
			out["stream"] = hc.Stream
		}
		return json.NewEncoder(jsonWriter{w}).Encode(out)
	}
	if o.DryRun {
		_, err = fmt.Fprintf(w, "would replay %d events to %s (cutoff: %s); nothing sent\n", res.Selected, res.Destination, cutoff(res))
		return err
	}
	_, err = fmt.Fprintf(w, "replayed %d events to %s as replay %s (cutoff: %s)\n", res.Sent, res.Destination, res.ID, cutoff(res))
	return err
}
