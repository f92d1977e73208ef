package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// keeper describes one of the two keeper queues for the commands.
type keeper struct {
	queue    string // wire.QueueDead or wire.QueueUnrouted
	dead     bool
	one, few string // "dead letter", "dead letters"
}

var (
	deadKeeper     = keeper{queue: wire.QueueDead, dead: true, one: "dead letter", few: "dead letters"}
	unroutedKeeper = keeper{queue: wire.QueueUnrouted, one: "unrouted event", few: "unrouted events"}
)

// progressThreshold is the number of messages above which a replay or purge
// shows a progress bar on a terminal by itself.
const progressThreshold = 50

// The default --limit of ls and replay: what they hold in memory at most,
// so a queue of a million messages costs a browse, not a million bodies.
const (
	defaultListLimit   = 1000
	defaultReplayLimit = 10000
)

// dlqCommand is `meshctl dlq`: the dead letters.
func dlqCommand() *cli.Command {
	return keeperCommand("dlq", deadKeeper,
		"list, show, replay or purge dead letters (events a module gave up on, kept in "+wire.QueueDead+")")
}

// unroutedCommand is `meshctl unrouted`: the events no queue was bound for.
func unroutedCommand() *cli.Command {
	return keeperCommand("unrouted", unroutedKeeper,
		"list, show, replay or purge unrouted events (events no queue was bound for, kept in "+wire.QueueUnrouted+")")
}

func keeperCommand(name string, k keeper, usage string) *cli.Command {
	// Filter flags have no MESH_ environment twins on purpose: a stray
	// variable would silently narrow what a purge or replay selects.
	filters := func() []cli.Flag {
		module, node := "only dead letters of the module `NAME` (whose queue gave up)", "only dead letters of modules on the node `NAME`"
		if !k.dead {
			module, node = "only events emitted by the module `NAME` (x-source)", "only events emitted on the node `NAME` (x-node)"
		}
		return []cli.Flag{
			&cli.StringFlag{Name: "module", Usage: module},
			&cli.StringFlag{Name: "node", Usage: node},
			&cli.StringFlag{Name: "type", Usage: "only events whose type matches the AMQP topic `PATTERN` (module.shop.#)"},
			&cli.DurationFlag{Name: "older-than", Usage: "only messages older than `DURATION` (90m, 48h)"},
			&cli.DurationFlag{Name: "newer-than", Usage: "only messages newer than `DURATION`"},
			&cli.StringSliceFlag{Name: "id", Usage: "only the message with this `ID` (repeat for more)"},
		}
	}
	progress := &cli.BoolFlag{Name: "progress", EnvVars: []string{"MESH_PROGRESS"},
		Usage: fmt.Sprintf("show a progress bar on stderr even when it is not a terminal (on a terminal it shows past %d messages)", progressThreshold)}
	dryRun := &cli.BoolFlag{Name: "dry-run", Usage: "say what would be done and change nothing"}
	replayUsage := "send the matching dead letters back to the queue that gave up on each, attempts starting over"
	if !k.dead {
		replayUsage = "publish the matching events to " + wire.ExchangeEvents + " again (if still no queue wants one, it comes back)"
	}
	return &cli.Command{
		Name:  name,
		Usage: usage,
		Subcommands: []*cli.Command{
			{
				Name:  "ls",
				Usage: "list the " + k.few + " that match the filters",
				Flags: append(filters(), &cli.BoolFlag{Name: "json", Usage: "print one JSON object per line, with headers and body"},
					&cli.IntFlag{Name: "limit", Value: defaultListLimit, Usage: "list at most `N` (0: every match, all held in memory)"}),
				Action: func(c *cli.Context) error { return keeperList(c, k) },
			},
			{
				Name:      "show",
				Usage:     "print " + k.few + " by id, with their headers and body",
				ArgsUsage: "ID...",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print one JSON object per line"}},
				Action:    func(c *cli.Context) error { return keeperShow(c, k) },
			},
			{
				Name:  "replay",
				Usage: replayUsage,
				Flags: append(filters(), dryRun, progress,
					&cli.IntFlag{Name: "limit", Value: defaultReplayLimit, Usage: "replay at most `N` per run, held in memory until replayed (0: every match); run again for more"}),
				Action: func(c *cli.Context) error { return keeperReplay(c, k) },
			},
			{
				Name:  "purge",
				Usage: "delete the matching " + k.few + " (without a filter, --all is required)",
				Flags: append(filters(), dryRun, progress,
					&cli.BoolFlag{Name: "all", Usage: "purge every " + k.one + " when no filter is given"}),
				Action: func(c *cli.Context) error { return keeperPurge(c, k) },
			},
		},
	}
}

