package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// errTampered is what audit verify returns when the record was changed:
// exit status 1.
var errTampered = errors.New("the audit log does not verify")

// auditVerifyCommand is `meshctl audit verify`.
func auditVerifyCommand(asJSON, timeout cli.Flag) *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "check the audit log's hash chain and signed checkpoints; name the first row changed, inserted, deleted or reordered",
		Description: "Asks an audit logger to walk its chain and check every checkpoint it holds (its own and other loggers'), or,\n" +
			"with --db, does it on a database file here (a copy, or the logger's while it is stopped). With --history, the\n" +
			"index of a logger that reads the mesh's history is also compared with the stream, from its oldest row's offset to\n" +
			"where it reads next: every event there must be a row, with the same content. Exit status 0: untouched as far as\n" +
			"the chain, the checkpoints (and the stream) tell; 1: changed, with where (ADR 35).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "db", Usage: "verify the audit database `FILE` here, without asking a logger"},
			&cli.StringSliceFlag{Name: "key", Usage: "trust only checkpoints signed by key `ID` (repeat for several; see the KEY column)"},
			&cli.BoolFlag{Name: "history", Usage: "also compare the index with the mesh's history stream it was built from, row by row"},
			&cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Usage: "the node's configuration `FILE` (mesh.yaml), for --history: its history.stream"},
			&cli.StringFlag{Name: "stream", Usage: "with --history, the history stream's `NAME` (default: history.stream in --config)"},
			asJSON, timeout,
		},
		Action: auditVerify,
	}
}

func auditVerify(c *cli.Context) error {
	var rep auditlogger.Report
	var rows func(ids []string) ([]store.Event, error) // the index's rows of ids, for --history
	if c.Bool("history") {
		if _, err := historyStream(c); err != nil {
			return err
		}
	} else if c.IsSet("stream") {
		return usagef("--stream names the history stream --history compares with: give --history too")
	}
	if path := c.String("db"); path != "" {
		s, err := store.Open(path, store.Options{})
		if err != nil {
			return err
		}
		defer s.Close()
		chain := auditlogger.HistoryChain
		if _, ok, err := s.HistoryNext(c.Context); err != nil {
			return err
		} else if !ok {
			id, err := s.ChainID(c.Context)
			if err != nil {
				return err
			}
			chain = "own:" + id
		}
		own, _ := auditlogger.PublicKeyOf(path + ".key") // the logger's own, where it is readable
		if rep, err = auditlogger.VerifyStore(c.Context, s, chain, c.StringSlice("key"), own); err != nil {
			return err
		}
		rows = func(ids []string) ([]store.Event, error) {
			evs, _, err := s.Query(c.Context, store.Filter{IDs: ids}, store.Page{Limit: len(ids)})
			return evs, err
		}
	} else {
		a, err := newAuditCaller(c)
		if err != nil {
			return err
		}
		defer a.close()
		if err := a.call(auditlogger.ToolVerify, auditlogger.VerifyRequest{Trusted: c.StringSlice("key")}, &rep); err != nil {
			return err
		}
		rows = func(ids []string) ([]store.Event, error) {
			var page auditlogger.QueryResponse
			err := a.call(auditlogger.ToolQuery, auditlogger.QueryRequest{Filter: store.Filter{IDs: ids}, Page: store.Page{Limit: len(ids)}}, &page)
			return page.Events, err
		}
	}
	var against *streamCheck
	if c.Bool("history") {
		var err error
		if against, err = checkAgainstStream(c, rep, rows); err != nil {
			return err
		}
		if against.Problem != "" && rep.Problem == "" {
			rep.Problem = against.Problem
		}
	}
	if c.Bool("json") {
		out := struct {
			auditlogger.Report
			Stream *streamCheck `json:"stream,omitempty"`
		}{rep, against}
		if err := json.NewEncoder(jsonWriter{c.App.Writer}).Encode(out); err != nil {
			return err
		}
	} else {
		if err := printVerify(c, rep); err != nil {
			return err
		}
		if against != nil {
			fmt.Fprintf(c.App.Writer, "stream %s, offsets %d to %d: %d messages read, %d events compared, %d resends, %d missing from the index, %d differ\n",
				escape(against.Stream), against.From, against.To, against.Read, against.Compared, against.Resends, against.Missing, against.Differ)
			if against.Problem != "" {
				fmt.Fprintf(c.App.Writer, "FIRST DIFFERENCE FROM THE STREAM: %s\n", escape(against.Problem))
			}
		}
	}
	if rep.Problem != "" {
		return fmt.Errorf("%w: %s", errTampered, rep.Problem)
	}
	return nil
}

