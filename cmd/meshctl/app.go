package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

func app() *cli.App {
	a := &cli.App{
		Name:                 "meshctl",
		Usage:                "talk to the mesh",
		Version:              runtime.Build().Line(),
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "amqp-url", EnvVars: []string{"MESH_AMQP_URL"}, Value: runtime.DefaultAMQPURL, Usage: "the broker's `URL`"},
			&cli.StringSliceFlag{Name: "amqp-urls", EnvVars: []string{"MESH_AMQP_URLS"}, Usage: "more of the broker's `URLS` (the nodes of a cluster; comma-separated or repeated): the first that answers is used"},
			&cli.StringFlag{Name: "node", EnvVars: []string{"MESH_NODE"}, Usage: "the node `NAME` events are emitted from (default meshctl-HOST)"},
			&cli.StringFlag{Name: "tls-ca-file", EnvVars: []string{"MESH_TLS_CA_FILE"}, Usage: "the PEM `FILE` of the CA that signed the broker's certificate (amqps://; default the system's roots)"},
			&cli.StringFlag{Name: "tls-cert-file", EnvVars: []string{"MESH_TLS_CERT_FILE"}, Usage: "a client certificate, a PEM `FILE`"},
			&cli.StringFlag{Name: "tls-key-file", EnvVars: []string{"MESH_TLS_KEY_FILE"}, Usage: "the client certificate's key, a PEM `FILE`"},
			&cli.StringFlag{Name: "tls-server-name", EnvVars: []string{"MESH_TLS_SERVER_NAME"}, Usage: "the `NAME` checked in the broker's certificate (default the URL's host)"},
			&cli.StringFlag{Name: "env-file", EnvVars: []string{"MESH_ENV_FILE"}, Value: nodeEnvFile,
				Usage: "the node's environment `FILE` (a packaged meshd's): where neither --amqp-url nor --amqp-urls nor their variables name the broker, its MESH_AMQP_URL, MESH_AMQP_URLS, MESH_AMQP_PASSWORD_FILE and MESH_TLS_ settings are taken, when it can be read ('' to read none)"},
		},
		Before: applyEnvFile,
		Commands: []*cli.Command{
			versionCommand(),
			{
				Name:      "emit",
				Usage:     "publish a conforming event of a full type and print its id",
				ArgsUsage: "TYPE JSON",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "schema", Usage: "the body's schema `VERSION` (x-schema); by default the version the live modules declare as current for the type, the body checked against it as a module's emit is ('' for none)"},
					&cli.DurationFlag{Name: "within", Value: 3 * time.Second, Usage: "how long to wait for the nodes' answers to the roll call that finds the declared schema"},
					&cli.DurationFlag{Name: "schema-max-age", EnvVars: []string{"MESH_SCHEMA_MAX_AGE"}, Value: defaultSchemaMaxAge,
						Usage: "how long the declared schemas a roll call found are used without calling the roll again (kept in the user's cache directory, per broker and virtual host; 0 calls it on every emit); a body they refuse is checked again by a roll call before it is refused"},
					&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long to wait for the audit logger's schema documents"},
					&cli.StringFlag{Name: "causation", Usage: "the causing event's `ID` (x-causation-id)"},
					&cli.StringFlag{Name: "key", Usage: "the event's `KEY` (x-partition-key): a group that keeps order by key handles the events of one key in order (sdk.WithKey; none is the empty key)"},
					&cli.DurationFlag{Name: "after", Usage: "deliver it this `DURATION` from now (rounded up to the second; at most 2^28-1 s), by --via's mover"},
					&cli.TimestampFlag{Name: "at", Layout: time.RFC3339, Usage: "deliver it at this `TIME` (RFC 3339), by --via's mover"},
					&cli.StringFlag{Name: "via", Usage: "the `NODE` whose mover delivers a delayed event when due (it must run with delays on, and deliver for your broker user: its own, or one of its delay_publishers)"},
					&cli.BoolFlag{Name: "at-most-once", Usage: "publish it not persistent and unconfirmed (lost if the broker restarts before it is consumed)"},
				},
				Action: emit,
			},
			{
				Name:      "call",
				Usage:     "call a tool and print its JSON response; exits 1 with the error if it fails",
				ArgsUsage: "TOOL JSON",
				Flags: []cli.Flag{
					&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long to wait for the answer"},
				},
				Action: call,
			},
			{
				Name:      "tail",
				Usage:     "print events matching an AMQP topic pattern live",
				ArgsUsage: "PATTERN",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "json", Usage: "print one JSON object per line"},
					&cli.StringSliceFlag{Name: "exclude", Usage: "leave out the events whose type matches this AMQP topic `PATTERN` (repeatable; 'node.*.heartbeat' leaves out the heartbeats)"},
				},
				Action: tail,
			},
			dlqCommand(),
			delayedCommand(),
			unroutedCommand(),
			auditCommand(),
			dispatcherCommand(),
			topologyCommand(),
			queueCommand(),
			moduleCommand(),
			nodeCommand(),
			nodesCommand(),
			groupsCommand(),
			featuresCommand(),
			graphCommand(),
			schemaCommand(),
			consoleCommand(),
			newCommand(),
			completionCommand(),
		},
	}
	markUsageErrors(a)
	return a
}

