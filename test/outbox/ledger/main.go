// Command ledger is the module binary of the outbox's crash tests
// (test/outbox): it books orders in its database through its inbox and
// emits module.ledger.booked for each through its outbox (sdk/outbox), in
// the same transaction.
//
//	ledger sqlite PATH DIR
//	ledger postgres DSN DIR
//
// Files in DIR kill the process at a point, each once (it removes the
// file first): kill-after-commit right after a handler's commit, before
// the delivery is acknowledged; kill-after-publish right after the mesh
// confirmed a row, before the relay marks it sent. While no-relay exists
// when the process starts, its relay does not run (a handler that kills
// itself after its commit removes it, so the next process relays); while
// hold-relay exists, the relay waits to start (the test reads the lease
// a killed relay left before the next one takes it).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 4 {
		return fmt.Errorf("usage: ledger sqlite|postgres DSN DIR")
	}
	kind, dsn, dir := os.Args[1], os.Args[2], os.Args[3]
	var db *sql.DB
	var err error
	if kind == "sqlite" {
		db, err = outbox.OpenSQLite(dsn)
	} else {
		db, err = sql.Open("pgx", dsn)
	}
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	// applied counts each order's effect: the inbox makes it 1 whatever
	// crashes.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS applied (n integer PRIMARY KEY, times integer NOT NULL)`); err != nil {
		return err
	}
	def := sdk.Module{Name: "ledger", Emits: []string{"booked"}}
	ob, err := outbox.New(ctx, db, def)
	if err != nil {
		return err
	}
	apply := `INSERT INTO applied (n, times) VALUES (?, 1) ON CONFLICT (n) DO UPDATE SET times = applied.times + 1`
	if kind != "sqlite" {
		apply = strings.Replace(apply, "?", "$1", 1)
	}
	def.Setup = func(m sdk.Mesh) error {
		book := ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			var order struct{ N int }
			if err := json.Unmarshal(ev.Body, &order); err != nil {
				return sdk.Permanent(err)
			}
			if _, err := tx.ExecContext(ctx, apply, order.N); err != nil {
				return err
			}
			if _, err := ob.Emit(ctx, tx, "booked", map[string]int{"n": order.N}); err != nil {
				return err
			}
			if takeMarker(dir, "kill-before-commit") {
				kill()
			}
			return nil
		})
		return m.On("mesh.ledger.book", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			err := book.HandleEvent(ctx, ev) // the effect is committed when it returns nil
			if err == nil && takeMarker(dir, "kill-after-commit") {
				_ = os.Remove(filepath.Join(dir, "no-relay"))
				kill()
			}
			return err
		}))
	}
	def.Run = func(ctx context.Context, m sdk.Mesh) error {
		if _, err := os.Stat(filepath.Join(dir, "no-relay")); err == nil {
			return nil
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "hold-relay")); err != nil {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		return ob.Relay(ctx, killingMesh{Mesh: m, dir: dir})
	}
	return process.Run(def)
}

// killingMesh kills the process after an emit the mesh confirmed, when
// kill-after-publish says so.
type killingMesh struct {
	sdk.Mesh
	dir string
}

func (k killingMesh) Emit(ctx context.Context, name string, body any, opts ...sdk.EmitOption) (string, error) {
	id, err := k.Mesh.Emit(ctx, name, body, opts...)
	var order struct{ N int }
	if raw, ok := body.([]byte); ok {
		_ = json.Unmarshal(raw, &order)
	}
	if err == nil && takeMarker(k.dir, fmt.Sprintf("kill-after-publish-%d", order.N)) {
		kill()
	}
	return id, err
}

// ReportOutbox passes the relay's backlog on to the host, for its
// metrics.
func (k killingMesh) ReportOutbox(st wire.OutboxStats) {
	if r, ok := k.Mesh.(wire.OutboxReporter); ok {
		r.ReportOutbox(st)
	}
}

// takeMarker removes the file name in dir and says whether it was there.
func takeMarker(dir, name string) bool {
	return os.Remove(filepath.Join(dir, name)) == nil
}

func kill() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
