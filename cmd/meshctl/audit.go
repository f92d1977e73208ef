package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/cmd/meshctl/console"
	"github.com/meshkit/mesh/internal/csvsafe"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// auditCommand asks the audit logger (its tools over mesh.rpc, from any
// node) what happened on the mesh.
// auditTimeoutFlag is --timeout of the commands that ask the audit logger.
func auditTimeoutFlag() *cli.DurationFlag {
	return &cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the audit logger's answer"}
}

func auditCommand() *cli.Command {
	cmd := auditCommands()
	// Every command that asks the audit logger (those with --timeout) may
	// name which one, where several serve.
	logger := &cli.StringFlag{Name: "logger", EnvVars: []string{"MESH_AUDIT_LOGGER"},
		Usage: "ask the audit logger of node `NODE`, where several serve (by default whichever answers first; every later call of the command goes to the same one)"}
	var add func([]*cli.Command)
	add = func(cmds []*cli.Command) {
		for _, sc := range cmds {
			if slices.ContainsFunc(sc.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), "timeout") }) {
				sc.Flags = append(sc.Flags, logger)
			}
			add(sc.Subcommands)
		}
	}
	add(cmd.Subcommands)
	return cmd
}

func auditCommands() *cli.Command {
	timeout := auditTimeoutFlag()
	asJSON := &cli.BoolFlag{Name: "json", Usage: "print JSON for machines"}
	return &cli.Command{
		Name:  "audit",
		Usage: "ask the audit logger what happened: query, count, get, trace, export, replay, stats",
		Subcommands: []*cli.Command{
			{
				Name:  "query",
				Usage: "list the events a filter selects, oldest first, a page at a time",
				Flags: append(auditFilterFlags(),
					&cli.IntFlag{Name: "limit", Value: 50, Usage: "events per page (at most 1000)"},
					&cli.Int64Flag{Name: "after", Usage: "start after this `SEQ` (the cursor a page printed)"},
					&cli.BoolFlag{Name: "all", Usage: "follow the pages to the end, printing as they come"},
					asJSON, timeout),
				Action: auditQuery,
			},
			{
				Name:   "count",
				Usage:  "count the events a filter selects",
				Flags:  append(auditFilterFlags(), &cli.BoolFlag{Name: "json", Usage: "print one JSON object: {\"count\":N}"}, timeout),
				Action: auditCount,
			},
			{
				Name:      "get",
				Usage:     "print one event: its fields, what became of it, its headers and its body",
				ArgsUsage: "ID",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the event as one JSON object, as the audit logger answers it"}, timeout},
				Action:    auditGet,
			},
			{
				Name:      "trace",
				Usage:     "draw the causal chain of an event: what caused it, and what it caused; or, with --key, list a key's events in order",
				ArgsUsage: "ID | --key KEY",
				Flags: []cli.Flag{&cli.IntFlag{Name: "depth", Usage: "levels to follow each way (0: all)"},
					&cli.StringFlag{Name: "key", Usage: "list the events of `KEY` (their x-partition-key: sdk.WithKey, meshctl emit --key) in the order the audit logger received them, which is the order the broker received them and an ordered group handles them, with what became of each"},
					asJSON, timeout},
				Action: auditTrace,
			},
			{
				Name:  "export",
				Usage: "write the events a filter selects, oldest first, as JSON Lines or CSV, streamed a page at a time",
				Flags: append(auditFilterFlags(),
					&cli.StringFlag{Name: "format", Value: "jsonl", Usage: "`jsonl`, csv or cloudevents (one CloudEvents 1.0 JSON object a line, structured mode)"},
					&cli.StringFlag{Name: "out", Usage: "write to `FILE` instead of standard output"},
					timeout),
				Action: auditExport,
			},
			auditReplayCommand(timeout),
			{
				Name:   "stats",
				Usage:  "rows, bytes, oldest and newest arrivals",
				Flags:  []cli.Flag{asJSON, timeout},
				Action: auditStats,
			},
			auditVerifyCommand(asJSON, timeout),
		},
	}
}

func auditFilterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "type", Usage: "AMQP topic `PATTERN` of the type (repeat for any of several)"},
		&cli.StringSliceFlag{Name: "source", Usage: "emitter `NAME`"},
		&cli.StringSliceFlag{Name: "node", Usage: "emitting node `NAME`"},
		&cli.StringSliceFlag{Name: "user", Usage: "broker `USER` that published it"},
		&cli.StringSliceFlag{Name: "id", Usage: "event `ID`"},
		&cli.StringSliceFlag{Name: "causation", Usage: "causing event `ID`"},
		&cli.StringSliceFlag{Name: "header", Usage: "`NAME=VALUE` of a header"},
		&cli.StringSliceFlag{Name: "body", Usage: "`PATH=JSON` of a body field (order.id=42)"},
		&cli.StringFlag{Name: "from", Usage: "emitted at or after `TIME` (RFC 3339, or a duration ago: 1h)"},
		&cli.StringFlag{Name: "to", Usage: "emitted before `TIME` (RFC 3339, or a duration ago)"},
		&cli.BoolFlag{Name: "malformed", Usage: "only events that break the wire contract"},
		&cli.BoolFlag{Name: "dead", Usage: "only events some queue dead-lettered"},
	}
}

// auditFilterOf reads the filter flags.
func auditFilterOf(c *cli.Context) (store.Filter, error) {
	f := store.Filter{Types: c.StringSlice("type"), Sources: c.StringSlice("source"), Nodes: c.StringSlice("node"),
		UserIDs: c.StringSlice("user"), IDs: c.StringSlice("id"), CausationIDs: c.StringSlice("causation")}
	pairs := func(flag string) (map[string]string, error) {
		var m map[string]string
		for _, kv := range c.StringSlice(flag) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, usagef("--%s %q: want NAME=VALUE", flag, kv)
			}
			if m == nil {
				m = map[string]string{}
			}
			m[k] = v
		}
		return m, nil
	}
	var err error
	if f.Headers, err = pairs("header"); err != nil {
		return f, err
	}
	if f.Body, err = pairs("body"); err != nil {
		return f, err
	}
	for _, b := range []struct {
		flag string
		to   *time.Time
	}{{"from", &f.From}, {"to", &f.To}} {
		if *b.to, err = console.ParseTime(c.String(b.flag), time.Now()); err != nil {
			return f, usagef("--%s: %w", b.flag, err)
		}
	}
	yes := true
	if c.Bool("malformed") {
		f.Malformed = &yes
	}
	if c.Bool("dead") {
		f.Dead = &yes
	}
	return f, nil
}

// auditCaller calls the audit logger's tools from one short-lived node.
type auditCaller struct {
	c    *cli.Context
	node *runtime.Node
	// pinned is the node of the logger that answered first: every later
	// call of the command asks it (a cursor of one logger means nothing
	// to another); "" until one answered. warned says the several-loggers
	// warning was printed.
	pinned string
	warned bool
}

// auditRetries bounds the calls made to reach one logger among several
// (each call goes to whichever the broker hands it to).
const auditRetries = 24

// auditWrites are the audit tools that change a logger's store: they are
// never repeated to reach a given logger.
var auditWrites = []string{auditlogger.ToolReplayed}

func newAuditCaller(c *cli.Context) (*auditCaller, error) {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	node, err := connect(ctx, c)
	if err != nil {
		return nil, err
	}
	return &auditCaller{c: c, node: node}, nil
}

func (a *auditCaller) close() { _ = a.node.Close(context.Background()) }

// call calls one of the audit logger's tools, within --timeout: of the
// logger --logger names, else of the one that answered the command's first
// call. Where several loggers serve, it says once which one answered and
// what it holds.
func (a *auditCaller) call(tool string, req, resp any) error {
	ctx, cancel := context.WithTimeout(a.c.Context, a.c.Duration("timeout"))
	defer cancel()
	want := a.c.String("logger")
	if want == "" {
		want = a.pinned
	}
	tries := 1
	if want != "" && !slices.Contains(auditWrites, tool) {
		tries = auditRetries
	}
	var heard []string
	for range tries {
		var who runtime.Answerer
		var raw json.RawMessage
		if err := a.node.Call(runtime.WithAnswerer(ctx, &who), "meshctl", tool, req, &raw); err != nil {
			return auditErr(err)
		}
		if want != "" && who.Node != want {
			heard = append(heard, who.Node)
			continue
		}
		if a.pinned == "" {
			a.pinned = who.Node
			a.warnSeveral(ctx, tool)
		}
		if resp == nil || len(raw) == 0 {
			return nil
		}
		return json.Unmarshal(raw, resp)
	}
	slices.Sort(heard)
	return fmt.Errorf("the audit logger of node %s did not answer %s in %d calls (the loggers of %s did): is it running? meshctl nodes lists the nodes and their modules",
		escape(want), tool, tries, escape(strings.Join(slices.Compact(heard), ", ")))
}

