package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAudit runs `meshctl audit` against an audit logger on a node:
// query (table, --json, pages), count, get, trace (drawn) and stats.
func TestAudit(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	logger, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{Concurrency: 8, Prefetch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Stop(context.Background())
	shop, err := node.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"order.accepted"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.order.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "order.accepted", map[string]string{"tier": "gold"})
			return err
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Stop(context.Background())
	order, err := node.Emit(ctx, "web", "mesh.order.placed", map[string]int{"order": 7})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if n, _ := l.Store().Count(ctx, store.Filter{Types: []string{"mesh.order.#", "module.shop.#"}}); n == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the audit logger never stored the order and its consequence")
		case <-time.After(20 * time.Millisecond):
		}
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("meshctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	trace := run("audit", "trace", order)
	lines := strings.Split(strings.TrimSpace(trace), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], order) || !strings.Contains(lines[0], "mesh.order.placed") ||
		!strings.HasPrefix(lines[1], "└─ ") || !strings.Contains(lines[1], "module.shop.order.accepted  shop@anchor") {
		t.Errorf("trace:\n%s", trace)
	}
	table := run("audit", "query", "--type", "mesh.order.#")
	if !strings.Contains(table, "SEQ") || !strings.Contains(table, order) || strings.Contains(table, "module.shop") {
		t.Errorf("query table:\n%s", table)
	}
	var ev store.Event
	out := run("audit", "query", "--json", "--type", "module.shop.#", "--body", `tier="gold"`, "--causation", order)
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Type != "module.shop.order.accepted" || ev.UserID != "guest" {
		t.Errorf("query --json: %s (%v)", out, err)
	}
	if got := strings.TrimSpace(run("audit", "count", "--type", "mesh.order.#", "--type", "module.shop.#")); got != "2" {
		t.Errorf("count %q, want 2", got)
	}
	if got := run("audit", "get", order); !strings.Contains(got, `"order":7`) {
		t.Errorf("get: %s", got)
	}
	paged := run("audit", "query", "--limit", "1", "--type", "mesh.order.#", "--type", "module.shop.#")
	if !strings.Contains(paged, "more: --after ") {
		t.Errorf("a first page of 1 does not say where the next starts:\n%s", paged)
	}
	lines = strings.Split(strings.TrimSpace(run("audit", "export", "--type", "mesh.order.#", "--type", "module.shop.#")), "\n")
	exported := map[string]store.Event{} // in order of arrival, which concurrent handlers may swap
	for _, line := range lines {
		var ev store.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("export jsonl line %q: %v", line, err)
		}
		exported[ev.ID] = ev
	}
	if len(lines) != 2 || string(exported[order].Body) != `{"order":7}` {
		t.Errorf("export jsonl:\n%s", strings.Join(lines, "\n"))
	}
	csvFile := filepath.Join(t.TempDir(), "audit.csv")
	run("audit", "export", "--format", "csv", "--out", csvFile, "--id", order)
	rows, err := csv.NewReader(mustOpen(t, csvFile)).ReadAll()
	if err != nil || len(rows) != 2 || rows[0][1] != "id" || rows[1][1] != order || rows[1][13] != `{"order":7}` || !strings.Contains(rows[1][12], `"x-source":"web"`) {
		t.Errorf("export csv: %v, %v", rows, err)
	}
	var st store.Stats
	if err := json.Unmarshal([]byte(run("audit", "stats", "--json")), &st); err != nil || st.Events < 2 {
		t.Errorf("stats %+v, %v", st, err)
	}
	if out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "audit", "query", "--from", "yesterday").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--from") {
		t.Errorf("a bad --from: %v\n%s", err, out)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
