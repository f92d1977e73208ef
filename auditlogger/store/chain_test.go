package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// edit runs stmts on the closed store's file through a connection of its
// own, as someone with the file would.
func edit(t *testing.T, path string, stmts ...string) {
	t.Helper()
	editWith(t, path, func(db *sql.DB) {
		for _, q := range stmts {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	})
}

// editWith hands f a connection of its own to the closed store's file.
func editWith(t *testing.T, path string, f func(db *sql.DB)) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f(db)
}

// reopen opens the store at path again, closed when the test ends.
func reopen(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// verify runs Verify, failing the test on an error.
func verify(t *testing.T, s *Store) Report {
	t.Helper()
	r, err := s.Verify(context.Background())
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return r
}

// hashAt is the raw hash of the row at seq.
func hashAt(t *testing.T, db *sql.DB, seq int64) []byte {
	t.Helper()
	var h []byte
	if err := db.QueryRow(`SELECT hash FROM events WHERE seq = ?`, seq).Scan(&h); err != nil {
		t.Fatalf("hash at seq %d: %v", seq, err)
	}
	return h
}

// history is n events as read from the history stream, at offsets 100 up.
func history(n int) []Event {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = event(i+1, "module.shop.order.paid")
		o := int64(100 + i)
		evs[i].Offset = &o
	}
	return evs
}

