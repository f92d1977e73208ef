package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
)

// TestSeveralAuditLoggers: two audit loggers of different coverage (the
// second started after five events it never saw) serve audit.*. meshctl
// says which one answered and what it holds, --logger picks each and gets
// its own count, and a paged query stays with one logger from its first
// page to its last.
func TestSeveralAuditLoggers(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stores := map[string]*store.Store{}
	start := func(name string) {
		n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: -time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(context.Background()) })
		l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{CheckpointEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if _, err := n.Load(ctx, l.Module(), runtime.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
		stores[name] = l.Store()
	}
	waitCount := func(name string, want int64) {
		for {
			if n, _ := stores[name].Count(ctx, store.Filter{Types: []string{"mesh.order.#"}}); n == want {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the logger of %s never held %d orders", name, want)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	emitter, err := runtime.New(ctx, runtime.Config{Node: "web", AMQPURL: url, StateDir: t.TempDir(), Ephemeral: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer emitter.Close(context.Background())
	emit := func(n int) {
		for i := range n {
			if _, err := emitter.Emit(ctx, "web", "mesh.order.placed", map[string]int{"order": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	start("early")
	emit(5)
	waitCount("early", 5)
	start("late")
	emit(3)
	waitCount("early", 8)
	waitCount("late", 3)

	for name, want := range map[string]string{"early": `{"count":8}`, "late": `{"count":3}`} {
		out, err := runMeshctl(url, "audit", "count", "--type", "mesh.order.#", "--json", "--logger", name)
		if err != nil || !strings.Contains(out, want) || strings.Contains(out, "audit loggers serve") {
			t.Errorf("count --logger %s: %v\n%s", name, err, out)
		}
	}
	out, err := runMeshctl(url, "audit", "count", "--type", "mesh.order.#", "--json")
	if err != nil || !strings.Contains(out, "2 audit loggers serve audit.count; this is the answer of the one on node ") {
		t.Errorf("count without --logger: %v, want the warning\n%s", err, out)
	}
	// Which one answered, and the count is that one's.
	answered := "early"
	if strings.Contains(out, "node late, which holds 3 events") {
		answered = "late"
	} else if !strings.Contains(out, "node early, which holds 8 events") {
		t.Errorf("the warning does not say what the logger that answered holds:\n%s", out)
	}
	if want := map[string]string{"early": `{"count":8}`, "late": `{"count":3}`}[answered]; !strings.Contains(out, want) {
		t.Errorf("the count is not the answering logger's (%s, %s):\n%s", answered, want, out)
	}
	// Pages: every page from the logger of the first.
	for range 3 {
		out, err := runMeshctl(url, "audit", "query", "--type", "mesh.order.#", "--limit", "2", "--all", "--json")
		if err != nil {
			t.Fatalf("query --all: %v\n%s", err, out)
		}
		ids := 0
		for line := range strings.Lines(out) {
			var ev struct{ ID string }
			if json.Unmarshal([]byte(line), &ev) == nil && ev.ID != "" {
				ids++
			}
		}
		if ids != 8 && ids != 3 {
			t.Errorf("a paged query returned %d events, neither one logger's 8 nor the other's 3:\n%s", ids, out)
		}
	}
	if out, err := runMeshctl(url, "audit", "count", "--logger", "ghost", "--timeout", "20s"); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the audit logger of node ghost did not answer audit.count in %d calls", auditRetries)) {
		t.Errorf("count --logger ghost: %v\n%s", err, out)
	}
}
