package outboxstore_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/meshkit/mesh/internal/outboxstore"
	"github.com/meshkit/mesh/internal/pgtest"
)

// databases runs test on a SQLite file and on a PostgreSQL cluster of its
// own.
func databases(t *testing.T, test func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "module.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		test(t, db, outboxstore.SQLite)
	})
	t.Run("postgresql", func(t *testing.T) {
		t.Parallel()
		db, err := sql.Open("pgx", pgtest.Start(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		test(t, db, outboxstore.PostgreSQL)
	})
}

func open(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) *outboxstore.Store {
	t.Helper()
	s, err := outboxstore.Open(context.Background(), db, dialect)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ids are the ids of rows.
func ids(rows []outboxstore.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// TestOutboxCommitsWithTheChange: a row written in a transaction that
// rolls back does not exist; one that commits is pending, in order, until
// it is marked sent, then pruned. Opening again keeps the epoch.
func TestOutboxCommitsWithTheChange(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx := context.Background()
		s := open(t, db, dialect)
		write := func(id string, commit bool) {
			t.Helper()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Append(ctx, tx, outboxstore.Row{ID: id, Type: "module.ledger.booked", Body: []byte(`{"n":1}`), WrittenAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		write("a", true)
		write("rolled-back", false)
		write("b", true)
		rows, err := s.Pending(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(rows); !slices.Equal(got, []string{"a", "b"}) || string(rows[0].Body) != `{"n":1}` || rows[0].Type != "module.ledger.booked" {
			t.Fatalf("pending %v (%+v), want a and b", got, rows)
		}
		if err := s.MarkSent(ctx, time.Now(), rows[0].Seq); err != nil {
			t.Fatal(err)
		}
		if rows, _ := s.Pending(ctx, 10); !slices.Equal(ids(rows), []string{"b"}) {
			t.Errorf("pending after a was sent: %v", ids(rows))
		}
		if n, err := s.Prune(ctx, time.Now().Add(time.Second)); err != nil || n != 1 {
			t.Errorf("pruned %d (%v), want 1", n, err)
		}
		if again := open(t, db, dialect); again.Epoch() != s.Epoch() || len(s.Epoch()) != 32 {
			t.Errorf("epoch %q, then %q", s.Epoch(), again.Epoch())
		}
	})
}

// TestInboxDuplicatesAndConflicts: an id recorded once is New; again with
// the same digest a Duplicate carrying the stored decision; with another
// digest a Conflict naming both. A record in a transaction that rolls
// back is not there.
func TestInboxDuplicatesAndConflicts(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx := context.Background()
		s := open(t, db, dialect)
		record := func(id, digest string, commit bool) (outboxstore.Seen, []byte, error) {
			t.Helper()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			seen, decision, err := s.Record(ctx, tx, id, digest, time.Now())
			if err == nil && seen == outboxstore.New {
				err = s.Decide(ctx, tx, id, []byte(`"ok"`))
			}
			if err == nil && commit {
				err = tx.Commit()
			}
			return seen, decision, err
		}
		if seen, _, err := record("x", "d1", false); err != nil || seen != outboxstore.New {
			t.Fatalf("first record, rolled back: %v %v", seen, err)
		}
		if seen, _, err := record("x", "d1", true); err != nil || seen != outboxstore.New {
			t.Fatalf("record after the rollback: %v %v, want New", seen, err)
		}
		if seen, decision, err := record("x", "d1", true); err != nil || seen != outboxstore.Duplicate || string(decision) != `"ok"` {
			t.Errorf("same digest: %v %q %v, want Duplicate with the decision", seen, decision, err)
		}
		seen, _, err := record("x", "d2", true)
		if seen != outboxstore.Conflict || !errors.Is(err, outboxstore.ErrConflict) {
			t.Errorf("other digest: %v %v, want Conflict", seen, err)
		}
	})
}

// TestNewerFormatIsRefused: tables a later release wrote are refused,
// naming both formats, and left as they are.
func TestNewerFormatIsRefused(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		open(t, db, dialect)
		if _, err := db.Exec(`UPDATE mesh_outbox_meta SET value = '2' WHERE key = 'format'`); err != nil {
			t.Fatal(err)
		}
		if _, err := outboxstore.Open(context.Background(), db, dialect); !errors.Is(err, outboxstore.ErrNewerFormat) {
			t.Errorf("open over format 2: %v, want %v", err, outboxstore.ErrNewerFormat)
		}
		var v string
		if err := db.QueryRow(`SELECT value FROM mesh_outbox_meta WHERE key = 'format'`).Scan(&v); err != nil || v != "2" {
			t.Errorf("format after the refusal: %q %v", v, err)
		}
	})
}

// TestPendingInCommitOrderOnPostgreSQL: on PostgreSQL a row with a lower
// sequence can commit after one with a higher. Pending holds back every
// row written after the oldest transaction still running, so what it
// returns is never overtaken: with the lower row's transaction open, the
// committed higher one waits; once it commits, both come, in order.
func TestPendingInCommitOrderOnPostgreSQL(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pgtest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	s := open(t, db, outboxstore.PostgreSQL)
	early, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback()
	if _, err := s.Append(ctx, early, outboxstore.Row{ID: "first", Type: "t", Body: []byte("1"), WrittenAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	late, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, late, outboxstore.Row{ID: "second", Type: "t", Body: []byte("2"), WrittenAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := late.Commit(); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.Pending(ctx, 10); err != nil || len(rows) != 0 {
		t.Fatalf("pending while the first row's transaction runs: %v %v, want none", ids(rows), err)
	}
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.Pending(ctx, 10); err != nil || !slices.Equal(ids(rows), []string{"first", "second"}) {
		t.Errorf("pending after both committed: %v %v, want first, second", ids(rows), err)
	}
}