// connect opens a node for meshctl: it declares the topology (idempotent)
// and logs only warnings.
func connect(ctx context.Context, c *cli.Context) (*runtime.Node, error) {
	return connectFor(ctx, c, "")
}

// connectFor is connect for an emit whose delay node via's mover
// delivers; "" for none (the delay cascade is then not declared).
func connectFor(ctx context.Context, c *cli.Context, via string) (*runtime.Node, error) {
	name := c.String("node")
	if name == "" {
		host, _ := os.Hostname()
		name = "meshctl-" + regexp.MustCompile(`[^A-Za-z0-9_-]`).ReplaceAllString(host, "-")
	}
	return runtime.New(ctx, runtime.Config{
		Node:      name,
		Ephemeral: true, // no node lock, no spool: an emit is confirmed or fails
		AMQPURLs:  brokerURLs(c),
		TLS:       tlsSettings(c),
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Delays:    via != "",
		DelayNode: via,
	})
}

func emit(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("emit wants TYPE and JSON, got %d arguments", c.NArg())
	}
	typ, body := c.Args().Get(0), c.Args().Get(1)
	var opts []sdk.EmitOption
	version := c.String("schema")
	if !c.IsSet("schema") {
		v, err := emitSchema(c, typ, []byte(body))
		if err != nil {
			return err
		}
		version = v
	}
	if version != "" {
		opts = append(opts, sdk.WithSchema(version))
	}
	via := c.String("via")
	delayed := c.IsSet("after") || c.IsSet("at")
	switch {
	case c.IsSet("after") && c.IsSet("at"):
		return usagef("emit takes --after or --at, not both")
	case delayed && via == "":
		return usagef("a delayed emit (--after, --at) needs --via NODE: the node whose mover delivers it when due")
	case !delayed && via != "":
		return usagef("--via names the node that delivers a delayed emit: give --after or --at too")
	case c.IsSet("after"):
		opts = append(opts, sdk.After(c.Duration("after")))
	case c.IsSet("at"):
		opts = append(opts, sdk.At(*c.Timestamp("at")))
	}
	if c.Bool("at-most-once") {
		opts = append(opts, sdk.AtMostOnce())
	}
	if c.IsSet("key") {
		opts = append(opts, sdk.WithKey(c.String("key")))
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	if s := c.String("causation"); s != "" {
		ctx = causation.With(ctx, s)
	}
	node, err := connectFor(ctx, c, via)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	if delayed {
		if err := node.CheckDueQueue(ctx, via); err != nil {
			return err
		}
	}
	scheduled := time.Now()
	id, err := node.Emit(ctx, "meshctl", typ, json.RawMessage(body), opts...)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.App.Writer, id)
	if delayed {
		due := scheduled.Add(c.Duration("after"))
		if c.IsSet("at") {
			due = *c.Timestamp("at")
		}
		// Entered in the node's book, so that delayed ls lists it and
		// delayed cancel can drop it; the schedule stands either way.
		e := schedbook.Entry{ID: id, Type: typ, Source: "meshctl", Due: due, Scheduled: scheduled}
		if err := node.Call(ctx, "meshctl", runtime.DelayedTool(via, "note"), e, nil); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "meshctl: scheduled, but node %s did not enter it in its book (it is delivered, not listed): %v\n", via, err)
		}
	}
	return nil
}

func call(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("call wants TOOL and JSON, got %d arguments", c.NArg())
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	node, err := connect(ctx, c)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	var resp json.RawMessage
	if err := node.Call(ctx, "meshctl", c.Args().Get(0), json.RawMessage(c.Args().Get(1)), &resp); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s\n", escapeJSON(resp))
	return err
}

