package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
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
			"with --db, does it on a database file here (a copy, or the logger's while it is stopped). Exit status 0: untouched\n" +
			"as far as the chain and the checkpoints tell; 1: changed, with where (ADR 35).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "db", Usage: "verify the audit database `FILE` here, without asking a logger"},
			&cli.StringSliceFlag{Name: "key", Usage: "trust only checkpoints signed by key `ID` (repeat for several; see the KEY column)"},
			asJSON, timeout,
		},
		Action: auditVerify,
	}
}

func auditVerify(c *cli.Context) error {
	var rep auditlogger.Report
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
		if rep, err = auditlogger.VerifyStore(c.Context, s, chain, c.StringSlice("key")); err != nil {
			return err
		}
	} else if err := auditCall(c, auditlogger.ToolVerify, auditlogger.VerifyRequest{Trusted: c.StringSlice("key")}, &rep); err != nil {
		return err
	}
	if c.Bool("json") {
		if err := json.NewEncoder(jsonWriter{c.App.Writer}).Encode(rep); err != nil {
			return err
		}
	} else if err := printVerify(c, rep); err != nil {
		return err
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
	fmt.Fprintln(tw, "CHECKPOINT\tSIGNED\tKEY\tCHAIN\tHEAD ROW\tVERDICT")
	for _, cp := range rep.Checkpoints {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", escape(cp.EventID), timeText(cp.Time), escape(cp.KeyID), escape(cp.Chain), escape(cp.HeadID), escape(cp.Verdict))
	}
	return tw.Flush()
}