// TestChainHashReadsBack: the hash the store records for a row is
// ChainHash of the event as given and of the event as Get reads it back,
// whatever its body (JSON, raw, empty, none) and headers (none, HTML
// characters, text that is not UTF-8); Get and HashOf report it; the
// bodies read back byte for byte.
func TestChainHashReadsBack(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	mk := func(i int, body []byte, headers map[string]string) Event {
		ev := event(i, "mesh.odd.body")
		ev.Body, ev.Headers = body, headers
		return ev
	}
	evs := []Event{
		mk(1, []byte(`{"a": [1, 2]}`), nil),
		mk(2, []byte{0xff, 0, '{'}, map[string]string{}),
		mk(3, nil, map[string]string{"x-html": "<a&b>", "x-line": "a\u2028b\n"}),
		mk(4, []byte{}, map[string]string{"x-bad": "caf\xe9", "x-\xff": "v"}),
		mk(5, []byte(`"caf`+"\xe9"+`"`), nil), // JSON-shaped but not UTF-8: stored raw
		mk(6, []byte(`  7 `), nil),
		{ID: "not-utf8-\xff", Type: "mesh.\xfe.x", UserID: "u", Malformed: "x-event-id is not a ULID", Arrived: t0},
	}
	if _, err := s.Add(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	prev := Genesis()
	for _, ev := range evs {
		got, err := s.Get(ctx, ev.ID)
		if err != nil {
			t.Fatalf("get %q: %v", ev.ID, err)
		}
		if !bytes.Equal(got.Body, ev.Body) {
			t.Errorf("%q: body %q read back as %q", ev.ID, ev.Body, got.Body)
		}
		want := hex.EncodeToString(ChainHash(prev, ev))
		if back := hex.EncodeToString(ChainHash(prev, got)); back != want {
			t.Errorf("%q: ChainHash of the event as read back %s, as given %s", ev.ID, back, want)
		}
		if h, err := s.HashOf(ctx, ev.ID); err != nil || h != want || got.Hash != want {
			t.Errorf("%q: HashOf %s, %v; Get's Hash %s; want %s", ev.ID, h, err, got.Hash, want)
		}
		prev, _ = hex.DecodeString(want)
	}
	if r := verify(t, s); r.Problem != nil || r.Rows != int64(len(evs)) {
		t.Errorf("report %+v, problem %+v", r, r.Problem)
	}
	if _, err := s.HashOf(ctx, "01JNOPE"); !errors.Is(err, ErrNotFound) {
		t.Errorf("hash of an unknown id: %v", err)
	}
}

// TestChainHashFields: what the hash covers and what it does not.
func TestChainHashFields(t *testing.T) {
	base := Event{ID: "ab", Type: "c", UserID: "u", Malformed: "", Headers: map[string]string{"k": "v"}, Body: []byte("b")}
	h := hex.EncodeToString(ChainHash(nil, base))
	if g := hex.EncodeToString(ChainHash(Genesis(), base)); g != h {
		t.Errorf("nil prev %s, Genesis %s", h, g)
	}
	same := map[string]func(*Event){
		"arrival":     func(e *Event) { e.Arrived = t0 },
		"redelivered": func(e *Event) { e.Redelivered = true },
		"seq":         func(e *Event) { e.Seq = 9 },
		"hash":        func(e *Event) { e.Hash = "00" },
	}
	for name, change := range same {
		ev := base
		change(&ev)
		if got := hex.EncodeToString(ChainHash(nil, ev)); got != h {
			t.Errorf("%s changed the hash", name)
		}
	}
	differ := map[string]func(*Event){
		"id/type split":       func(e *Event) { e.ID, e.Type = "a", "bc" },
		"type/user split":     func(e *Event) { e.Type, e.UserID = "cu", "" },
		"malformed":           func(e *Event) { e.Malformed = "x" },
		"offset":              func(e *Event) { o := int64(7); e.Offset = &o },
		"source":              func(e *Event) { e.Source = "s" },
		"node":                func(e *Event) { e.Node = "n" },
		"causation":           func(e *Event) { e.CausationID = "c" },
		"schema":              func(e *Event) { e.Schema = "2" },
		"time":                func(e *Event) { e.Time = t0 },
		"header value":        func(e *Event) { e.Headers = map[string]string{"k": "w"} },
		"header into body":    func(e *Event) { e.Headers, e.Body = nil, []byte(`{"k":"v"}b`) },
		"body":                func(e *Event) { e.Body = []byte("B") },
		"body into malformed": func(e *Event) { e.Body, e.Malformed = nil, "b" },
		"user into malformed": func(e *Event) { e.UserID, e.Malformed = "", "u" },
	}
	for name, change := range differ {
		ev := base
		change(&ev)
		if got := hex.EncodeToString(ChainHash(nil, ev)); got == h {
			t.Errorf("%s kept the hash", name)
		}
	}
	if a, b := ChainHash(nil, Event{ID: "x"}), ChainHash(nil, Event{ID: "x", Body: []byte{}, Headers: map[string]string{}}); !bytes.Equal(a, b) {
		t.Error("no body and headers hash unlike empty ones")
	}
	if a, b := ChainHash(nil, base), ChainHash(ChainHash(nil, base), base); bytes.Equal(a, b) {
		t.Error("prev is not covered")
	}
}

// FuzzChainHash: what ChainHash hashes is a different string for any two
// events that differ in a field it covers (as the store keeps them), so
// no shift of bytes from one field to the next keeps a hash.
func FuzzChainHash(f *testing.F) {
	f.Add("ab", "c", "", "", "k", "v", []byte("b"), "a", "bc", "", "", "k", "v", []byte("b"))
	f.Add("a", "", "", "", "", "", []byte(nil), "", "a", "", "", "", "", []byte{})
	f.Add("x", "t", "u", "m", "k", "v", []byte("{}"), "x", "t", "u", "m", "", "", []byte(`{"k":"v"}{}`))
	f.Fuzz(func(t *testing.T, id1, typ1, user1, mal1, hk1, hv1 string, body1 []byte, id2, typ2, user2, mal2, hk2, hv2 string, body2 []byte) {
		mk := func(id, typ, user, mal, hk, hv string, body []byte) (Event, []byte) {
			ev := Event{ID: id, Type: typ, UserID: user, Malformed: mal, Body: body}
			if hk != "" || hv != "" {
				ev.Headers = map[string]string{hk: hv}
			}
			return ev, canonicalHeaders(ev.Headers)
		}
		a, ah := mk(id1, typ1, user1, mal1, hk1, hv1, body1)
		b, bh := mk(id2, typ2, user2, mal2, hk2, hv2, body2)
		var ia, ib bytes.Buffer
		writeChainInput(&ia, nil, a, ah)
		writeChainInput(&ib, nil, b, bh)
		same := a.ID == b.ID && a.Type == b.Type && a.UserID == b.UserID && a.Malformed == b.Malformed &&
			bytes.Equal(ah, bh) && bytes.Equal(a.Body, b.Body)
		if same != bytes.Equal(ia.Bytes(), ib.Bytes()) {
			t.Fatalf("events %+v and %+v: same covered fields %v, same hash input %v", a, b, same, !same)
		}
	})
}

// TestVerifyFindsTampering: each edit of the file, made with a connection
// of its own while the store is closed, is found where it was made. The
// log is ten events from the history stream, seq 1 to 10.
func TestVerifyFindsTampering(t *testing.T) {
	forged := func(seq int64, hash, prev string) string {
		return fmt.Sprintf(`INSERT INTO events (seq, id, type, headers, arrived_ns, hash, prev) VALUES (%d, 'forged', 'mesh.forged.x', '{}', 1, %s, %s)`,
			seq, hash, prev)
	}
	makeRoom := `UPDATE events SET seq = seq + 1000 WHERE seq >= 6` // a gap before the sixth row
	for _, c := range []struct {
		name string
		edit func(t *testing.T, db *sql.DB)
		kind string // "" for none
		at   string // the id of the row named
		rows int64  // rows verified
	}{
		{"untouched", nil, "", "", 10},
		{"body moved from text to blob", sqlEdit(`UPDATE events SET body_raw = CAST(body_json AS BLOB), body_json = NULL WHERE seq = 5`), "", "", 10},
		{"edited body", sqlEdit(`UPDATE events SET body_json = '{"n":999}' WHERE seq = 5`), ProblemChanged, id(5), 4},
		{"edited body of the last row", sqlEdit(`UPDATE events SET body_json = '{}' WHERE seq = 10`), ProblemChanged, id(10), 9},
		{"edited header", sqlEdit(`UPDATE events SET headers = json_set(headers, '$."x-tenant"', 'globex') WHERE seq = 5`), ProblemChanged, id(5), 4},
		{"headers not JSON", sqlEdit(`UPDATE events SET headers = 'nope' WHERE seq = 5`), ProblemChanged, id(5), 4},
		{"edited type", sqlEdit(`UPDATE events SET type = 'mesh.other.x' WHERE seq = 3`), ProblemChanged, id(3), 2},
		{"edited hash", sqlEdit(`UPDATE events SET hash = randomblob(32) WHERE seq = 5`), ProblemChanged, id(5), 4},
		{"erased hash", sqlEdit(`UPDATE events SET hash = NULL WHERE seq = 5`), ProblemChanged, id(5), 4},
		{"deleted middle row", sqlEdit(`DELETE FROM events WHERE seq = 5`), ProblemDeleted, id(6), 4},
		{"deleted first row", sqlEdit(`DELETE FROM events WHERE seq = 1`), ProblemDeleted, id(2), 0},
		{"deleted two rows", sqlEdit(`DELETE FROM events WHERE seq IN (5, 6)`), ProblemDeleted, id(7), 4},
		{"inserted row, garbage hash", sqlEdit(makeRoom, forged(6, "randomblob(32)", "randomblob(32)")), ProblemInserted, "forged", 5},
		{"inserted row, no hash", sqlEdit(makeRoom, forged(6, "NULL", "NULL")), ProblemInserted, "forged", 5},
		{"inserted row, no hash, before the chain", sqlEdit(forged(0, "NULL", "NULL")), ProblemInserted, "forged", 0},
		{"inserted row, garbage hash, before the chain", sqlEdit(forged(0, "randomblob(32)", "NULL")), ProblemInserted, "forged", 0},
		{"inserted row, hash recomputed", func(t *testing.T, db *sql.DB) {
			prev := hashAt(t, db, 5)
			ev := Event{ID: "forged", Type: "mesh.forged.x", Headers: map[string]string{}}
			sqlEdit(makeRoom)(t, db)
			if _, err := db.Exec(`INSERT INTO events (seq, id, type, headers, arrived_ns, hash, prev) VALUES (6, ?, ?, '{}', 1, ?, ?)`,
				ev.ID, ev.Type, ChainHash(prev, ev), prev); err != nil {
				t.Fatal(err)
			}
		}, ProblemInserted, "forged", 5},
		{"swapped pair", sqlEdit(`UPDATE events SET seq = -1 WHERE seq = 4`, `UPDATE events SET seq = 4 WHERE seq = 5`, `UPDATE events SET seq = 5 WHERE seq = -1`),
			ProblemReordered, id(5), 3},
		{"swapped first pair", sqlEdit(`UPDATE events SET seq = -1 WHERE seq = 1`, `UPDATE events SET seq = 1 WHERE seq = 2`, `UPDATE events SET seq = 2 WHERE seq = -1`),
			ProblemReordered, id(2), 0},
		// The columns queries select on are hashed too, beside the headers.
		{"source column edited", sqlEdit(`UPDATE events SET source = 'forged' WHERE seq = 6`), ProblemChanged, id(6), 5},
		{"time column edited", sqlEdit(`UPDATE events SET time_ns = time_ns + 1 WHERE seq = 6`), ProblemChanged, id(6), 5},
		// The offset is hashed too: an edited one is a changed row.
		{"offset moved back", sqlEdit(`UPDATE events SET stream_offset = 50 WHERE seq = 6`), ProblemChanged, id(6), 5},
		{"offset repeated", sqlEdit(`UPDATE events SET stream_offset = 104 WHERE seq = 6`), ProblemChanged, id(6), 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, path := open(t)
			ctx := context.Background()
			if _, err := s.AddHistory(ctx, 110, history(10)...); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if c.edit != nil {
				editWith(t, path, func(db *sql.DB) { c.edit(t, db) })
			}
			r := verify(t, reopen(t, path))
			switch {
			case c.kind == "" && r.Problem != nil:
				t.Fatalf("problem %+v in an untouched log", *r.Problem)
			case c.kind != "" && r.Problem == nil:
				t.Fatalf("no problem found; report %+v", r)
			case c.kind != "" && (r.Problem.Kind != c.kind || r.Problem.ID != c.at):
				t.Fatalf("problem %+v, want %s at %s", *r.Problem, c.kind, c.at)
			}
			if r.Rows != c.rows || r.Head.Rows != c.rows {
				t.Errorf("verified %d rows (head %+v), want %d", r.Rows, r.Head, c.rows)
			}
			if r.Problem != nil {
				t.Logf("%s: %s", r.Problem.Kind, r.Problem.Detail)
			}
		})
	}
}

