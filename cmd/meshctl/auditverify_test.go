package main

import (
	"context"
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
	run := func(args ...string) (string, int) {
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
	out, code := run("audit", "verify")
	if code != 0 || !strings.Contains(out, "every row verifies") || !strings.Contains(out, auditlogger.VerdictOK) {
		t.Fatalf("verify of an untouched log: exit %d\n%s", code, out)
	}
	out, code = run("audit", "verify", "--json")
	var rep auditlogger.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Problem != "" || rep.Store.Rows < 6 || len(rep.Checkpoints) != 1 {
		t.Fatalf("verify --json: exit %d, %v\n%s", code, err, out)
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