// warnSeveral says, on stderr and once, that several audit loggers serve
// tool, which one answered and what it holds, and how to pick one.
func (a *auditCaller) warnSeveral(ctx context.Context, tool string) {
	if a.warned || a.c.String("logger") != "" {
		return
	}
	a.warned = true
	n, err := a.node.Servers(ctx, tool)
	if err != nil || n < 2 {
		return
	}
	holds := ""
	var st store.Stats
	if err := a.call(auditlogger.ToolStats, nil, &st); err == nil {
		holds = fmt.Sprintf(", which holds %d events", st.Events)
		if !st.OldestArrived.IsZero() {
			holds += " since " + st.OldestArrived.UTC().Format(time.RFC3339)
		}
	}
	fmt.Fprintf(a.c.App.ErrWriter, "meshctl: %d audit loggers serve %s; this is the answer of the one on node %s%s. "+
		"Loggers that each keep a queue of their own hold what each saw since it started, and differ: give every one the history stream "+
		"(docs/operator-guide.md, \"Several audit loggers\") or pick one with --logger NODE\n", n, tool, escape(a.pinned), holds)
}

// auditErr says where to look when the audit logger does not answer.
func auditErr(err error) error {
	return fmt.Errorf("ask the audit logger (is an audit-logger module running, with tools: [\"audit.*\"]?): %w", err)
}

// auditCall connects, calls one tool and disconnects.
func auditCall(c *cli.Context, tool string, req, resp any) error {
	a, err := newAuditCaller(c)
	if err != nil {
		return err
	}
	defer a.close()
	return a.call(tool, req, resp)
}

func auditQuery(c *cli.Context) error {
	f, err := auditFilterOf(c)
	if err != nil {
		return err
	}
	req := auditlogger.QueryRequest{Filter: f, Page: store.Page{After: c.Int64("after"), Limit: c.Int("limit")}}
	a, err := newAuditCaller(c)
	if err != nil {
		return err
	}
	defer a.close()
	w := c.App.Writer
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !c.Bool("json") {
		fmt.Fprintln(tw, "SEQ\tEMITTED\tTYPE\tSOURCE\tNODE\tID\t")
	}
	enc := json.NewEncoder(jsonWriter{w})
	for {
		var page auditlogger.QueryResponse
		if err := a.call(auditlogger.ToolQuery, req, &page); err != nil {
			return err
		}
		for _, ev := range page.Events {
			if c.Bool("json") {
				if err := enc.Encode(ev); err != nil {
					return err
				}
				continue
			}
			flag := ""
			if ev.Malformed != "" {
				flag = "malformed: " + ev.Malformed
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.Seq, timeText(ev.Time), escape(ev.Type), escape(ev.Source), escape(ev.Node), escape(ev.ID), escape(flag))
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
		req.Page.After = page.Next
	}
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func auditCount(c *cli.Context) error {
	f, err := auditFilterOf(c)
	if err != nil {
		return err
	}
	var n int64
	if err := auditCall(c, auditlogger.ToolCount, f, &n); err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{c.App.Writer}).Encode(struct {
			Count int64 `json:"count"`
		}{n})
	}
	_, err = fmt.Fprintln(c.App.Writer, n)
	return err
}

func auditGet(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("get wants one ID, got %d arguments", c.NArg())
	}
	var raw json.RawMessage
	if err := auditCall(c, auditlogger.ToolGet, c.Args().First(), &raw); err != nil {
		return err
	}
	if c.Bool("json") {
		// The answer as it came (a newer logger's fields kept), on one line.
		var line bytes.Buffer
		if err := json.Compact(&line, raw); err != nil {
			return fmt.Errorf("the audit logger's answer is not JSON: %w", err)
		}
		_, err := fmt.Fprintf(c.App.Writer, "%s\n", escapeJSON(line.Bytes()))
		return err
	}
	var ev store.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return fmt.Errorf("the audit logger's answer is no event: %w", err)
	}
	return printAuditEvent(c.App.Writer, ev)
}