// sqlEdit is an edit that runs stmts.
func sqlEdit(stmts ...string) func(*testing.T, *sql.DB) {
	return func(t *testing.T, db *sql.DB) {
		t.Helper()
		for _, q := range stmts {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
}

// id is the id of event(i, ...).
func id(i int) string { return event(i, "").ID }

// TestDeletedLastRow: a row taken from the end of the log leaves a chain
// that holds: the chain alone cannot show it. A checkpoint does: the Head
// recorded before is no longer the log's.
func TestDeletedLastRow(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	if _, err := s.AddHistory(ctx, 110, history(10)...); err != nil {
		t.Fatal(err)
	}
	checkpoint, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	edit(t, path, `DELETE FROM events WHERE seq = 10`)
	r := verify(t, reopen(t, path))
	if r.Head.Hash == checkpoint.Hash || r.Head.Rows != checkpoint.Rows-1 || r.Head.Seq != 9 {
		t.Errorf("head %+v after deleting the last row; the checkpoint was %+v", r.Head, checkpoint)
	}
}

// TestChainAcrossReopen: a log closed and opened again verifies with the
// same head, and goes on verifying as rows are added, duplicates among
// them.
func TestChainAcrossReopen(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.Add(ctx, event(i, "mesh.a.x"), event(i/2, "mesh.a.x")); err != nil {
			t.Fatal(err)
		}
	}
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := verify(t, s)
	if r.Problem != nil || r.Rows != 10 || r.Head != head || head.Rows != 10 || head.ID != id(9) {
		t.Fatalf("report %+v, head %+v", r, head)
	}
	if h, err := s.HashOf(ctx, id(9)); err != nil || h != head.Hash {
		t.Errorf("HashOf the newest %s, %v; head %s", h, err, head.Hash)
	}
	s.Close()
	s = reopen(t, path)
	again, err := s.Head(ctx)
	if err != nil || again != head {
		t.Fatalf("head after reopening %+v, %v; before %+v", again, err, head)
	}
	if r := verify(t, s); r.Problem != nil || r.Head != head {
		t.Fatalf("after reopening: %+v", r)
	}
	if _, err := s.Add(ctx, event(10, "mesh.a.x"), event(3, "mesh.a.x"), event(11, "mesh.a.x")); err != nil {
		t.Fatal(err)
	}
	r = verify(t, s)
	if r.Problem != nil || r.Rows != 12 || r.Head.ID != id(11) {
		t.Fatalf("after adding more: %+v", r)
	}
	got, err := s.Get(ctx, id(10))
	if err != nil || got.Hash == "" {
		t.Fatalf("get: %+v, %v", got, err)
	}
}

// TestChainSurvivesFailedTransaction: a transaction that fails leaves the
// head where it was, so what is added next links to the last row stored.
func TestChainSurvivesFailedTransaction(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	if _, err := s.Add(ctx, event(1, "mesh.a.x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`CREATE TRIGGER boom BEFORE INSERT ON events WHEN NEW.id = 'boom' BEGIN SELECT RAISE(ABORT, 'boom'); END`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, event(2, "mesh.a.x"), Event{ID: "boom", Type: "mesh.a.x"}); err == nil {
		t.Fatal("the trigger did not fail the transaction")
	}
	if _, err := s.Add(ctx, event(3, "mesh.a.x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, id(2)); !errors.Is(err, ErrNotFound) {
		t.Errorf("an event of the failed transaction: %v", err)
	}
	if r := verify(t, s); r.Problem != nil || r.Rows != 2 {
		t.Errorf("report %+v, problem %+v", r, r.Problem)
	}
}

// TestChainAfterPrune: retention records the anchor, so what it leaves
// verifies, through a reopen, and so does what is added after; pruning
// everything leaves the anchor as the head.
func TestChainAfterPrune(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	var evs []Event
	for i := range 2500 {
		ev := event(i, "mesh.old.tick")
		ev.Arrived = t0.Add(time.Duration(i) * time.Second)
		evs = append(evs, ev)
	}
	if _, err := s.Add(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	head, _ := s.Head(ctx)
	if n, err := s.Prune(ctx, Retention{Before: t0.Add(1500 * time.Second)}); err != nil || n != 1500 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	r := verify(t, s)
	if r.Problem != nil || r.Rows != 1000 || r.Head.Hash != head.Hash {
		t.Fatalf("after pruning: %+v, head before %+v", r, head)
	}
	if now, _ := s.Head(ctx); now != r.Head {
		t.Errorf("head %+v, verified %+v", now, r.Head)
	}
	if n, err := s.Prune(ctx, Retention{Before: t0.Add(time.Hour)}); err != nil || n != 1000 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	empty, err := s.Head(ctx)
	if err != nil || empty != (Head{Hash: head.Hash}) {
		t.Fatalf("head of the emptied log %+v, %v; want the last hash %s", empty, err, head.Hash)
	}
	if r := verify(t, s); r.Problem != nil || r.Rows != 0 || r.Head != empty {
		t.Fatalf("emptied log: %+v", r)
	}
	s.Close()
	s = reopen(t, path)
	if _, err := s.Add(ctx, event(9999, "mesh.new.tick")); err != nil {
		t.Fatal(err)
	}
	if r := verify(t, s); r.Problem != nil || r.Rows != 1 {
		t.Fatalf("after adding to the emptied log: %+v, %+v", r, r.Problem)
	}
}

// TestChainIsTheLoggersOwn: two stores given the same events in the same
// order, one through Add one at a time, the other through AddHistory in
// batches with duplicates, at other arrival times and redelivered, hold
// the same chain.
func TestChainIsTheLoggersOwn(t *testing.T) {
	ctx := context.Background()
	a, _ := open(t)
	b, _ := open(t)
	evs := history(20)
	for i, ev := range evs {
		ev.Arrived = t0.Add(time.Duration(i) * time.Second)
		if _, err := a.Add(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	for start := 0; start < len(evs); start += 3 {
		batch := evs[start:min(start+3, len(evs))]
		if start > 0 {
			batch = append([]Event{evs[start-1]}, batch...) // read again
		}
		for i := range batch {
			batch[i].Arrived, batch[i].Redelivered = t0.Add(time.Hour), true
		}
		if _, err := b.AddHistory(ctx, *batch[len(batch)-1].Offset+1, batch...); err != nil {
			t.Fatal(err)
		}
	}
	ha, _ := a.Head(ctx)
	hb, _ := b.Head(ctx)
	if ha.Hash != hb.Hash || ha.ID != hb.ID || ha.Rows != hb.Rows || ha.Rows != 20 {
		t.Errorf("heads %+v and %+v", ha, hb)
	}
	if r := verify(t, b); r.Problem != nil || r.Head != hb {
		t.Errorf("report %+v", r)
	}
	got, err := b.Get(ctx, evs[4].ID)
	if err != nil || got.Offset == nil || *got.Offset != 104 {
		t.Errorf("offset read back: %+v, %v", got.Offset, err)
	}
}

// TestAddHistory: duplicates are no rows and do not move the head; the
// position is recorded with every batch, one of only duplicates or of
// none included, and kept across a reopen; offsets out of order are
// refused.
func TestAddHistory(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	if _, ok, err := s.HistoryNext(ctx); ok || err != nil {
		t.Fatalf("a new store has a position: %v, %v", ok, err)
	}
	evs := history(5)
	if n, err := s.AddHistory(ctx, 103, evs[:3]...); err != nil || n != 3 {
		t.Fatalf("added %d, %v", n, err)
	}
	head, _ := s.Head(ctx)
	if n, err := s.AddHistory(ctx, 105, evs[1], evs[2]); err != nil || n != 0 {
		t.Fatalf("added duplicates %d, %v", n, err)
	}
	if again, _ := s.Head(ctx); again != head {
		t.Errorf("duplicates moved the head from %+v to %+v", head, again)
	}
	if next, ok, err := s.HistoryNext(ctx); err != nil || !ok || next != 105 {
		t.Errorf("position %d, %v, %v; want 105", next, ok, err)
	}
	s.Close()
	s = reopen(t, path)
	if next, ok, err := s.HistoryNext(ctx); err != nil || !ok || next != 105 {
		t.Errorf("position after reopening %d, %v, %v; want 105", next, ok, err)
	}
	if n, err := s.AddHistory(ctx, 106); err != nil || n != 0 {
		t.Fatalf("empty batch: %d, %v", n, err)
	}
	if next, _, _ := s.HistoryNext(ctx); next != 106 {
		t.Errorf("position %d after an empty batch, want 106", next)
	}
	for name, c := range map[string]struct {
		next  int64
		batch []Event
	}{
		"offsets back":    {200, []Event{evs[4], evs[3]}},
		"offset repeated": {200, []Event{evs[3], evs[3]}},
		"offset at next":  {104, []Event{evs[4]}},
		"no id":           {200, []Event{{Type: "mesh.a.x"}}},
	} {
		if _, err := s.AddHistory(ctx, c.next, c.batch...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := s.AddHistory(ctx, -1); err == nil {
		t.Error("a negative position was accepted")
	}
	if next, _, _ := s.HistoryNext(ctx); next != 106 {
		t.Errorf("a refused batch moved the position to %d", next)
	}
}

// TestAddHistoryIsContiguous: a history batch larger than MaxBatch, while
// other callers add, is stored in its order with no other row between its
// rows.
func TestAddHistoryIsContiguous(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"), Options{MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	stop := make(chan struct{})
	var wg, adding sync.WaitGroup
	adding.Add(4)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Add(ctx, event(100000+g*10000+i, "mesh.other.x")); err != nil {
					t.Error(err)
					if i == 0 {
						adding.Done()
					}
					return
				}
				if i == 0 {
					adding.Done() // its first row is in: the others' adds run beside the batch
				}
			}
		})
	}
	evs := history(50)
	for i := range evs {
		evs[i].ID = fmt.Sprintf("01JHIST%019d", 49-i) // ids out of order: the batch's order is not theirs
	}
	adding.Wait()
	if n, err := s.AddHistory(ctx, 150, evs...); err != nil || n != 50 {
		t.Fatalf("added %d, %v", n, err)
	}
	close(stop)
	wg.Wait()
	got, _, err := s.Query(ctx, Filter{Types: []string{"module.shop.#"}}, Page{})
	if err != nil || len(got) != 50 {
		t.Fatalf("history rows %d, %v", len(got), err)
	}
	for i, ev := range got {
		if ev.ID != evs[i].ID || ev.Seq != got[0].Seq+int64(i) {
			t.Fatalf("row %d: %s at seq %d; want %s at seq %d", i, ev.ID, ev.Seq, evs[i].ID, got[0].Seq+int64(i))
		}
	}
	if r := verify(t, s); r.Problem != nil {
		t.Errorf("problem %+v", *r.Problem)
	}
}

// oldSchema is the schema before the hash chain, as it was.
const oldSchema = `
CREATE TABLE IF NOT EXISTS events (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT NOT NULL UNIQUE,
	type         TEXT NOT NULL,
	source       TEXT NOT NULL DEFAULT '',
	node         TEXT NOT NULL DEFAULT '',
	causation_id TEXT NOT NULL DEFAULT '',
	schema_ver   TEXT NOT NULL DEFAULT '',
	time_ns      INTEGER NOT NULL DEFAULT 0,
	user_id      TEXT NOT NULL DEFAULT '',
	headers      TEXT NOT NULL DEFAULT '{}',
	body_json    TEXT,
	body_raw     BLOB,
	arrived_ns   INTEGER NOT NULL,
	redelivered  INTEGER NOT NULL DEFAULT 0,
	malformed    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_time ON events(time_ns);
CREATE INDEX IF NOT EXISTS events_source ON events(source);
CREATE INDEX IF NOT EXISTS events_causation ON events(causation_id);
CREATE TABLE IF NOT EXISTS fates (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	event_id   TEXT NOT NULL,
	kind       TEXT NOT NULL,
	queue      TEXT NOT NULL DEFAULT '',
	reason     TEXT NOT NULL DEFAULT '',
	error      TEXT NOT NULL DEFAULT '',
	attempts   INTEGER NOT NULL DEFAULT 0,
	replay_id  TEXT NOT NULL DEFAULT '',
	time_ns    INTEGER NOT NULL DEFAULT 0,
	UNIQUE (event_id, kind, queue, replay_id, time_ns)
);
`

// TestUpgrade: a database made before the chain opens with its rows
// unchained and readable; rows added after are chained; the log
// verifies, across a reopen and after retention takes the old rows.
func TestUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	edit(t, path, oldSchema)
	for i := 1; i <= 3; i++ {
		edit(t, path, fmt.Sprintf(`INSERT INTO events (id, type, headers, body_json, arrived_ns) VALUES ('%s', 'mesh.old.x', '{"x-tenant":"acme"}', '{"n":%d}', %d)`,
			id(i), i, t0.Add(time.Duration(i)*time.Second).UnixNano()))
	}
	s := reopen(t, path)
	ctx := context.Background()
	if r := verify(t, s); r.Problem != nil || r.Unchained != 3 || r.Rows != 0 || r.Head.Hash != hex.EncodeToString(Genesis()) {
		t.Fatalf("upgraded: %+v", r)
	}
	old, err := s.Get(ctx, id(2))
	if err != nil || old.Hash != "" || string(old.Body) != `{"n":2}` || old.Headers["x-tenant"] != "acme" {
		t.Fatalf("an old row: %+v, %v", old, err)
	}
	if _, err := s.HashOf(ctx, id(2)); !errors.Is(err, ErrUnchained) {
		t.Errorf("hash of an old row: %v", err)
	}
	for i := 4; i <= 5; i++ {
		ev := event(i, "mesh.new.x")
		ev.Arrived = t0.Add(time.Hour)
		if _, err := s.Add(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	r := verify(t, s)
	if r.Problem != nil || r.Unchained != 3 || r.Rows != 2 || r.Head.ID != id(5) {
		t.Fatalf("after adding: %+v", r)
	}
	if h, _ := s.Head(ctx); h != r.Head {
		t.Errorf("head %+v, verified %+v", h, r.Head)
	}
	s.Close()
	s = reopen(t, path)
	if again := verify(t, s); again.Problem != nil || again != r {
		t.Fatalf("after reopening: %+v, before %+v", again, r)
	}
	if n, err := s.Prune(ctx, Retention{Before: t0.Add(2500 * time.Millisecond)}); err != nil || n != 2 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if r := verify(t, s); r.Problem != nil || r.Unchained != 1 || r.Rows != 2 {
		t.Fatalf("after pruning old rows: %+v", r)
	}
	s.Close()
	// A row without a hash put after the old ones is not taken for one.
	edit(t, path, `INSERT INTO events (id, type, arrived_ns) VALUES ('forged', 'mesh.old.x', 1)`)
	if r := verify(t, reopen(t, path)); r.Problem == nil || r.Problem.Kind != ProblemInserted || r.Problem.ID != "forged" {
		t.Errorf("a forged unchained row: %+v", r)
	}
}

// TestEventJSONChain: the hash and the offset (0 included) travel in an
// event's JSON.
func TestEventJSONChain(t *testing.T) {
	ev := event(1, "mesh.x.y")
	zero := int64(0)
	ev.Hash, ev.Offset = "ab12", &zero
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"hash":"ab12"`) || !strings.Contains(string(b), `"offset":0`) {
		t.Errorf("JSON %s", b)
	}
	var back Event
	if err := json.Unmarshal(b, &back); err != nil || back.Hash != ev.Hash || back.Offset == nil || *back.Offset != 0 {
		t.Errorf("read back %+v, %v", back, err)
	}
	if b, _ := json.Marshal(event(1, "mesh.x.y")); strings.Contains(string(b), `"offset"`) || strings.Contains(string(b), `"hash"`) {
		t.Errorf("JSON of an event without them: %s", b)
	}
}

// BenchmarkChainHash is the cost of one link for a typical event.
func BenchmarkChainHash(b *testing.B) {
	ev := event(1, "module.umami.site.created")
	prev := Genesis()
	for b.Loop() {
		prev = ChainHash(prev, ev)
	}
}
