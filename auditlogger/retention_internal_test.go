package auditlogger

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/sdk"
)

// TestPruneByAge: the logger drops what arrived longer ago than MaxAge,
// and keeps the rest; without bounds it drops nothing.
func TestPruneByAge(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l, err := Open(filepath.Join(t.TempDir(), "audit.db"), Options{MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.now = func() time.Time { return now }
	ctx := context.Background()
	for i, id := range []string{"01JOLD0000000000000000000A", "01JNEW0000000000000000000B"} {
		if err := l.record(ctx, sdk.Event{ID: id, Type: "mesh.x.y", Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			now = now.Add(90 * time.Minute)
		}
	}
	if n, err := l.Prune(ctx); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want the one that arrived 90 minutes ago", n, err)
	}
	if _, err := l.Store().Get(ctx, "01JNEW0000000000000000000B"); err != nil {
		t.Errorf("the recent event is gone: %v", err)
	}
	keepAll, err := Open(filepath.Join(t.TempDir(), "all.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer keepAll.Close()
	if err := keepAll.record(ctx, sdk.Event{ID: "01JOLD0000000000000000000A", Type: "mesh.x.y"}); err != nil {
		t.Fatal(err)
	}
	keepAll.now = func() time.Time { return now.Add(1000 * time.Hour) }
	if n, err := keepAll.Prune(ctx); n != 0 || err != nil {
		t.Errorf("no retention pruned %d, %v", n, err)
	}
	if n, _ := keepAll.Store().Count(ctx, store.Filter{}); n != 1 {
		t.Errorf("%d events kept, want 1", n)
	}
}
