package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/runtime"
)

// benchHistory measures the audit logger on the mesh's history (a stream,
// ADR 35) beside the event path and beside the logger on a queue of its
// own, in the same rounds:
//
//   - history live: a logger reads the stream while the events are
//     emitted, as the queue's "live" figure does;
//   - catch-up: a second logger, started empty once the stream holds the
//     round's events, builds its index from the stream's start: how fast
//     a new or rebuilt logger comes level; in-process, and as a module
//     process (auditlogger/cmd/audit-logger --history, as meshd runs it).
func benchHistory(url string, o options) error {
	bin, remove, err := buildBinary("./auditlogger/cmd/audit-logger")
	if err != nil {
		return err
	}
	defer remove()
	fmt.Printf("\n== audit on the history: %d events a round indexed from a stream, beside the event path and the logger's own queue ==\n", o.events)
	var path, queue, live, catchUp, catchUpProc []float64
	for r := 0; r < o.rounds; r++ {
		c, err := countOnce(url, runtime.QueueQuorum, o, "")
		if err != nil {
			return fmt.Errorf("event path: %w", err)
		}
		pt := c.rate
		qt, err := auditThroughput(url, o, false)
		if err != nil {
			return fmt.Errorf("audit logger on its queue: %w", err)
		}
		lt, ct, cp, err := historyThroughput(url, o, r, bin)
		if err != nil {
			return fmt.Errorf("audit logger on the history: %w", err)
		}
		fmt.Printf("round %d  event path %8.0f events/s   queue live %8.0f   history live %8.0f   catch-up %8.0f   (module process %8.0f) events/s\n",
			r+1, pt, qt, lt, ct, cp)
		path, queue, live = append(path, pt), append(queue, qt), append(live, lt)
		catchUp, catchUpProc = append(catchUp, ct), append(catchUpProc, cp)
	}
	record("audit on the history (live) / event path", pairedRatio(live, path), 1.0, true, "")
	record("audit catch-up from the history / event path", pairedRatio(catchUp, path), 1.0, true, "")
	record("audit catch-up, module process / event path", pairedRatio(catchUpProc, path), 1.0, true, "")
	fmt.Printf("history live %.0f events/s (%.2f of the event path; on its queue %.0f, %.2f), catch-up %.0f events/s (%.2f), as a module process %.0f (%.2f); event path %.0f events/s (target: each >= 1.00)\n",
		median(live), median(live)/median(path), median(queue), median(queue)/median(path), median(catchUp), median(catchUp)/median(path),
		median(catchUpProc), median(catchUpProc)/median(path), median(path))
	return nil
}

// historyThroughput runs a node that keeps the history on a stream of its
// own for the round, an audit logger in-process reading it, emits o.events
// from o.meshPublishers goroutines, and returns the events indexed per
// second live, then the rate at which a second logger started empty
// indexes the same events from the stream's start, in-process and as the
// module process bin.
func historyThroughput(url string, o options, round int, bin string) (live, catchUp, catchUpProc float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream := fmt.Sprintf("bench.history.%d.%d", os.Getpid(), round)
	defer func() { _ = deleteQueue(url, stream) }()
	state, err := os.MkdirTemp("", "meshbench-history-")
	if err != nil {
		return 0, 0, 0, err
	}
	defer os.RemoveAll(state)
	node, err := runtime.New(ctx, runtime.Config{Node: "bench", AMQPURL: url, StateDir: state, HeartbeatInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), History: runtime.HistoryConfig{Stream: stream}})
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = node.Close(context.Background()) }()
	mine := store.Filter{Types: []string{"mesh.bench.audited"}}
	// waitIndexed waits until count says the logger holds every event,
	// and returns the rate since start.
	waitIndexed := func(start time.Time, count func() (int64, error)) (float64, error) {
		for {
			n, err := count()
			if err != nil {
				return 0, err
			}
			if n >= int64(o.events) {
				return float64(o.events) / time.Since(start).Seconds(), nil
			}
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("the audit logger indexed %d of %d events in time", n, o.events)
			case <-time.After(50 * time.Millisecond): // a count reads every row: not too often
			}
		}
	}
	index := func(name string, work func() error) (float64, error) {
		l, err := auditlogger.Open(filepath.Join(state, name), auditlogger.Options{History: true, KeyFile: "-"})
		if err != nil {
			return 0, err
		}
		defer l.Close()
		start := time.Now()
		m, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{})
		if err != nil {
			return 0, err
		}
		defer func() { _ = m.Stop(context.Background()) }()
		if err := work(); err != nil {
			return 0, err
		}
		return waitIndexed(start, func() (int64, error) { return l.Store().Count(ctx, mine) })
	}
	if live, err = index("live.db", func() error { return emitAll(ctx, node, o, "mesh.bench.audited") }); err != nil {
		return 0, 0, 0, err
	}
	if catchUp, err = index("catch-up.db", func() error { return nil }); err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	pm, err := node.LoadPlugin(ctx, bin, []string{"--db", filepath.Join(state, "process.db"), "--history", "--key", "-", "--checkpoint-every", "-1s"},
		runtime.ModuleConfig{ToolGrants: []string{"audit.*"}})
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = pm.Stop(context.Background()) }()
	catchUpProc, err = waitIndexed(start, func() (int64, error) {
		var n int64
		err := node.Call(ctx, "meshctl", auditlogger.ToolCount, mine, &n)
		return n, err
	})
	return live, catchUp, catchUpProc, err
}
