package outboxstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
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
		rows, _, err := s.Pending(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(rows); !slices.Equal(got, []string{"a", "b"}) || string(rows[0].Body) != `{"n":1}` || rows[0].Type != "module.ledger.booked" {
			t.Fatalf("pending %v (%+v), want a and b", got, rows)
		}
		if err := s.MarkSent(ctx, time.Now(), rows[0].Seq); err != nil {
			t.Fatal(err)
		}
		if rows, _, _ := s.Pending(ctx, 10); !slices.Equal(ids(rows), []string{"b"}) {
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
	if rows, _, err := s.Pending(ctx, 10); err != nil || len(rows) != 0 {
		t.Fatalf("pending while the first row's transaction runs: %v %v, want none", ids(rows), err)
	}
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	if rows, _, err := s.Pending(ctx, 10); err != nil || !slices.Equal(ids(rows), []string{"first", "second"}) {
		t.Errorf("pending after both committed: %v %v, want first, second", ids(rows), err)
	}
}

// TestRowsKeepTheirOptions: what Append stores of an emit's options comes
// back from Pending; a row of an id already there (a handling run again)
// is kept as it was; a row set aside leaves Pending and counts as failed
// in the backlog.
func TestRowsKeepTheirOptions(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx := context.Background()
		s := open(t, db, dialect)
		p := uint8(7)
		want := outboxstore.Options{Schema: "2", TTLMillis: 1500, Priority: &p, AtUnixMillis: 1_800_000_000_000, Cause: "01J0000000000000000000000A", Scope: "01J0000000000000000000000A", N: 3, IDUnixMillis: 1_700_000_000_000}
		written := time.Now()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := s.Append(ctx, tx, outboxstore.Row{ID: "a", Type: "module.ledger.booked", Body: []byte(`{"n":1}`), Options: want, WrittenAt: written})
		if err != nil || seq == 0 {
			t.Fatalf("append: %d %v", seq, err)
		}
		again, err := s.Append(ctx, tx, outboxstore.Row{ID: "a", Type: "module.ledger.other", Body: []byte(`{"n":2}`), WrittenAt: written})
		if err != nil || again != 0 {
			t.Fatalf("append of the same id: %d %v, want 0 and no error", again, err)
		}
		if _, err := s.Append(ctx, tx, outboxstore.Row{ID: "b", Type: "module.ledger.booked", Body: []byte(`{}`), WrittenAt: written}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		rows, bad, err := s.Pending(ctx, 10)
		if err != nil || len(bad) != 0 || len(rows) != 2 {
			t.Fatalf("pending: %d rows, bad %v, %v", len(rows), bad, err)
		}
		got := rows[0].Options
		if got.Priority == nil || *got.Priority != 7 || got.Schema != want.Schema || got.TTLMillis != want.TTLMillis || got.AtUnixMillis != want.AtUnixMillis ||
			got.Cause != want.Cause || got.Scope != want.Scope || got.N != want.N || got.IDUnixMillis != want.IDUnixMillis {
			t.Errorf("options %+v, want %+v", got, want)
		}
		if string(rows[0].Body) != `{"n":1}` || rows[0].Type != "module.ledger.booked" || rows[0].WrittenAt.UnixNano() != written.UnixNano() {
			t.Errorf("row %+v: the second append of its id changed it", rows[0])
		}
		if err := s.MarkFailed(ctx, rows[0].Seq, "forbidden"); err != nil {
			t.Fatal(err)
		}
		if rows, _, _ := s.Pending(ctx, 10); !slices.Equal(ids(rows), []string{"b"}) {
			t.Errorf("pending after a was set aside: %v", ids(rows))
		}
		b, err := s.Backlog(ctx)
		if err != nil || b.Unsent != 1 || b.Failed != 1 || b.Oldest.UnixNano() != written.UnixNano() {
			t.Errorf("backlog %+v %v, want 1 unsent written at %v, 1 failed", b, err, written)
		}

		// A row whose options were damaged is handed back as bad, not
		// misread.
		if _, err := db.Exec(`UPDATE mesh_outbox SET options = '{"scope":1}' WHERE id = 'b'`); err != nil {
			t.Fatal(err)
		}
		if rows, bad, err := s.Pending(ctx, 10); err != nil || len(rows) != 1 || bad[rows[0].Seq] == nil {
			t.Errorf("pending with damaged options: %v, bad %v, %v", ids(rows), bad, err)
		}
	})
}