// tail prints the events matching a pattern until interrupted. A lost
// connection does not end it: it connects again, with back-off, and says
// on stderr which span of time it could not see (its queue went with the
// connection).
func tail(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("tail wants one PATTERN, got %d arguments", c.NArg())
	}
	pattern := c.Args().First()
	if err := wire.ValidateSubscription(pattern); err != nil {
		return err
	}
	excludes := c.StringSlice("exclude")
	for _, x := range excludes {
		if err := wire.ValidateSubscription(x); err != nil {
			return usagef("--exclude %q: %v", x, err)
		}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	print := printHuman
	if c.Bool("json") {
		print = printJSON
	}
	if len(excludes) > 0 {
		printAll := print
		print = func(w io.Writer, ev runtime.TailedEvent) error {
			for _, x := range excludes {
				if wire.MatchPattern(x, ev.Event.Type) {
					return nil
				}
			}
			return printAll(w, ev)
		}
	}
	var lostAt time.Time // when the last connection was lost; zero before the first
	for attempt := 1; ; attempt++ {
		node, err := connect(ctx, c)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if lostAt.IsZero() {
				return err // never connected: the URL or the credentials are wrong
			}
			delay := min(100*time.Millisecond<<min(attempt, 6), 5*time.Second)
			fmt.Fprintf(c.App.ErrWriter, "tail: cannot reach the broker (%s); trying again in %v\n", escape(err.Error()), delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		ready := func() {
			if lostAt.IsZero() {
				fmt.Fprintf(c.App.ErrWriter, "tail: following %s%s\n", pattern, excluding(excludes))
				return
			}
			fmt.Fprintf(c.App.ErrWriter, "tail: resumed; events from %s to %s were not seen (connection lost)\n",
				lostAt.Format(time.RFC3339Nano), time.Now().UTC().Format(time.RFC3339Nano))
		}
		err = node.Tail(ctx, pattern, ready, func(ev runtime.TailedEvent) error {
			return print(c.App.Writer, ev)
		})
		node.Close(context.Background())
		switch {
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, wire.ErrConnectionLost):
			return err
		}
		lostAt, attempt = time.Now().UTC(), 0
		fmt.Fprintf(c.App.ErrWriter, "tail: connection lost at %s; reconnecting\n", lostAt.Format(time.RFC3339Nano))
	}
}

// excluding is how tail says what it leaves out: "" for nothing.
func excluding(excludes []string) string {
	if len(excludes) == 0 {
		return ""
	}
	return ", leaving out " + strings.Join(excludes, ", ")
}

// tailLine is the --json shape of one event.
type tailLine struct {
	ID          string            `json:"id"`
	Type        string            `json:"type"`
	Source      string            `json:"source"`
	Node        string            `json:"node"`
	Time        time.Time         `json:"time"`
	CausationID string            `json:"causation_id,omitempty"`
	Schema      string            `json:"schema,omitempty"`
	Headers     map[string]string `json:"headers"`
	Body        json.RawMessage   `json:"body"`
	Error       string            `json:"error,omitempty"`
}

func printJSON(w io.Writer, ev runtime.TailedEvent) error {
	line := tailLine{
		ID: ev.Event.ID, Type: ev.Event.Type, Source: ev.Event.Source, Node: ev.Event.Node, Time: ev.Event.Time,
		CausationID: ev.Event.CausationID, Schema: ev.Event.Schema, Headers: headerText(ev.Headers), Body: ev.Event.Body,
	}
	if ev.Err != nil {
		line.Error = ev.Err.Error()
	}
	if !json.Valid(line.Body) {
		b, _ := json.Marshal(string(line.Body))
		line.Body = b
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", escapeJSON(b))
	return err
}

// printHuman prints ev over a few lines: time and type, its error, a line
// per header, the body; every value that came from the wire through
// escape, so each stays on its line and none reaches the terminal as a
// control sequence.
func printHuman(w io.Writer, ev runtime.TailedEvent) error {
	h := headerText(ev.Headers)
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %s\n", ev.Event.Time.Format(time.RFC3339Nano), escape(ev.Event.Type))
	if ev.Err != nil {
		fmt.Fprintf(&b, "  ! %s\n", escape(ev.Err.Error()))
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", escape(k), escape(h[k]))
	}
	fmt.Fprintf(&b, "  %s\n", escape(string(ev.Event.Body)))
	_, err := io.WriteString(w, b.String())
	return err
}

func headerText(h map[string]any) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		switch s := v.(type) {
		case string:
			out[k] = s
		case []byte:
			out[k] = string(s)
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

// tlsSettings are the TLS flags (or their environment variables), as
// meshd's tls settings.
func tlsSettings(c *cli.Context) runtime.TLSConfig {
	return runtime.TLSConfig{CAFile: c.String("tls-ca-file"), CertFile: c.String("tls-cert-file"), KeyFile: c.String("tls-key-file"),
		ServerName: c.String("tls-server-name")}
}
