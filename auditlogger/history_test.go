package auditlogger_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"

	_ "modernc.org/sqlite" // the driver, to edit the file directly
)

// historyNode is a node of a mesh that keeps its history on a stream,
// with membership off (no heartbeats: the test's events are the mesh's).
func historyNode(t *testing.T, ctx context.Context, url, name string) *runtime.Node {
	t.Helper()
	n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: -1,
		RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		History: runtime.HistoryConfig{Stream: "mesh.history", SegmentBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	return n
}

// poll waits until cond holds, or fails the test after limit. cond reads
// what a logger stored (in another process, for a module process): there
// is no signal to wait on but the state itself, looked at again on each
// tick.
func poll(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("after %v: %s", limit, what)
		case <-tick.C:
		}
	}
}

// hashOf is the chain hash of the row id in the database at path.
func hashOf(t *testing.T, path, id string) string {
	t.Helper()
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h, err := s.HashOf(context.Background(), id)
	if err != nil {
		t.Fatalf("%s in %s: %v", id, path, err)
	}
	return h
}

// TestHistoryLoggersConvergeAndCheckEachOther: a logger reading the
// history as a module process, SIGKILLed mid-stream, resumes from its
// stored offset with exactly one row per id (a resend included) and a
// chain that verifies (no torn write); a second logger on another node
// started from nothing converges to the same rows and the same chain; it
// holds the first one's signed checkpoints and verifies them against its
// own rows; with the first one down, it answers the audit tools; and
// rebuilt from the stream after its database is moved aside, it has the
// same chain again.
func TestHistoryLoggersConvergeAndCheckEachOther(t *testing.T) {
	t.Parallel()
	bin, err := buildLogger()
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	anchor := historyNode(t, ctx, url, "anchor")
	dbA := filepath.Join(t.TempDir(), "audit.db")
	pm, err := anchor.LoadPlugin(ctx, bin, []string{"--db", dbA, "--history", "--checkpoint-every", "100ms"},
		runtime.ModuleConfig{Concurrency: 8, ToolGrants: []string{"audit.*"}})
	if err != nil {
		t.Fatal(err)
	}
	raw := brokertest.Channel(t, url)
	mine := store.Filter{Types: []string{"mesh.emitted.#", "mesh.raw.#"}}
	count := func() int64 {
		var n int64
		if err := anchor.Call(ctx, "meshctl", auditlogger.ToolCount, mine, &n); err != nil {
			return -1 // restarting
		}
		return n
	}
	const events = 400
	var last string
	for i := range events {
		id, err := anchor.Emit(ctx, "test", "mesh.emitted.tick", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		last = id
		if i == 100 {
			// A resend of an id already in the history: not a second row.
			dup := ulid.Make().String()
			for range 2 {
				if err := raw.PublishWithContext(ctx, "mesh.events", "mesh.raw.tick", false, false, amqp.Publishing{
					Headers:     amqp.Table{"x-event-id": dup, "x-source": "legacy", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
					ContentType: "application/json", DeliveryMode: amqp.Persistent, UserId: "guest", Body: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if i == events/2 {
			poll(t, 30*time.Second, "the logger stored nothing", func() bool { return count() >= 50 })
			if err := syscall.Kill(pm.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := int64(events + 1)
	poll(t, 60*time.Second, "the first logger did not store every event once", func() bool {
		n := count()
		if n > want {
			t.Fatalf("%d rows for %d events: one stored twice", n, want)
		}
		return n == want
	})
	// The first logger signs a checkpoint after the last event.
	poll(t, 30*time.Second, "no checkpoint of the first logger after the last event", func() bool {
		var rep auditlogger.Report
		if err := anchor.Call(ctx, "meshctl", auditlogger.ToolVerify, auditlogger.VerifyRequest{}, &rep); err != nil {
			return false
		}
		if rep.Problem != "" {
			t.Fatalf("the first logger's own record does not verify: %s", rep.Problem)
		}
		return len(rep.Checkpoints) > 0 && rep.Checkpoints[len(rep.Checkpoints)-1].Rows > want
	})

	// A second logger, in-process on another node, from nothing.
	beta := historyNode(t, ctx, url, "beta")
	dbB := filepath.Join(t.TempDir(), "audit.db")
	loadB := func() (*auditlogger.Logger, *runtime.Module) {
		l, err := auditlogger.Open(dbB, auditlogger.Options{History: true, CheckpointEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		m, err := beta.Load(ctx, l.Module(), runtime.ModuleConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return l, m
	}
	lB, mB := loadB()
	poll(t, 60*time.Second, "the second logger did not catch up", func() bool {
		_, err := lB.Store().HashOf(ctx, last)
		return err == nil
	})
	n, err := lB.Store().Count(ctx, mine)
	if err != nil || n != want {
		t.Fatalf("the second logger holds %d of the test's events (%v), want %d", n, err, want)
	}
	// It holds the first one's checkpoints, and they verify against its
	// rows: one chain.
	poll(t, 30*time.Second, "the second logger holds no checkpoint past the last event", func() bool {
		rep, err := lB.Verify(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Problem != "" {
			t.Fatalf("the second logger's record does not verify: %s", rep.Problem)
		}
		ok := 0
		for _, c := range rep.Checkpoints {
			if c.Verdict == auditlogger.VerdictOK && c.Rows > want {
				ok++
			}
		}
		return ok > 0
	})
	// The first logger down: the second answers the audit tools, with
	// the same history.
	if err := pm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != want {
		t.Fatalf("with the first logger down, audit.count answered %d, want %d from the second", got, want)
	}
	if err := mB.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	lB.Close()
	headA, headB := hashOf(t, dbA, last), hashOf(t, dbB, last)
	if headA != headB {
		t.Fatalf("the chains differ at the last event: %s and %s", headA, headB)
	}

	// Rebuilt from the stream: the same chain.
	if err := auditlogger.MoveAside(dbB, time.Now()); err != nil {
		t.Fatal(err)
	}
	lB, mB = loadB()
	defer lB.Close()
	defer mB.Stop(context.Background())
	poll(t, 60*time.Second, "the rebuilt logger did not catch up", func() bool {
		_, err := lB.Store().HashOf(ctx, last)
		return err == nil
	})
	if h, _ := lB.Store().HashOf(ctx, last); h != headA {
		t.Fatalf("rebuilt, the chain at the last event is %s, want %s", h, headA)
	}
	t.Logf("summary TestHistoryLoggersConvergeAndCheckEachOther: events=%d rows=%d head=%s lost=0", events+1, want, headA[:16])
}

// TestRecomputedChainIsCaughtByACheckpoint: someone who edits a stored
// body and recomputes every hash after it leaves a chain that verifies;
// the checkpoint the logger signed before names the change.
func TestRecomputedChainIsCaughtByACheckpoint(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node := historyNode(t, ctx, url, "anchor")
	db := filepath.Join(t.TempDir(), "audit.db")
	l, err := auditlogger.Open(db, auditlogger.Options{History: true, CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var first, last string
	for i := range 20 {
		id, err := node.Emit(ctx, "test", "mesh.emitted.tick", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = id
		}
		last = id
	}
	poll(t, 30*time.Second, "the logger did not store the events", func() bool {
		_, err := l.Store().HashOf(ctx, last)
		return err == nil
	})
	cp, err := l.Checkpoint(ctx, m.Mesh())
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v, %v", cp, err)
	}
	poll(t, 30*time.Second, "the logger did not store its checkpoint", func() bool {
		n, err := l.Store().Count(ctx, store.Filter{Types: []string{auditlogger.CheckpointType}})
		return err == nil && n == 1
	})
	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	l.Close()

	// Edit the first event's body and recompute the chain from there, as
	// someone with write access to the file could.
	sqldb, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqldb.Exec(`UPDATE events SET body_json = '{"i":999}' WHERE id = ?`, first); err != nil {
		t.Fatal(err)
	}
	sqldb.Close()
	rehash(t, db)

	s, err := store.Open(db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	own, err := auditlogger.PublicKeyOf(db + ".key")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := auditlogger.VerifyStore(ctx, s, auditlogger.HistoryChain, nil, own)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Store.Problem != nil {
		t.Fatalf("the recomputed chain does not verify by itself (%+v): the test edits too little", rep.Store.Problem)
	}
	if len(rep.Checkpoints) != 1 || rep.Checkpoints[0].Verdict != auditlogger.VerdictDiffers || rep.Problem == "" {
		t.Fatalf("the checkpoint did not catch the recomputed chain: %+v", rep)
	}
	// Trusting another key only, the checkpoint does not count.
	rep, err = auditlogger.VerifyStore(ctx, s, auditlogger.HistoryChain, []string{"0000000000000000"}, own)
	if err != nil || rep.Checkpoints[0].Verdict != auditlogger.VerdictUntrusted {
		t.Fatalf("a checkpoint of an untrusted key: %+v, %v", rep, err)
	}
}

// rehash recomputes every row's prev and hash in seq order, as someone
// with write access to the file could (store.ChainHash is public).
func rehash(t *testing.T, path string) {
	t.Helper()
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var rows []store.Event
	for after := int64(0); ; {
		page, next, err := s.Query(context.Background(), store.Filter{}, store.Page{After: after})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, page...)
		if next == 0 {
			break
		}
		after = next
	}
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	prev := make([]byte, 32)
	for _, r := range rows {
		h := store.ChainHash(prev, r)
		if _, err := db.Exec(`UPDATE events SET prev = ?, hash = ? WHERE seq = ?`, prev, h, r.Seq); err != nil {
			t.Fatal(err)
		}
		prev = h
	}
}

// TestHistoryLoggerWithItsDiskWiped: the logger's database is deleted
// under it and its module process SIGKILLed; started again empty, it says
// so (History.From: the start), meshd rewinds, and it builds its index
// from the stream again: every event once, and the same chain as before.
func TestHistoryLoggerWithItsDiskWiped(t *testing.T) {
	t.Parallel()
	bin, err := buildLogger()
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	anchor := historyNode(t, ctx, url, "anchor")
	db := filepath.Join(t.TempDir(), "audit.db")
	pm, err := anchor.LoadPlugin(ctx, bin, []string{"--db", db, "--history", "--checkpoint-every", "-1s", "--key", "-"},
		runtime.ModuleConfig{Concurrency: 8, ToolGrants: []string{"audit.*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Stop(context.Background())
	mine := store.Filter{Types: []string{"mesh.emitted.#"}}
	count := func() int64 {
		var n int64
		if err := anchor.Call(ctx, "meshctl", auditlogger.ToolCount, mine, &n); err != nil {
			return -1 // restarting
		}
		return n
	}
	var last string
	for i := range 200 {
		if last, err = anchor.Emit(ctx, "test", "mesh.emitted.tick", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 60*time.Second, "the logger did not store every event", func() bool { return count() == 200 })
	var before store.Event
	if err := anchor.Call(ctx, "meshctl", auditlogger.ToolGet, last, &before); err != nil || before.Hash == "" {
		t.Fatalf("the last event's row: %+v, %v", before, err)
	}
	for _, ext := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(db + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(pm.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, "the logger started empty did not build its index again", func() bool {
		var after store.Event
		return anchor.Call(ctx, "meshctl", auditlogger.ToolGet, last, &after) == nil && after.Hash != ""
	})
	if n := count(); n != 200 {
		t.Fatalf("after the wipe, %d rows of 200 events", n)
	}
	var after store.Event
	if err := anchor.Call(ctx, "meshctl", auditlogger.ToolGet, last, &after); err != nil || after.Hash != before.Hash {
		t.Fatalf("the chain at the last event was %s, is %s (%v)", before.Hash, after.Hash, err)
	}
	var rep auditlogger.Report
	if err := anchor.Call(ctx, "meshctl", auditlogger.ToolVerify, auditlogger.VerifyRequest{}, &rep); err != nil || rep.Problem != "" {
		t.Fatalf("the rebuilt index does not verify: %+v, %v", rep, err)
	}
}
