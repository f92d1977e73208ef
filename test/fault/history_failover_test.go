//go:build failover

package fault

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/clustertest"
	"github.com/meshkit/mesh/runtime"
)

// TestHistoryThroughStreamLeaderKilled: with the mesh's history on a
// stream replicated over the three brokers, the broker node that leads
// the stream is SIGKILLed while events stream and an audit logger indexes
// the history; the stream elects another leader, the logger reads on from
// its offset, and it ends with every confirmed event once, its chain
// verifying (lost 0).
func TestHistoryThroughStreamLeaderKilled(t *testing.T) {
	cm := newClusterMesh(t)
	restoreCluster(t)
	n := newNode(t, cm.urls[0], "failover", func(c *runtime.Config) {
		c.AMQPURLs = cm.urls[1:]
		c.History = runtime.HistoryConfig{Stream: "mesh.history", Replicas: clustertest.Size, SegmentBytes: 1 << 20}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{History: true, KeyFile: "-", CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	logger, err := n.Load(ctx, l.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Stop(context.Background())
	sink, err := n.Load(ctx, sinkModule(newIDSet()), runtime.ModuleConfig{Prefetch: 64, Concurrency: 4, MaxAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	ticks := store.Filter{Types: []string{"module.sink.tick"}}
	indexed := func() int64 {
		n, err := l.Store().Count(ctx, ticks)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	s := startStream(t, sink.Mesh(), 4)
	if !waitFor(time.Minute, func() bool { return indexed() > 200 }) {
		t.Fatalf("before the fault: %d indexed", indexed())
	}
	leader := cm.leaderOf(t, "mesh.history")
	t.Logf("killing %s, the stream's leader", cluster.NodeName(leader))
	killNode(t, leader)
	before := indexed()
	if !waitFor(2*time.Minute, func() bool { return indexed() > before+200 }) {
		t.Errorf("after the fault: %d more indexed", indexed()-before)
	}
	s.end()
	want := int64(s.confirmed.len())
	if !waitFor(2*time.Minute, func() bool { return indexed() >= want }) {
		t.Errorf("indexed %d of %d confirmed events within 2 min", indexed(), want)
	}
	// Every confirmed id is a row (a row is one per id by the store's
	// own key; a count of ids found says none is missing).
	s.confirmed.mu.Lock()
	ids := slices.Collect(maps.Keys(s.confirmed.ids))
	s.confirmed.mu.Unlock()
	var found int64
	for start := 0; start < len(ids); start += 500 {
		n, err := l.Store().Count(ctx, store.Filter{IDs: ids[start:min(start+500, len(ids))]})
		if err != nil {
			t.Fatal(err)
		}
		found += n
	}
	rep, err := l.Verify(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Problem != "" {
		t.Errorf("the index does not verify after the failover: %s", rep.Problem)
	}
	summary{emitted: int(s.attempts.Load()), confirmed: int(want), handled: int(found), lost: int(want - found),
		extra: fmt.Sprintf("indexed from the history; rows=%d", rep.Store.Rows)}.report(t)
}
