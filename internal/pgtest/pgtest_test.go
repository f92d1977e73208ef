package pgtest_test

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/meshkit/mesh/internal/pgtest"
)

// TestStart: a cluster of the test's own answers through pgx's
// database/sql driver, and two transactions claim different rows with
// FOR UPDATE SKIP LOCKED (what the outbox relays of several servers
// sharing one database will rely on).
func TestStart(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pgtest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE rows (id int PRIMARY KEY); INSERT INTO rows SELECT generate_series(1, 4)`); err != nil {
		t.Fatal(err)
	}
	claim := func(tx *sql.Tx) int {
		t.Helper()
		var id int
		if err := tx.QueryRowContext(ctx, `SELECT id FROM rows ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback()
	b, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Rollback()
	if x, y := claim(a), claim(b); x != 1 || y != 2 {
		t.Errorf("claimed %d and %d, want 1 and 2", x, y)
	}
}