// filterOf reads the filter flags.
func filterOf(c *cli.Context) (deadletters.Filter, error) {
	if c.NArg() > 0 {
		return deadletters.Filter{}, usagef("%s takes no arguments, got %q", c.Command.Name, c.Args().Slice())
	}
	f := deadletters.Filter{
		Module:    c.String("module"),
		Node:      c.String("node"),
		Type:      c.String("type"),
		OlderThan: c.Duration("older-than"),
		NewerThan: c.Duration("newer-than"),
		IDs:       c.StringSlice("id"),
	}
	if err := f.Validate(); err != nil {
		return f, &usageError{err}
	}
	return f, nil
}

// brokerSession dials the broker for one command, with a context that ends
// on SIGINT or SIGTERM (the messages being worked on go back to the queue).
func brokerSession(c *cli.Context) (context.Context, *amqp.Connection, func(), error) {
	ctx, conn, _, done, err := brokerSessionAt(c)
	return ctx, conn, done, err
}

// brokerSessionAt is brokerSession that also says which of the broker's
// addresses (brokerURLs) answered: the first that does.
func brokerSessionAt(c *cli.Context) (context.Context, *amqp.Connection, string, func(), error) {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	conn, url, err := dialBroker(c, "meshctl "+c.Command.FullName())
	if err != nil {
		stop()
		return nil, nil, "", nil, err
	}
	return ctx, conn, url, func() { _ = conn.Close(); stop() }, nil
}

// dialBroker connects to the first of the broker's addresses that
// answers, naming the connection name; it says which answered.
func dialBroker(c *cli.Context, name string) (*amqp.Connection, string, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	tc, err := tlsSettings(c).ClientConfig()
	if err != nil {
		return nil, "", err
	}
	var errs []error
	for _, url := range brokerURLs(c) {
		conn, err := amqp.DialConfig(url, amqp.Config{
			Heartbeat:       10 * time.Second,
			Locale:          "en_US",
			Properties:      props,
			Dial:            amqp.DefaultDial(10 * time.Second),
			TLSClientConfig: tc.Clone(), // used for amqps:// only; amqp091-go sets its ServerName from this URL
		})
		if err == nil {
			return conn, url, nil
		}
		// amqp091-go errors do not carry the URL, so err is safe to show.
		errs = append(errs, fmt.Errorf("connect to broker %s: %w%s", redactURL(url), err, runtime.TLSHint(err)))
	}
	return nil, "", errors.Join(errs...)
}

// brokerURLs are the broker's addresses: --amqp-url, then --amqp-urls,
// each once; --amqp-url's default only if neither is given.
func brokerURLs(c *cli.Context) []string {
	cfg := runtime.Config{AMQPURLs: c.StringSlice("amqp-urls")}
	if c.IsSet("amqp-url") || len(cfg.AMQPURLs) == 0 {
		cfg.AMQPURL = c.String("amqp-url")
	}
	return cfg.Brokers()
}

// redactURL returns u without its password.
func redactURL(u string) string {
	if p, err := neturl.Parse(u); err == nil {
		return p.Redacted()
	}
	return "(unparsable broker URL)"
}

