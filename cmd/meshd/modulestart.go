package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelmetric "go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// A module of the config that does not load or start (a binary of a
// module protocol outside the window, a missing binary, a grant the
// binary is refused, a process that exits at once) does not stop the node:
// meshd reports it (the log, /readyz, node.NODE.module.failed, the metric
// mesh_modules_start_failures_total) and tries it again with back-off,
// while the node and its other modules run. An entry with required: true
// keeps the older rule: meshd exits when it does not start.
// docs/adr/0041-a-module-that-fails-never-stops-its-node.md.

// Back-off between the tries of a module that does not start: it doubles
// from startRetryMin to startRetryMax. A reload (SIGHUP) tries it at once.
var (
	startRetryMin = time.Second
	startRetryMax = time.Minute
)

// moduleFailedEvent is the event name (node.NODE.module.failed) a node
// emits each time a module of its config does not start, beside the
// runtime's node.NODE.module.started, crashed and restarted.
func moduleFailedEvent(node string) string { return "node." + node + ".module.failed" }

// maxReportedError bounds the error text a report carries (a module
// process's words may be in it).
const maxReportedError = 2000

// pendingModule is a module of the config that is not running: when it is
// tried next, and what the last try said.
type pendingModule struct {
	index    int
	entry    nodeconfig.Module
	attempts int
	next     time.Time
	err      error
}

// starter starts the config's modules and owns those that did not start.
// Only run's goroutine uses it.
type starter struct {
	node     *runtime.Node
	iso      *isolation
	ready    *readiness
	log      *slog.Logger
	pending  map[string]*pendingModule
	failures otelmetric.Int64Counter
	now      func() time.Time
}

// newStarter makes a starter whose metrics go to mp (none when nil).
func newStarter(node *runtime.Node, iso *isolation, ready *readiness, log *slog.Logger, mp otelmetric.MeterProvider) (*starter, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	meter := mp.Meter("github.com/meshkit/mesh/cmd/meshd")
	s := &starter{node: node, iso: iso, ready: ready, log: log, pending: map[string]*pendingModule{}, now: time.Now}
	var err error
	s.failures, err = meter.Int64Counter("mesh.modules.start_failures",
		otelmetric.WithDescription("Times a module of the node's config did not load or start (each try of its back-off counts), by module."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	_, err = meter.Int64ObservableGauge("mesh.modules.not_running",
		otelmetric.WithDescription("Modules of the node's config that did not start and are being tried again with back-off (/readyz names them)."),
		otelmetric.WithInt64Callback(func(_ context.Context, o otelmetric.Int64Observer) error {
			o.Observe(int64(ready.failedCount()))
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return s, nil
}

// start loads entry i of the config. A module that does not start is
// reported and will be tried again (nil, nil), unless it is required or
// meshd is stopping: then the error.
func (s *starter) start(ctx context.Context, i int, m nodeconfig.Module) (*loaded, error) {
	l, err := loadWith(ctx, s.node, s.iso, i, m)
	if err == nil {
		s.started(m.Name)
		return l, nil
	}
	if ctx.Err() != nil {
		return nil, err
	}
	if m.Required {
		return nil, fmt.Errorf("module %s (required: true) did not start: %w", m.Name, err)
	}
	s.failed(ctx, i, m, err)
	return nil, nil
}

// started forgets a module's failures (the runtime announced it
// started: node.NODE.module.started).
func (s *starter) started(name string) {
	p, ok := s.pending[name]
	s.ready.notStarted(name, nil)
	if !ok {
		return
	}
	delete(s.pending, name)
	s.log.Info("module started after failing", "module", name, "attempts", p.attempts+1)
}

// failed reports that module m did not start (err) and schedules its next
// try.
func (s *starter) failed(ctx context.Context, i int, m nodeconfig.Module, err error) {
	p, ok := s.pending[m.Name]
	if !ok || p.entry.Path != m.Path {
		p = &pendingModule{}
		s.pending[m.Name] = p
	}
	p.index, p.entry, p.err = i, m, err
	p.attempts++
	wait := min(startRetryMin<<min(p.attempts-1, 20), startRetryMax)
	p.next = s.now().Add(wait)
	text := err.Error()
	if len(text) > maxReportedError {
		text = text[:maxReportedError] + "…"
	}
	s.ready.notStarted(m.Name, errors.New(text))
	s.failures.Add(ctx, 1, otelmetric.WithAttributes(attribute.String("module", m.Name)))
	s.log.Error("a module did not start; the node runs without it and tries it again (required: true in its entry makes meshd exit instead)",
		"module", m.Name, "err", text, "attempt", p.attempts, "retry_in", wait.String())
	s.report(ctx, moduleFailedEvent(s.node.Name()), map[string]any{"module": m.Name, "path": m.Path, "error": text, "attempt": p.attempts, "retry_in_ms": wait.Milliseconds()})
}

// report emits a node event about a module, within a few seconds: the
// node may be cut off from the broker, and the event then waits in its
// spool.
func (s *starter) report(ctx context.Context, eventType string, body map[string]any) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.node.Emit(ctx, s.node.Name(), eventType, body); err != nil {
		s.log.Warn("could not announce a module's state", "event", eventType, "err", err)
	}
}

// due is when the next module is to be tried, or nil if none waits.
func (s *starter) due() <-chan time.Time {
	var first time.Time
	for _, p := range s.pending {
		if first.IsZero() || p.next.Before(first) {
			first = p.next
		}
	}
	if first.IsZero() {
		return nil
	}
	return time.After(max(first.Sub(s.now()), 0))
}

// retry tries the modules whose time came, adding those that start to
// running.
func (s *starter) retry(ctx context.Context, running map[string]*loaded) error {
	now := s.now()
	for name, p := range s.pending {
		if p.next.After(now) {
			continue
		}
		l, err := s.start(ctx, p.index, p.entry)
		if err != nil {
			return err
		}
		if l != nil {
			running[name] = l
		}
	}
	return nil
}

// forgetAllBut forgets the modules the config no longer has.
func (s *starter) forgetAllBut(want map[string]bool) {
	for name := range s.pending {
		if !want[name] {
			delete(s.pending, name)
		}
	}
	s.ready.forgetAllBut(want)
}