// TestOneRelayHoldsTheLease: two relays sharing a database: the first
// holds the lease, the second is refused until the lease runs out or is
// released; the holder renews it.
func TestOneRelayHoldsTheLease(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx := context.Background()
		s := open(t, db, dialect)
		now := time.Now()
		lease := func(holder string, at time.Time) bool {
			t.Helper()
			ok, err := s.Lease(ctx, holder, at, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if !lease("a", now) {
			t.Fatal("a free lease was refused")
		}
		if lease("b", now.Add(time.Second)) {
			t.Fatal("b took a's lease while it held it")
		}
		if !lease("a", now.Add(5*time.Second)) {
			t.Fatal("a could not renew its lease")
		}
		if lease("b", now.Add(14*time.Second)) {
			t.Fatal("b took the renewed lease before it ran out")
		}
		if !lease("b", now.Add(16*time.Second)) {
			t.Fatal("b could not take a lease that ran out")
		}
		if err := s.Release(ctx, "a"); err != nil { // no longer a's: changes nothing
			t.Fatal(err)
		}
		if lease("a", now.Add(17*time.Second)) {
			t.Fatal("a's release of a lease it lost freed b's")
		}
		if err := s.Release(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if !lease("a", now.Add(17*time.Second)) {
			t.Fatal("a could not take a released lease")
		}
	})
}

// TestTheRelayLockIsOneAtATime: the relay lock is held by one store at
// a time (two stores on one database, as two processes would be); once
// its holder gives it up, another takes it and seizes the lease at once,
// learning whose it was. On PostgreSQL a holder whose lease ran out
// unrenewed has its session ended (EndLapsedHolder), which frees the lock.
func TestTheRelayLockIsOneAtATime(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, b := open(t, db, dialect), open(t, db, dialect)
		la, err := a.TryRelayLock(ctx)
		if err != nil || la == nil {
			t.Fatalf("a free relay lock: %v %v", la, err)
		}
		now := time.Now()
		if _, err := a.Seize(ctx, la, "a", now, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if lb, err := b.TryRelayLock(ctx); err != nil || lb != nil {
			t.Fatalf("b took the relay lock a holds: %v %v", lb, err)
		}
		if ended, err := b.EndLapsedHolder(ctx, outboxstore.LeaseRow{Holder: "a", Until: now.Add(10 * time.Second)}); err != nil || ended != (dialect == outboxstore.PostgreSQL) {
			t.Fatalf("ending a's session: %v %v, want it ended on PostgreSQL alone", ended, err)
		}
		if dialect == outboxstore.SQLite {
			if err := la.Close(); err != nil {
				t.Fatal(err)
			}
		}
		var lb *outboxstore.RelayLock
		for lb == nil { // PostgreSQL frees the lock as the ended session goes
			if lb, err = b.TryRelayLock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		defer lb.Close()
		was, err := b.Seize(ctx, lb, "b", now.Add(time.Second), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if was.Holder != "a" || !was.Until.Equal(time.Unix(0, now.Add(10*time.Second).UnixNano())) {
			t.Errorf("b seized the lease from %+v, want a's until %v", was, now.Add(10*time.Second))
		}
		if row, err := a.LeaseHolder(ctx); err != nil || row.Holder != "b" {
			t.Errorf("the lease is %+v %v, want b's", row, err)
		}
		if dialect == outboxstore.PostgreSQL {
			if _, err := a.Seize(ctx, la, "a", now.Add(2*time.Second), 10*time.Second); err == nil {
				t.Error("a renewed its lease on the session that was ended")
			}
			la.Close()
		}
	})
}

// FuzzDecodeOptions: no stored options crash the decoder, and what it
// accepts encodes back to options it accepts the same.
func FuzzDecodeOptions(f *testing.F) {
	f.Add([]byte(`{"scope":"e","n":1,"id_ms":5}`))
	f.Add([]byte(`{"schema":"2","ttl_ms":10,"priority":9,"at_ms":1,"cause":"c","scope":"s","n":0,"id_ms":0}`))
	f.Add([]byte(`{"priority":10}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		o, err := outboxstore.DecodeOptions(raw)
		if err != nil {
			return
		}
		again, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		o2, err := outboxstore.DecodeOptions(again)
		if err != nil {
			t.Fatalf("%s decoded, its encoding %s does not: %v", raw, again, err)
		}
		if !reflect.DeepEqual(o, o2) {
			t.Fatalf("%+v came back as %+v", o, o2)
		}
	})
}

// TestAClosedRelayLockIsFreeAtOnce: a relay that gives its lock up (Close)
// leaves it free when Close returns, so the next relay, or a Flush, that
// tries at once takes it. On PostgreSQL the lock is a session's, and the
// server ends a closed session on its own time: unlocked only by the
// session's end, a try right after Close could find it still held (the
// make test of issue 60's landing saw a Flush refused so).
func TestAClosedRelayLockIsFreeAtOnce(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sql.DB, dialect outboxstore.Dialect) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, b := open(t, db, dialect), open(t, db, dialect)
		for i := range 100 {
			l, err := a.TryRelayLock(ctx)
			if err != nil || l == nil {
				t.Fatalf("try %d: a free relay lock: %v %v", i, l, err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			lb, err := b.TryRelayLock(ctx)
			if err != nil || lb == nil {
				t.Fatalf("try %d: the lock was still held right after its holder closed it: %v %v", i, lb, err)
			}
			if err := lb.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
