// Package ledger is an example module that keeps an order ledger in its
// own SQLite database and emits from it with the transactional outbox and
// inbox (sdk/outbox): its tool ledger.book books an order and writes the
// module.ledger.order.booked event in the same transaction, exactly once
// per request, and its relay publishes the event after the commit.
package ledger

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
)

// Order is the request of ledger.book.
type Order struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
}

// Booked is its response, and the body of order.booked: the order and
// the ledger's balance after it.
type Booked struct {
	ID           string `json:"id"`
	Cents        int    `json:"cents"`
	BalanceCents int    `json:"balance_cents"`
}

// Module returns the ledger module on the SQLite database at path (made
// if missing), with its outbox. Close the returned database when the
// module is done.
func Module(ctx context.Context, path string) (sdk.Module, *sql.DB, error) {
	db, err := outbox.OpenSQLite(path)
	if err != nil {
		return sdk.Module{}, nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)`); err != nil {
		db.Close()
		return sdk.Module{}, nil, fmt.Errorf("ledger: %w", err)
	}
	mod := sdk.Module{
		Name:  "ledger",
		Emits: []string{"order.booked"},
	}
	ob, err := outbox.New(ctx, db, mod)
	if err != nil {
		db.Close()
		return sdk.Module{}, nil, err
	}
	mod.Setup = func(m sdk.Mesh) error {
		// Through the inbox: a request repeated (a retried call, after a
		// restart) gets the stored answer, and books nothing twice.
		return m.Serve("ledger.book", ob.ToolHandler(func(ctx context.Context, tx *sql.Tx, req sdk.Request) (any, error) {
			var o Order
			if err := req.Decode(&o); err != nil || o.ID == "" || o.Cents <= 0 {
				return nil, &sdk.ToolError{Code: "bad_order", Message: fmt.Sprintf("cannot book %s", req.Body), Permanent: true}
			}
			var booked int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE id = ?`, o.ID).Scan(&booked); err != nil {
				return nil, err
			}
			if booked > 0 { // another request booked it: refused, and the refusal is stored too
				return nil, &sdk.ToolError{Code: "already_booked", Message: "order " + o.ID + " is booked already", Permanent: true}
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, cents) VALUES (?, ?)`, o.ID, o.Cents); err != nil {
				return nil, err
			}
			b := Booked{ID: o.ID, Cents: o.Cents}
			if err := tx.QueryRowContext(ctx, `SELECT sum(cents) FROM orders`).Scan(&b.BalanceCents); err != nil {
				return nil, err
			}
			// The event commits with the order, or neither does.
			if _, err := ob.Emit(ctx, tx, "order.booked", b); err != nil {
				return nil, err
			}
			return b, nil
		}))
	}
	mod.Run = ob.Relay
	return mod, db, nil
}