// printAuditEvent prints ev over several lines, a key and its value on
// each: its fields, what became of it (as a trace marks it), its headers
// one per line, its body indented when it is JSON. Every value came from
// the wire or a module and goes through escape, escapeLines or
// escapeJSON.
func printAuditEvent(w io.Writer, ev store.Event) error {
	var b strings.Builder
	line := func(key, value string) {
		fmt.Fprintf(&b, "%-10s %s\n", key, indentLines(value, 11))
	}
	line("seq", strconv.FormatInt(ev.Seq, 10))
	line("id", escape(dash(ev.ID)))
	line("type", escape(dash(ev.Type)))
	line("source", escape(dash(ev.Source)))
	line("node", escape(dash(ev.Node)))
	line("user", escape(dash(ev.UserID)))
	line("time", timeText(ev.Time))
	line("causation", escape(dash(ev.CausationID)))
	line("schema", escape(dash(ev.Schema)))
	arrived := timeText(ev.Arrived)
	if ev.Redelivered {
		arrived += " (redelivered)"
	}
	line("arrived", arrived)
	if ev.Malformed != "" {
		line("malformed", escapeLines(ev.Malformed))
	}
	line("fates", dash(strings.Join(fateParts(ev.Fates), "\n")))
	b.WriteString("headers\n")
	keys := slices.Sorted(maps.Keys(ev.Headers))
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", escape(k), indentLines(escapeLines(ev.Headers[k]), 4))
	}
	b.WriteString("body\n")
	var pretty bytes.Buffer
	switch {
	case len(ev.Body) == 0:
		b.WriteString("  (empty)\n")
	case json.Indent(&pretty, ev.Body, "  ", "  ") == nil:
		b.WriteString("  " + string(escapeJSON(pretty.Bytes())) + "\n")
	default:
		fmt.Fprintf(&b, "  (not JSON, %s)\n  %s\n", countOf(len(ev.Body), "byte", "bytes"), indentLines(escapeLines(string(ev.Body)), 2))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func auditTrace(c *cli.Context) error {
	if c.IsSet("key") {
		if c.NArg() != 0 {
			return usagef("trace --key lists a key's events: it wants no ID, got %d arguments", c.NArg())
		}
		return auditTraceKey(c, c.String("key"))
	}
	if c.NArg() != 1 {
		return usagef("trace wants one ID, got %d arguments", c.NArg())
	}
	var tr store.Trace
	if err := auditCall(c, auditlogger.ToolTrace, auditlogger.TraceRequest{ID: c.Args().First(), MaxDepth: c.Int("depth")}, &tr); err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{c.App.Writer}).Encode(tr)
	}
	return drawTrace(c.App.Writer, tr)
}

