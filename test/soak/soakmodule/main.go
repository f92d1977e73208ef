// Command soakmodule is the module binary of the nemesis soak (test/soak):
// one binary, two modules, each writing what it ran to a history file the
// soak's checker reads. Every line is "KIND NODE KEY PID UNIXNANO".
//
//	soakmodule worker NODE HISTORY [QUEUE]   handles module.shop.order: calls tax.rate, emits done;
//	                                         with QUEUE, also consumes that outside queue
//	soakmodule tax NODE HISTORY              serves tax.rate
//	soakmodule ledger NODE HISTORY           books module.shop.order in ledger.db, in
//	                                         its module directory, through the inbox;
//	                                         emits booked through the outbox (sdk/outbox)
//	soakmodule orderer NODE HISTORY DSN      handles module.*.keyed in its group, in order by
//	                                         key: "seen" each time, and its effect (a row
//	                                         of effects) once, through the inbox on the
//	                                         PostgreSQL of DSN (TestSoakOrder)
//	soakmodule feeder NODE HISTORY           handles module.shop.feed: emits keyed, each
//	                                         key of the feed's range 1 to its count, in
//	                                         order, by the module protocol's keyed emit
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the orderer's PostgreSQL

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
	"github.com/meshkit/mesh/sdk/process"
)

// history appends lines to the history file. One write per line, with
// O_APPEND: lines from several processes do not interleave, and a line
// written survives the process being killed right after.
type history struct {
	mu   sync.Mutex
	f    *os.File
	node string
}

func (h *history) add(kind, key string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintf(h.f, "%s %s %s %d %d\n", kind, h.node, key, os.Getpid(), time.Now().UnixNano())
	return err
}

type order struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: soakmodule worker|tax NODE HISTORY [QUEUE]")
		os.Exit(2)
	}
	role, node, path := os.Args[1], os.Args[2], os.Args[3]
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakmodule:", err)
		os.Exit(1)
	}
	h := &history{f: f, node: node}
	var m sdk.Module
	switch role {
	case "worker":
		queue := ""
		if len(os.Args) > 4 {
			queue = os.Args[4]
		}
		m = worker(h, queue)
	case "tax":
		m = tax(h)
	case "orderer":
		if len(os.Args) < 5 {
			fmt.Fprintln(os.Stderr, "usage: soakmodule orderer NODE HISTORY DSN")
			os.Exit(2)
		}
		if m, err = orderer(h, os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, "soakmodule:", err)
			os.Exit(1)
		}
	case "feeder":
		m = feeder()
	case "ledger":
		if m, err = ledger(filepath.Join(process.Dir(), "ledger.db")); err != nil {
			fmt.Fprintln(os.Stderr, "soakmodule:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "soakmodule: no role", role)
		os.Exit(2)
	}
	if err := process.Run(m); err != nil {
		fmt.Fprintln(os.Stderr, "soakmodule:", err)
		os.Exit(1)
	}
}

// worker handles an order: it calls tax.rate (3 s at most) and emits done,
// and records the order as handled only if its handling has not been given
// up (the handler's context still live), just before it returns.
func worker(h *history, queue string) sdk.Module {
	return sdk.Module{Name: "worker", Emits: []string{"done"}, Calls: []string{"tax.rate"}, Setup: func(m sdk.Mesh) error {
		on := m.On("module.shop.order", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			var rate float64
			err := m.Call(callCtx, "tax.rate", o, &rate)
			cancel()
			if err != nil {
				return fmt.Errorf("tax.rate: %w", err)
			}
			if _, err := m.Emit(ctx, "done", o); err != nil {
				return fmt.Errorf("emit done: %w", err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return h.add("handled", o.ID)
		}))
		if queue == "" {
			return on
		}
		consume := m.Consume(queue, 4, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return h.add("legacy", ev.ID)
		}))
		return errors.Join(on, consume)
	}}
}

// tax serves tax.rate, recording each run by caller node and request id:
// a repeat of one request id from one node is answered from the stored
// answer, not run again.
func tax(h *history) sdk.Module {
	return sdk.Module{Name: "tax", Setup: func(m sdk.Mesh) error {
		return m.Serve("tax.rate", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			if err := h.add("taxed", req.Node+"/"+req.ID); err != nil {
				return nil, err
			}
			return 0.2, nil
		}))
	}}
}

