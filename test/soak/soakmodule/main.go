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
