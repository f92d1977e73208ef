package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/runtime"
)

// benchAudit measures the audit logger's ingest (every event stored,
// durably, before its ack) beside the event path's throughput (the same
// events handled by a module in-process), in the same run: the logger
// must never be the mesh's bottleneck. Two figures:
//
//   - live: the logger stores events while they are emitted, the emitters,
//     the broker and the logger sharing the machine, as the event path's
//     emitters and module do;
//   - drain: the logger stores events already waiting in its queue: how
//     fast it consumes, which is what keeps its queue from growing.
func benchAudit(url string, o options) error {
	fmt.Printf("\n== audit ingest: %d events a round stored by the audit logger, beside the event path ==\n", o.events)
	var path, live, drain []float64
	for r := 0; r < o.rounds; r++ {
		c, err := countOnce(url, runtime.QueueQuorum, o, "")
		if err != nil {
			return fmt.Errorf("event path: %w", err)
		}
		pt := c.rate
		lt, err := auditThroughput(url, o, false)
		if err != nil {
			return fmt.Errorf("audit logger: %w", err)
		}
		dt, err := auditThroughput(url, o, true)
		if err != nil {
			return fmt.Errorf("audit logger: %w", err)
		}
		fmt.Printf("round %d  event path %8.0f events/s   audit ingest live %8.0f events/s   drain %8.0f events/s\n", r+1, pt, lt, dt)
		path, live, drain = append(path, pt), append(live, lt), append(drain, dt)
	}
	record("audit ingest (drain) / event path", pairedRatio(drain, path), 1.0, true, "")
	record("audit ingest (live) / event path", pairedRatio(live, path), 1.0, true, "")
	fmt.Printf("audit ingest live %.0f events/s (%.2f of the event path), drain %.0f events/s (%.2f); event path %.0f events/s (target: drain >= 1.00)\n",
		median(live), median(live)/median(path), median(drain), median(drain)/median(path), median(path))
	return nil
}

// auditThroughput runs the audit logger in-process (prefetch and
// concurrency 256) on a node, emits o.events from o.publishers goroutines,
// and returns the events stored per second, until the store holds them
// all. With drain, the events are emitted while the logger is stopped (its
// queue keeps them) and timed from when it starts again.
func auditThroughput(url string, o options, drain bool) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, state, closeNode, err := benchNode(ctx, url)
	if err != nil {
		return 0, err
	}
	defer closeNode()
	l, err := auditlogger.Open(filepath.Join(state, "audit.db"), auditlogger.Options{})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	defer func() {
		_ = deleteQueue(url, "bench."+auditlogger.Name+".events")
		_ = deleteQueue(url, "bench."+auditlogger.Name+".dead")
	}()
	mc := runtime.ModuleConfig{Prefetch: 256, Concurrency: 256}
	m, err := node.Load(ctx, l.Module(), mc)
	if err != nil {
		return 0, err
	}
	defer func() { _ = m.Stop(context.Background()) }()
	start := time.Now()
	if drain {
		if err := m.Stop(ctx); err != nil { // its queue, bound to #, keeps what comes
			return 0, err
		}
		if err := emitAll(ctx, node, o, "mesh.bench.audited"); err != nil {
			return 0, err
		}
		start = time.Now()
		if m, err = node.Load(ctx, l.Module(), mc); err != nil {
			return 0, err
		}
	} else if err := emitAll(ctx, node, o, "mesh.bench.audited"); err != nil {
		return 0, err
	}
	for {
		// The store is new and the node emits nothing else: the rows are
		// the bench's, numbered from 1, so the last one's is there when
		// all are. Asking for it costs a lookup, not a count.
		last, _, err := l.Store().Query(ctx, store.Filter{}, store.Page{After: int64(o.events) - 1, Limit: 1})
		if err != nil {
			return 0, err
		}
		if len(last) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the audit logger did not store %d events in time", o.events)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return float64(o.events) / time.Since(start).Seconds(), nil
}
