package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
	"github.com/meshkit/mesh/sdk/outbox"
)

// A module changes its database and emits in one transaction: the event
// exists only if the change commits. Flush publishes what is committed
// (a module's Run, ob.Relay, does it by itself); a handler through the
// inbox applies each event once.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	db, err := outbox.OpenSQLite(filepath.Join(dir, "shop.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	_, _ = db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY)`)

	shop := sdk.Module{Name: "shop", Emits: []string{"order.placed"}}
	ob, err := outbox.New(ctx, db, shop)
	if err != nil {
		fmt.Println(err)
		return
	}
	var mesh sdk.Mesh
	shop.Setup = func(m sdk.Mesh) error { mesh = m; return nil }
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(shop, meshtest.ModuleConfig{})

	for _, order := range []string{"A-1", "A-2"} {
		tx, _ := db.BeginTx(ctx, nil)
		_, _ = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, order)
		_, _ = ob.Emit(ctx, tx, "order.placed", map[string]string{"order": order})
		if order == "A-2" {
			_ = tx.Rollback() // the order and its event are gone together
			continue
		}
		_ = tx.Commit()
	}
	n, err := ob.Flush(ctx, mesh)
	fmt.Println("published", n, err)
	for _, ev := range mt.Emitted() {
		fmt.Println(ev.Type, string(ev.Body))
	}

	// The inbox: the handler's effect and its record commit together.
	handler := ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, "B-"+ev.ID[:4])
		return err
	})
	ev := sdk.Event{ID: "01JEXAMPLE0000000000000000", Type: "module.web.cart.paid", Body: []byte(`{}`)}
	fmt.Println(handler.HandleEvent(ctx, ev), handler.HandleEvent(ctx, ev)) // the second is a repeat: not run
	var orders int
	_ = db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders", orders)
	// Output:
	// published 1 <nil>
	// module.shop.order.placed {"order":"A-1"}
	// <nil> <nil>
	// orders 2
}