func keeperList(c *cli.Context, k keeper) error {
	f, err := filterOf(c)
	if err != nil {
		return err
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	limit := c.Int("limit")
	msgs, err := deadletters.List(ctx, conn, k.queue, f, deadletters.WithLimit(limit))
	if err != nil {
		return err
	}
	if limit > 0 && len(msgs) == limit {
		fmt.Fprintf(c.App.ErrWriter, "the first %d matching %s; more may match (--limit N, or 0 for all)\n", limit, k.few)
	}
	if c.Bool("json") {
		return printKeptJSON(c.App.Writer, msgs)
	}
	if len(msgs) == 0 {
		_, err := fmt.Fprintf(c.App.Writer, "no %s\n", k.few)
		return err
	}
	return printKeptTable(c.App.Writer, k, msgs, time.Now())
}

func keeperShow(c *cli.Context, k keeper) error {
	if c.NArg() == 0 {
		return usagef("show wants one or more IDs")
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	msgs, err := deadletters.Show(ctx, conn, k.queue, c.Args().Slice())
	if len(msgs) > 0 {
		var perr error
		if c.Bool("json") {
			perr = printKeptJSON(c.App.Writer, msgs)
		} else {
			perr = printKeptLong(c.App.Writer, k, msgs, time.Now())
		}
		if err == nil {
			err = perr
		}
	}
	return err
}

func keeperReplay(c *cli.Context, k keeper) error {
	f, err := filterOf(c)
	if err != nil {
		return err
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	limit := c.Int("limit")
	res, err := deadletters.Replay(ctx, conn, k.queue, f, append(actOptions(c), deadletters.WithLimit(limit))...)
	if len(res.Sent) > 0 {
		// Best effort: the replay stands whether or not an audit logger
		// hears of it.
		if node, nerr := connect(ctx, c); nerr != nil {
			fmt.Fprintf(c.App.ErrWriter, "meshctl: the audit log is not told of this replay: %v\n", nerr)
		} else {
			if _, rerr := recordReplayed(ctx, node, res.Sent); rerr != nil {
				fmt.Fprintf(c.App.ErrWriter, "meshctl: %v\n", rerr)
			}
			_ = node.Close(context.Background())
		}
	}
	printLeft(c.App.ErrWriter, res)
	if limit > 0 && res.Matched == limit {
		fmt.Fprintf(c.App.ErrWriter, "stopped at --limit %d: more may match; run the replay again for the rest\n", limit)
	}
	if res.Matched > 0 || err == nil {
		fmt.Fprintln(c.App.Writer, replaySummary(k, res))
	}
	if err != nil {
		return err
	}
	if len(res.Left) > 0 && !res.DryRun {
		return fmt.Errorf("%s could not be replayed and stay in %s", countOf(len(res.Left), k.one, k.few), k.queue)
	}
	return nil
}

func keeperPurge(c *cli.Context, k keeper) error {
	f, err := filterOf(c)
	if err != nil {
		return err
	}
	if f.IsZero() && !c.Bool("all") {
		return usagef("purge without a filter deletes every %s in %s: give --all to mean it", k.one, k.queue)
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return err
	}
	defer done()
	res, err := deadletters.Purge(ctx, conn, k.queue, f, actOptions(c)...)
	if res.Matched > 0 || err == nil {
		fmt.Fprintln(c.App.Writer, purgeSummary(k, res))
	}
	return err
}

// actOptions are the options of replay and purge: a dry run, and a progress
// bar on stderr when asked for or when stderr is a terminal and the work is
// long.
func actOptions(c *cli.Context) []deadletters.Option {
	var opts []deadletters.Option
	if c.Bool("dry-run") {
		opts = append(opts, deadletters.DryRun())
	}
	if p := progressOf(c); p != nil {
		opts = append(opts, deadletters.WithProgress(p))
	}
	return opts
}

// progressOf is a progress bar on stderr when --progress asks for one, or
// when stderr is a terminal and the work is long; nil otherwise.
func progressOf(c *cli.Context) func(done, total int) {
	w := c.App.ErrWriter
	force := c.Bool("progress")
	if !force && (w != io.Writer(os.Stderr) || !isTerminal(os.Stderr)) {
		return nil
	}
	bar := &progressBar{w: w}
	return func(done, total int) {
		if done == 0 {
			bar.on = force || total > progressThreshold
		}
		bar.update(done, total)
	}
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar draws `\r[#####.....] 123/400` on one line.
type progressBar struct {
	w     io.Writer
	on    bool
	drawn time.Time
}

const progressWidth = 30

func (p *progressBar) update(done, total int) {
	if !p.on || total <= 0 {
		return
	}
	last := done >= total
	if !last && done > 0 && time.Since(p.drawn) < 50*time.Millisecond {
		return // redraw at most 20 times a second
	}
	p.drawn = time.Now()
	filled := progressWidth * done / total
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", progressWidth-filled), done, total)
	if last {
		fmt.Fprintln(p.w)
	}
}

// printLeft says, on w, which matched messages stayed and why.
func printLeft(w io.Writer, res deadletters.Result) {
	verb := "left"
	if res.DryRun {
		verb = "would be left"
	}
	for _, l := range res.Left {
		fmt.Fprintf(w, "%s %s (%s): %s\n", verb, escape(l.ID), escape(l.Type), escape(l.Err.Error()))
	}
}

func replaySummary(k keeper, res deadletters.Result) string {
	if res.Matched == 0 {
		return "no " + k.few + " match"
	}
	var b strings.Builder
	if res.DryRun {
		b.WriteString("dry run: would replay ")
	} else {
		b.WriteString("replayed ")
	}
	b.WriteString(countOf(res.Done, k.one, k.few))
	if k.dead {
		fmt.Fprintf(&b, " to %s", countOf(len(res.Queues), "queue", "queues"))
	} else {
		b.WriteString(" to " + wire.ExchangeEvents)
	}
	var notes []string
	if len(res.Left) > 0 {
		left := "left"
		if res.DryRun {
			left = "would be left"
		}
		notes = append(notes, fmt.Sprintf("%d %s: %s", len(res.Left), left, leftReasons(res.Left)))
	}
	if res.CameBack > 0 {
		notes = append(notes, fmt.Sprintf("%d came back: still no queue for them", res.CameBack))
	}
	if len(notes) > 0 {
		b.WriteString(" (" + strings.Join(notes, "; ") + ")")
	}
	return b.String()
}

// leftReasons says why messages were left, most common first: "queue gone"
// or "2 queue gone, 1 refused".
func leftReasons(left []deadletters.Left) string {
	counts := map[string]int{}
	for _, l := range left {
		counts[leftReason(l.Err)]++
	}
	if len(counts) == 1 {
		for r := range counts {
			return r
		}
	}
	reasons := make([]string, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if counts[reasons[i]] != counts[reasons[j]] {
			return counts[reasons[i]] > counts[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%d %s", counts[r], r)
	}
	return strings.Join(reasons, ", ")
}

func leftReason(err error) string {
	switch {
	case errors.Is(err, deadletters.ErrQueueGone):
		return "queue gone"
	case errors.Is(err, deadletters.ErrNoTarget):
		return "no queue named"
	case errors.Is(err, deadletters.ErrForbiddenTarget):
		return "names a queue replay never sends to"
	case errors.Is(err, deadletters.ErrUnroutable):
		return "returned unroutable"
	case errors.Is(err, deadletters.ErrRefused):
		return "refused by the broker"
	}
	return "failed"
}

func purgeSummary(k keeper, res deadletters.Result) string {
	switch {
	case res.Matched == 0:
		return "no " + k.few + " match"
	case res.DryRun:
		return "dry run: would purge " + countOf(res.Done, k.one, k.few)
	}
	return "purged " + countOf(res.Done, k.one, k.few)
}

func countOf(n int, one, few string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, few)
}

// printKeptTable prints one line per message.
func printKeptTable(w io.Writer, k keeper, msgs []deadletters.Message, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if k.dead {
		fmt.Fprintln(tw, "ID\tAGE\tTYPE\tNODE\tMODULE\tATTEMPTS\tREASON\tERROR")
	} else {
		fmt.Fprintln(tw, "ID\tAGE\tTYPE\tSOURCE\tNODE\tSIZE")
	}
	for _, m := range msgs {
		if k.dead {
			module := m.Module
			if module == "" {
				module = m.Queue // not a module queue: say which queue
			}
			attempts := "-"
			if m.Attempts > 0 {
				attempts = fmt.Sprint(m.Attempts)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", escape(m.ID), age(m.Time, now), cell(m.Type, 60), dash(escape(m.Node)),
				dash(escape(module)), attempts, dash(escape(m.Reason)), dash(cell(m.Error, 50)))
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", escape(m.ID), age(m.Time, now), cell(m.Type, 60), dash(cell(m.Source, 30)),
				dash(cell(m.SourceNode, 30)), m.Size)
		}
	}
	return tw.Flush()
}

// cell makes s fit one table cell: one line, at most n runes, escaped.
func cell(s string, n int) string {
	s = escape(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age says how long ago t was, in the largest whole unit.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// printKeptLong prints each message in full: what it says, its headers and
// its body, indented when it is JSON.
func printKeptLong(w io.Writer, k keeper, msgs []deadletters.Message, now time.Time) error {
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteString("\n")
		}
		// line prints one key; its args come from the wire, escaped
		// (a line feed is kept, indented under the key).
		line := func(key, format string, args ...any) {
			for i, a := range args {
				args[i] = escapeLines(fmt.Sprint(a))
			}
			fmt.Fprintf(&b, "%-10s %s\n", key, indentLines(fmt.Sprintf(format, args...), 11))
		}
		line("id", "%s", m.ID)
		line("type", "%s", dash(m.Type))
		if k.dead {
			switch {
			case m.Module != "":
				line("queue", "%s (node %s, module %s)", m.Queue, m.Node, m.Module)
			default:
				line("queue", "%s", dash(m.Queue))
			}
			reason := dash(m.Reason)
			if m.Attempts > 0 {
				reason += fmt.Sprintf(" after %s", countOf(m.Attempts, "attempt", "attempts"))
			}
			line("reason", "%s", reason)
			if m.Error != "" {
				line("error", "%s", m.Error)
			}
			line("dead since", "%s", when(m.Time, now))
		} else {
			line("arrived", "%s", when(m.Time, now))
		}
		line("source", "%s on node %s", dash(m.Source), dash(m.SourceNode))
		line("size", "%s", countOf(m.Size, "byte", "bytes"))
		b.WriteString("headers\n")
		keys := make([]string, 0, len(m.Headers))
		for key := range m.Headers {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			fmt.Fprintf(&b, "  %s: %s\n", escape(key), indentLines(escapeLines(headerValueText(m.Headers[key])), 4))
		}
		b.WriteString("body\n")
		var pretty bytes.Buffer
		if json.Indent(&pretty, m.Body, "  ", "  ") == nil {
			b.WriteString("  " + string(escapeJSON(pretty.Bytes())) + "\n")
		} else {
			fmt.Fprintf(&b, "  %q\n", m.Body)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// indentLines indents every line of s after the first by n spaces, so a
// multi-line value stays under its key.
func indentLines(s string, n int) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+strings.Repeat(" ", n))
}

func when(t, now time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), age(t, now))
}

// headerValueText writes a header value as text; nested tables and arrays
// (x-death) as JSON.
func headerValueText(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	case time.Time:
		return s.UTC().Format(time.RFC3339)
	case amqp.Table, []any:
		b, err := json.Marshal(jsonValue(v))
		if err == nil {
			return string(b)
		}
	}
	return fmt.Sprint(v)
}

// jsonValue turns a header value into one encoding/json writes well.
func jsonValue(v any) any {
	switch s := v.(type) {
	case amqp.Table:
		out := make(map[string]any, len(s))
		for k, e := range s {
			out[k] = jsonValue(e)
		}
		return out
	case []any:
		out := make([]any, len(s))
		for i, e := range s {
			out[i] = jsonValue(e)
		}
		return out
	case []byte:
		return string(s)
	case time.Time:
		return s.UTC().Format(time.RFC3339)
	case amqp.Decimal:
		return fmt.Sprint(s)
	}
	return v
}

// keptLine is the --json shape of one kept message.
type keptLine struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Source     string          `json:"source,omitempty"`
	SourceNode string          `json:"source_node,omitempty"`
	Queue      string          `json:"queue,omitempty"`
	Node       string          `json:"node,omitempty"`
	Module     string          `json:"module,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	Error      string          `json:"error,omitempty"`
	Attempts   int             `json:"attempts,omitempty"`
	Time       *time.Time      `json:"time,omitempty"`
	Size       int             `json:"size"`
	Headers    map[string]any  `json:"headers"`
	Body       json.RawMessage `json:"body"`
}

func printKeptJSON(w io.Writer, msgs []deadletters.Message) error {
	for _, m := range msgs {
		line := keptLine{ID: m.ID, Type: m.Type, Source: m.Source, SourceNode: m.SourceNode, Queue: m.Queue, Node: m.Node,
			Module: m.Module, Reason: m.Reason, Error: m.Error, Attempts: m.Attempts, Size: m.Size,
			Headers: jsonValue(m.Headers).(map[string]any), Body: m.Body}
		if !m.Time.IsZero() {
			t := m.Time
			line.Time = &t
		}
		if !json.Valid(line.Body) {
			b, _ := json.Marshal(string(line.Body))
			line.Body = b
		}
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%s\n", escapeJSON(b)); err != nil {
			return err
		}
	}
	return nil
}

// recordReplayed tells the audit logger what a replay of dead letters or
// unrouted events sent (audit.replayed, as meshctl audit replay does), so
// that each event's fates say it was replayed and where to. It names the
// replay with a new id, which it returns.
func recordReplayed(ctx context.Context, node *runtime.Node, sent []deadletters.Sent) (string, error) {
	id := ulid.Make().String()
	byDest := map[string][]auditlogger.ReplayedEvent{}
	var dests []string
	for _, s := range sent {
		if _, ok := byDest[s.Destination]; !ok {
			dests = append(dests, s.Destination)
		}
		byDest[s.Destination] = append(byDest[s.Destination], auditlogger.ReplayedEvent{ID: s.ID, Time: s.Time})
	}
	for _, d := range dests {
		for evs := byDest[d]; len(evs) > 0; {
			n := min(len(evs), auditlogger.MaxReplayedPerCall)
			req := auditlogger.ReplayedRequest{ReplayID: id, Destination: d, Sent: evs[:n]}
			if err := node.Call(ctx, "meshctl", auditlogger.ToolReplayed, req, nil); err != nil {
				return id, fmt.Errorf("tell the audit logger of replay %s (its events' fates do not say it): %w", id, err)
			}
			evs = evs[n:]
		}
	}
	return id, nil
}