// auditTraceKey lists the events of key in the order the audit logger
// received them, every page, each with what became of it.
func auditTraceKey(c *cli.Context, key string) error {
	if err := wire.CheckKey(key); err != nil || key == "" {
		return usagef("--key %q: want a key of 1 to 256 bytes of UTF-8 without control characters", key)
	}
	req := auditlogger.QueryRequest{Filter: store.Filter{Headers: map[string]string{wire.HeaderPartitionKey: key}}, Page: store.Page{Limit: 1000}}
	a, err := newAuditCaller(c)
	if err != nil {
		return err
	}
	defer a.close()
	w := c.App.Writer
	enc := json.NewEncoder(jsonWriter{w})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !c.Bool("json") {
		fmt.Fprintln(tw, "#\tSEQ\tEMITTED\tTYPE\tSOURCE\tNODE\tID\t")
	}
	n := 0
	for {
		var page auditlogger.QueryResponse
		if err := a.call(auditlogger.ToolQuery, req, &page); err != nil {
			return err
		}
		for _, ev := range page.Events {
			n++
			if c.Bool("json") {
				if err := enc.Encode(ev); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n, ev.Seq, timeText(ev.Time), escape(ev.Type), escape(ev.Source), escape(ev.Node), escape(ev.ID), strings.TrimSpace(fatesText(ev.Fates)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if page.Next == 0 {
			break
		}
		req.Page.After = page.Next
	}
	if n == 0 && !c.Bool("json") {
		fmt.Fprintf(w, "no events of key %s in the audit log\n", escape(key))
	}
	return nil
}

// fatesText says where an event died and how often it was replayed, for
// a line of a trace.
func fatesText(fates []store.Fate) string {
	var s string
	for _, p := range fateParts(fates) {
		s += "  " + p
	}
	return s
}

// fateParts are the pieces of fatesText: one per dead letter, then how
// often the event was replayed; none for an event nothing befell.
func fateParts(fates []store.Fate) []string {
	var parts []string
	replays := 0
	for _, f := range fates {
		switch f.Kind {
		case store.FateDead:
			parts = append(parts, fmt.Sprintf("✗ dead-lettered by %s (%s after %s: %s)", escape(f.Queue), escape(f.Reason), countOf(f.Attempts, "attempt", "attempts"), escape(f.Error)))
		case store.FateReplayed:
			replays++
		}
	}
	if replays > 0 {
		parts = append(parts, fmt.Sprintf("↻ replayed %d times", replays))
	}
	return parts
}

// drawTrace draws the causes above the event, oldest first, and what it
// caused below it as a tree.
func drawTrace(w io.Writer, tr store.Trace) error {
	line := func(ev store.Event) string {
		s := fmt.Sprintf("%s  %s  %s@%s  %s", escape(ev.ID), escape(ev.Type), escape(ev.Source), escape(ev.Node), timeText(ev.Time))
		if ev.Malformed != "" {
			s += "  (malformed: " + escape(ev.Malformed) + ")"
		}
		return s + fatesText(ev.Fates)
	}
	indent := ""
	if tr.MissingCause != "" {
		fmt.Fprintf(w, "%s  (not in the audit log)\n", escape(tr.MissingCause))
		indent = "  "
	}
	for i := len(tr.Causes) - 1; i >= 0; i-- {
		fmt.Fprintf(w, "%s%s\n", indent, line(tr.Causes[i]))
		indent += "  "
	}
	fmt.Fprintf(w, "%s%s  <==\n", indent, line(tr.Root.Event))
	var draw func(nodes []*store.Caused, prefix string)
	draw = func(nodes []*store.Caused, prefix string) {
		for i, n := range nodes {
			branch, next := "├─ ", "│  "
			if i == len(nodes)-1 {
				branch, next = "└─ ", "   "
			}
			fmt.Fprintf(w, "%s%s%s\n", prefix, branch, line(n.Event))
			draw(n.Caused, prefix+next)
		}
	}
	draw(tr.Root.Caused, indent)
	if tr.Truncated {
		fmt.Fprintf(w, "%s(cut: more beyond the depth or size limit)\n", indent)
	}
	return nil
}

func auditStats(c *cli.Context) error {
	var st store.Stats
	if err := auditCall(c, auditlogger.ToolStats, nil, &st); err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{c.App.Writer}).Encode(st)
	}
	_, err := fmt.Fprintf(c.App.Writer, "events %d (malformed %d), dead letters %d, replayed %d, %d bytes, arrived %s .. %s, last seq %d\n",
		st.Events, st.Malformed, st.DeadLetters, st.Replayed, st.Bytes, timeText(st.OldestArrived), timeText(st.NewestArrived), st.LastSeq)
	return err
}

// auditExport streams the selection out a page at a time: memory stays
// bounded whatever the audit log holds.
func auditExport(c *cli.Context) error {
	f, err := auditFilterOf(c)
	if err != nil {
		return err
	}
	var write func(store.Event) error
	var flush func() error
	out := c.App.Writer
	if path := c.String("out"); path != "" {
		file, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		defer file.Close()
		out = file
	}
	switch c.String("format") {
	case "jsonl":
		enc := json.NewEncoder(jsonWriter{out})
		write, flush = func(ev store.Event) error { return enc.Encode(ev) }, func() error { return nil }
	case "cloudevents":
		enc := json.NewEncoder(jsonWriter{out})
		write, flush = func(ev store.Event) error { return enc.Encode(ev.CloudEvent()) }, func() error { return nil }
	case "csv":
		w := csv.NewWriter(out)
		if err := w.Write(store.CSVHeader); err != nil {
			return err
		}
		// What anyone who can publish wrote, as cells a spreadsheet
		// shows and does not run.
		write = func(ev store.Event) error { return w.Write(csvsafe.Row(ev.CSVRecord())) }
		flush = func() error { w.Flush(); return w.Error() }
	default:
		return usagef("export: --format %q is not jsonl, csv or cloudevents", c.String("format"))
	}
	a, err := newAuditCaller(c)
	if err != nil {
		return err
	}
	defer a.close()
	req := auditlogger.QueryRequest{Filter: f, Page: store.Page{Limit: store.MaxPage}}
	for {
		var page auditlogger.QueryResponse
		if err := a.call(auditlogger.ToolQuery, req, &page); err != nil {
			return err
		}
		for _, ev := range page.Events {
			if err := write(ev); err != nil {
				return fmt.Errorf("export: %w", err)
			}
		}
		if err := flush(); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if page.Next == 0 {
			return nil
		}
		req.Page.After = page.Next
	}
}