func printVerify(c *cli.Context, rep auditlogger.Report) error {
	w := c.App.Writer
	head := rep.Store.Head
	fmt.Fprintf(w, "chain %s: %d rows chained (%d from before chaining), head %s at row %d (%s)\n",
		escape(rep.Chain), rep.Store.Rows, rep.Store.Unchained, escape(head.Hash), head.Seq, escape(head.ID))
	if p := rep.Store.Problem; p != nil {
		fmt.Fprintf(w, "FIRST PROBLEM: row %d (id %s) %s: %s\n", p.Seq, escape(p.ID), escape(p.Kind), escape(p.Detail))
	} else {
		fmt.Fprintln(w, "chain: every row verifies")
	}
	if len(rep.Checkpoints) == 0 {
		_, err := fmt.Fprintln(w, "no checkpoints held")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tSIGNED\tKEY\tCHAIN\tHEAD ROW\tVERDICT\tCOUNTS")
	for _, cp := range rep.Checkpoints {
		counts := "no"
		if cp.Counts {
			counts = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", escape(cp.EventID), timeText(cp.Time), escape(cp.KeyID), escape(cp.Chain), escape(cp.HeadID), escape(cp.Verdict), counts)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Pinned) == 0 {
		fmt.Fprintln(w, "no key is pinned (the logger's key file is not readable here): the checkpoints are listed, none counts; pin the loggers' keys with --key KEY_ID")
	}
	if rep.Ignored > 0 {
		fmt.Fprintf(w, "%d checkpoints do not count (unreadable, badly signed, not published by an audit logger, or of a key not pinned: --key %s pins more); anyone allowed the type can publish one\n",
			rep.Ignored, escape(strings.Join(rep.Pinned, " --key ")))
	}
	return nil
}

// streamCheck is what verify --history found comparing the index with the
// stream.
type streamCheck struct {
	Stream string `json:"stream"`
	// From and To are the offsets compared: the index's oldest row's, and
	// the one it reads next (not included).
	From int64 `json:"from"`
	To   int64 `json:"to"`
	// Read counts the stream's messages, Compared the events compared
	// with their rows, Resends the later copies of an id already there.
	Read     int64 `json:"read"`
	Compared int64 `json:"compared"`
	Resends  int64 `json:"resends"`
	// Missing counts the events the stream holds and the index does not,
	// Differ those whose row is not what the stream holds.
	Missing int64 `json:"missing"`
	Differ  int64 `json:"differ"`
	// Problem is the first, in words.
	Problem string `json:"problem,omitempty"`
}

// checkAgainstStream reads the history's stream between the index's
// oldest row and where it reads next, makes of each message the row the
// logger makes of it (auditlogger.HistoryRowOf of runtime.HistoryEvent),
// and compares it with the index's row of that id (rows), a page at a
// time: the content (store.ChainHash with no prev) must be the same.
func checkAgainstStream(c *cli.Context, rep auditlogger.Report, rows func([]string) ([]store.Event, error)) (*streamCheck, error) {
	stream, err := historyStream(c)
	if err != nil {
		return nil, err
	}
	if rep.Next == nil {
		return nil, errors.New("verify --history: this audit log does not index the history (its logger runs without --history)")
	}
	chk := &streamCheck{Stream: stream, To: *rep.Next}
	if rep.FirstOffset != nil {
		chk.From = *rep.FirstOffset
	}
	if chk.From >= chk.To {
		return chk, nil
	}
	ctx, conn, done, err := brokerSession(c)
	if err != nil {
		return nil, err
	}
	defer done()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := ch.Qos(512, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(stream, "", false, false, false, false, amqp.Table{"x-stream-offset": chk.From})
	if err != nil {
		return nil, fmt.Errorf("read the history stream %s: %w", stream, err)
	}
	problem := func(format string, args ...any) {
		if chk.Problem == "" {
			chk.Problem = fmt.Sprintf(format, args...)
		}
	}
	var page []store.Event
	compare := func() error {
		if len(page) == 0 {
			return nil
		}
		ids := make([]string, len(page))
		for i, r := range page {
			ids[i] = r.ID
		}
		held, err := rows(ids)
		if err != nil {
			return err
		}
		byID := make(map[string]store.Event, len(held))
		for _, r := range held {
			byID[r.ID] = r
		}
		for _, want := range page {
			got, ok := byID[want.ID]
			switch {
			case !ok:
				chk.Missing++
				problem("the stream holds %s at offset %d, and the index has no row of it", want.ID, *want.Offset)
			case got.Offset != nil && *got.Offset < *want.Offset:
				chk.Resends++ // a later copy of an id the index holds from its first
			case !bytes.Equal(store.ChainHash(nil, got), store.ChainHash(nil, want)):
				chk.Compared++
				chk.Differ++
				problem("row %d (id %s) is not what the stream holds at offset %d", got.Seq, want.ID, *want.Offset)
			default:
				chk.Compared++
			}
		}
		page = page[:0]
		return nil
	}
	for chk.From+chk.Read < chk.To {
		var d amqp.Delivery
		var open bool
		select {
		case d, open = <-deliveries:
			if !open {
				return nil, fmt.Errorf("read the history stream %s: the broker closed the channel", stream)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("read the history stream %s: %w", stream, ctx.Err())
		}
		offset, _ := d.Headers[wire.HeaderStreamOffset].(int64)
		if offset >= chk.To {
			break
		}
		chk.Read = offset - chk.From + 1
		if err := d.Ack(true); err != nil {
			return nil, err
		}
		ev, ok := runtime.HistoryEvent(d)
		if !ok {
			continue // a replay's marker
		}
		page = append(page, auditlogger.HistoryRowOf(ev, time.Time{}))
		if len(page) == store.MaxPage {
			if err := compare(); err != nil {
				return nil, err
			}
		}
	}
	if err := compare(); err != nil {
		return nil, err
	}
	return chk, nil
}
