package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"

	_ "modernc.org/sqlite" // to edit the file directly, as an attacker would
)

// TestAuditVerify: `meshctl audit verify` asks the logger, which finds its
// record untouched (exit 0) and holds its own signed checkpoint; with the
// logger stopped and a row deleted from its file, `verify --db` names the
// row after the gap and exits 1.
func TestAuditVerify(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	db := filepath.Join(t.TempDir(), "audit.db")
	l, err := auditlogger.Open(db, auditlogger.Options{CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	logger, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 5 {
		id, err := node.Emit(ctx, "web", "mesh.order.placed", map[string]int{"order": i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitRows := func(n int64, types ...string) {
		t.Helper()
		for {
			if got, _ := l.Store().Count(ctx, store.Filter{Types: types}); got == n {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the audit logger never stored %d events of %v", n, types)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	waitRows(5, "mesh.order.#")
	if cp, err := l.Checkpoint(ctx, logger.Mesh()); err != nil || cp == nil {
		t.Fatalf("checkpoint: %v, %v", cp, err)
	}
	waitRows(1, auditlogger.CheckpointType)
	run := func(args ...string) (string, int) { return runExit(ctx, t, bin, url, args...) }
	out, code := run("audit", "verify")
	if code != 0 || !strings.Contains(out, "every row verifies") || !strings.Contains(out, auditlogger.VerdictOK) {
		t.Fatalf("verify of an untouched log: exit %d\n%s", code, out)
	}
	out, code = run("audit", "verify", "--json")
	var rep auditlogger.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Problem != "" || rep.Store.Rows < 6 || len(rep.Checkpoints) != 1 {
		t.Fatalf("verify --json: exit %d, %v\n%s", code, err, out)
	}

	// Forged checkpoints, published as the logger by a node allowed the
	// type: one with a garbage signature, one well signed by a key of the
	// forger's own that says the chain differs. Neither counts: verify
	// still passes, and lists them.
	_, forger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	garbage := rep.Checkpoints[0].Checkpoint
	garbage.Signature = []byte("garbage")
	lie := auditlogger.Checkpoint{Chain: rep.Chain, HeadID: ids[0], Head: strings.Repeat("0", 64), Rows: 1, Time: time.Now().UTC(),
		PublicKey: forger.Public().(ed25519.PublicKey), KeyID: auditlogger.KeyIDOf(forger.Public().(ed25519.PublicKey))}
	lie.Signature = ed25519.Sign(forger, mustJSON(t, lie))
	for _, cp := range []auditlogger.Checkpoint{garbage, lie} {
		if _, err := node.Emit(ctx, auditlogger.Name, auditlogger.CheckpointType, cp); err != nil {
			t.Fatal(err)
		}
	}
	waitRows(3, auditlogger.CheckpointType)
	out, code = run("audit", "verify")
	if code != 0 || !strings.Contains(out, "2 checkpoints do not count") || !strings.Contains(out, auditlogger.VerdictBadSignature) || !strings.Contains(out, auditlogger.VerdictDiffers) {
		t.Fatalf("verify with two forged checkpoints held: exit %d, want 0 listing them\n%s", code, out)
	}
	// Pinning the forger's key makes its checkpoint count: the auditor's
	// choice, not the forger's.
	if out, code = run("audit", "verify", "--key", lie.KeyID); code != 1 || !strings.Contains(out, auditlogger.VerdictDiffers) {
		t.Fatalf("verify pinning the forger's key: exit %d, want 1\n%s", code, out)
	}
	if err := logger.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	l.Close()

	raw, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`DELETE FROM events WHERE id = ?`, ids[2]); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	out, code = run("audit", "verify", "--db", db)
	if code != 1 || !strings.Contains(out, "FIRST PROBLEM") || !strings.Contains(out, ids[3]) || !strings.Contains(out, store.ProblemDeleted) {
		t.Fatalf("verify --db of a log with a row deleted: exit %d\n%s", code, out)
	}
}

// TestAuditVerifyAgainstTheHistory: `verify --history` compares a logger's
// index of the mesh's history with the stream it was built from: every
// event once (a resend counted as one), a malformed message included,
// exit 0; with a stored body edited in the file, `verify --db --history`
// names the row that is not what the stream holds, and exits 1.
func TestAuditVerifyAgainstTheHistory(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), History: runtime.HistoryConfig{Stream: "mesh.history"}})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	db := filepath.Join(t.TempDir(), "audit.db")
	l, err := auditlogger.Open(db, auditlogger.Options{History: true, CheckpointEvery: -1, KeyFile: "-"})
	if err != nil {
		t.Fatal(err)
	}
	logger, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 20 {
		id, err := node.Emit(ctx, "web", "mesh.order.placed", map[string]int{"order": i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	resend := amqp.Publishing{Headers: amqp.Table{"x-event-id": ids[0] + "X", "x-source": "legacy", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
		ContentType: "application/json", Body: []byte(`{}`)}
	for range 2 {
		if err := raw.PublishWithContext(ctx, "mesh.events", "mesh.raw.tick", false, false, resend); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.PublishWithContext(ctx, "mesh.events", "mesh.raw.bad", false, false, amqp.Publishing{Body: []byte("not json")}); err != nil {
		t.Fatal(err)
	}
	for {
		n, _ := l.Store().Count(ctx, store.Filter{Types: []string{"mesh.#"}})
		if n == 22 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the logger holds %d of 22 events", n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	run := func(args ...string) (string, int) { return runExit(ctx, t, bin, url, args...) }
	out, code := run("audit", "verify", "--history", "--stream", "mesh.history", "--json")
	var rep struct {
		auditlogger.Report
		Stream struct{ Read, Compared, Resends, Missing, Differ int64 }
	}
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Stream.Compared < 22 || rep.Stream.Resends != 1 ||
		rep.Stream.Missing != 0 || rep.Stream.Differ != 0 {
		t.Fatalf("verify --history of an index built from the stream: exit %d, %v\n%s", code, err, out)
	}
	if err := logger.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	l.Close()
	sqldb, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqldb.Exec(`UPDATE events SET body_json = '{"order":999}' WHERE id = ?`, ids[7]); err != nil {
		t.Fatal(err)
	}
	sqldb.Close()
	out, code = run("audit", "verify", "--db", db, "--history", "--stream", "mesh.history")
	if code != 1 || !strings.Contains(out, "FIRST DIFFERENCE FROM THE STREAM") || !strings.Contains(out, ids[7]) || !strings.Contains(out, "1 differ") {
		t.Fatalf("verify --db --history with a body edited: exit %d\n%s", code, out)
	}
	if out, code := run("audit", "verify", "--stream", "mesh.history"); code != 2 {
		t.Fatalf("--stream without --history: exit %d\n%s", code, out)
	}
}

// runExit runs the meshctl binary bin against url and returns what it
// printed and its exit status.
func runExit(ctx context.Context, t *testing.T, bin, url string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// mustJSON is what a checkpoint's signature covers: its JSON without the
// signature.
func mustJSON(t *testing.T, cp auditlogger.Checkpoint) []byte {
	t.Helper()
	cp.Signature = nil
	b, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