// ledger books each order exactly once in its database (table applied:
// how many times each order's effect was applied, which the soak's
// checker requires to be 1) through the inbox, and emits booked for it
// in the same transaction, relayed by its outbox.
func ledger(path string) (sdk.Module, error) {
	db, err := outbox.OpenSQLite(path)
	if err != nil {
		return sdk.Module{}, err
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS applied (order_id TEXT PRIMARY KEY, times INTEGER NOT NULL)`); err != nil {
		return sdk.Module{}, err
	}
	m := sdk.Module{Name: "ledger", Emits: []string{"booked"}}
	ob, err := outbox.New(context.Background(), db, m)
	if err != nil {
		return sdk.Module{}, err
	}
	m.Setup = func(mesh sdk.Mesh) error {
		return mesh.On("module.shop.order", ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (order_id, times) VALUES (?, 1) ON CONFLICT (order_id) DO UPDATE SET times = applied.times + 1`, o.ID); err != nil {
				return fmt.Errorf("ledger: %w", err)
			}
			if _, err := ob.Emit(ctx, tx, "booked", o); err != nil {
				return fmt.Errorf("ledger: %w", err)
			}
			return nil
		}))
	}
	m.Run = ob.Relay
	return m, nil
}

// keyed is an event of TestSoakOrder: the Seq-th of its key, sent At
// (Unix nanoseconds; 0 from the feeder, whose events sent again after a
// crash must be the same).
type keyed struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	At  int64  `json:"at,omitempty"`
}

// orderer handles the keyed events of every publisher, as a member of
// its group: it writes "seen KEY/SEQ/AT" to the history on each call, and
// applies each event's effect (a row of effects, whose id is the order
// of application) through the inbox on the shared PostgreSQL, so that a
// redelivery to any member is recognised and applies nothing.
func orderer(h *history, dsn string) (sdk.Module, error) {
	m := sdk.Module{Name: "orderer"}
	var ob *outbox.Outbox
	// The members start at once against one database: a create that
	// loses a race to another member's is tried again.
	var err error
	for attempt := range 20 {
		if err = openOrderer(dsn, m, &ob); err == nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if err != nil {
		return sdk.Module{}, err
	}
	m.Setup = func(mesh sdk.Mesh) error {
		return mesh.On("module.*.keyed", ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			var k keyed
			if err := ev.Decode(&k); err != nil {
				return sdk.Permanent(err)
			}
			if err := h.add("seen", fmt.Sprintf("%s/%d/%d", k.Key, k.Seq, k.At)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (key, seq, node, event_id) VALUES ($1, $2, $3, $4)`, k.Key, k.Seq, h.node, ev.ID); err != nil {
				return fmt.Errorf("orderer: %w", err)
			}
			return nil
		}))
	}
	return m, nil
}

func openOrderer(dsn string, m sdk.Module, ob **outbox.Outbox) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(32)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS effects (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL, event_id TEXT NOT NULL)`); err != nil {
		db.Close()
		return err
	}
	if *ob, err = outbox.New(ctx, db, m, outbox.PostgreSQL()); err != nil {
		db.Close()
		return err
	}
	return nil
}

// feed is a feeder's order: emit keyed for each key Prefix+From to
// Prefix+(To-1), Seq 1 to Count.
type feed struct {
	Prefix string `json:"prefix"`
	From   int    `json:"from"`
	To     int    `json:"to"`
	Count  int    `json:"count"`
}

// feeder emits the keyed events of each feed it handles, a key's in
// order (one emit at a time, each confirmed before the next). A feed
// handled again (after a crash) emits the same events again, under the
// same ids (derived from the feed's), which the orderers' inbox
// recognises.
func feeder() sdk.Module {
	return sdk.Module{Name: "feeder", Emits: []string{"keyed"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.feed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var f feed
			if err := ev.Decode(&f); err != nil {
				return sdk.Permanent(err)
			}
			for seq := 1; seq <= f.Count; seq++ {
				for i := f.From; i < f.To; i++ {
					key := fmt.Sprintf("%s%d", f.Prefix, i)
					if _, err := m.Emit(ctx, "keyed", keyed{Key: key, Seq: seq}, sdk.WithKey(key)); err != nil {
						return fmt.Errorf("emit keyed %s/%d: %w", key, seq, err)
					}
				}
			}
			return nil
		}))
	}}
}
