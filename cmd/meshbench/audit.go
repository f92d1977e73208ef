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
// must never be the mesh's bottleneck.
func benchAudit(url string, o options) error {
	fmt.Printf("\n== audit ingest: %d events a round stored by the audit logger, beside the event path ==\n", o.events)
	var path, audit []float64
	for r := 0; r < o.rounds; r++ {
		pt, err := countThroughput(url, o, "")
		if err != nil {
			return fmt.Errorf("event path: %w", err)
		}
		at, err := auditThroughput(url, o)
		if err != nil {
			return fmt.Errorf("audit logger: %w", err)
		}
		fmt.Printf("round %d  event path %8.0f events/s   audit ingest %8.0f events/s\n", r+1, pt, at)
		path, audit = append(path, pt), append(audit, at)
	}
	fmt.Printf("audit ingest %.0f events/s, event path %.0f: audit / event path %.2f (target >= 1.00)\n",
		median(audit), median(path), median(audit)/median(path))
	return nil
}

// auditThroughput runs the audit logger in-process (prefetch and concurrency 256) on a
// node, emits o.events from o.publishers goroutines, and returns the
// events stored per second, until the store holds them all.
func auditThroughput(url string, o options) (float64, error) {
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
	m, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{Prefetch: 256, Concurrency: 256})
	if err != nil {
		l.Close()
		return 0, err
	}
	defer func() {
		_ = m.Stop(context.Background())
		l.Close()
		_ = deleteQueue(url, "bench."+auditlogger.Name+".events")
	}()
	start := time.Now()
	if err := emitAll(ctx, node, o, "mesh.bench.audited"); err != nil {
		return 0, err
	}
	mine := store.Filter{Types: []string{"mesh.bench.audited"}}
	for {
		n, err := l.Store().Count(ctx, mine)
		if err != nil {
			return 0, err
		}
		if n >= int64(o.events) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the audit logger stored %d of %d events in time", n, o.events)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return float64(o.events) / time.Since(start).Seconds(), nil
}
