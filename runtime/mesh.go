package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshkit/mesh/internal/asyncemit"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// moduleMesh is a module's sdk.Mesh: it emits under the module's namespace
// and subscribes the module's queue. Its rules are those of the sdk
// package doc ("What a module can rely on"); a module process follows the
// same (sdk/process), and test/conformance holds both to them.
type moduleMesh struct {
	module *Module
	async  *asyncemit.Window // its EmitAsync calls under way
}

var _ sdk.Mesh = (*moduleMesh)(nil)

// EmitAsync runs Emit on a goroutine of the module's window
// (internal/asyncemit), its outcome to done.
func (mm *moduleMesh) EmitAsync(ctx context.Context, name string, body any, done func(string, error), opts ...sdk.EmitOption) error {
	if done == nil {
		return fmt.Errorf("emit %s: %w: EmitAsync needs a done function", name, sdk.ErrInvalid)
	}
	return mm.async.Go(ctx, func(ctx context.Context) (string, error) { return mm.Emit(ctx, name, body, opts...) }, done)
}

func (mm *moduleMesh) Emit(ctx context.Context, name string, body any, opts ...sdk.EmitOption) (string, error) {
	o, err := wire.ApplyEmitOptions(opts)
	if err != nil {
		return "", err
	}
	return mm.module.emit(ctx, name, body, o, "")
}

// emit publishes an event of the module: id is the id the event gets, or
// "" for the host to give it one (derived inside a handling unless
// o.FreshID, fresh otherwise).
func (m *Module) emit(ctx context.Context, name string, body any, o wire.EmitOptions, id string) (string, error) {
	if !m.isStarted() {
		return "", fmt.Errorf("emit %s: %w", name, wire.ErrNotStarted)
	}
	eventType, err := m.eventType(name, o.FullType)
	if err != nil {
		return "", fmt.Errorf("emit: %w", err)
	}
	if err := m.checkDelay(eventType, o, time.Now()); err != nil {
		return "", err
	}
	raw, err := m.node.encodeBody(body)
	if err == nil {
		o.Schema, err = m.contracts.Emit(eventType, raw, o.Schema)
	}
	if err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	switch {
	case o.Outbox != nil: // a row of the module's outbox: its id is of the module's scope alone
		id = causation.OutboxID(m.def.Name, *o.Outbox)
	case id == "" && !o.FreshID:
		id, _ = causation.Derive(ctx, m.def.Name, causation.KindEmit, eventType, raw)
	}
	id, err = m.node.emit(ctx, m.def.Name, eventType, raw, o, id)
	if err == nil {
		m.counts.emitted.Add(1)
	}
	return id, err
}

func (m *Module) isStarted() bool { return m.running.Load() }

// eventType is the full type a module's emit of name makes, if the module
// may emit it (wire.EmitType).
func (m *Module) eventType(name string, full bool) (string, error) {
	t, err := wire.EmitType(m.def.Name, name, full, m.cfg.EmitGrants)
	if errors.Is(err, sdk.ErrForbidden) {
		m.log.Warn("emit outside the module's namespace refused", "event_type", name)
	}
	if err == nil && !m.cfg.AllowUndeclaredEmits {
		if err = wire.CheckDeclared(m.def.Name, t, m.def.Emits); err != nil {
			m.log.Warn("emit of an undeclared event refused", "event_type", t)
		}
	}
	return t, err
}

func (mm *moduleMesh) On(pattern string, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return mm.module.setup.On(pattern, h, o, err) // a nil h arrives as a nil any
}

func (mm *moduleMesh) Call(ctx context.Context, tool string, req, resp any) error {
	return mm.module.callTool(ctx, tool, req, resp, "")
}

// callTool makes a tool call of the module: id is the request's id, or "" for
// the host to give it one (derived inside a handling, fresh otherwise).
func (m *Module) callTool(ctx context.Context, tool string, req, resp any, id string) error {
	if !m.isStarted() {
		return fmt.Errorf("call %s: %w", tool, wire.ErrNotStarted)
	}
	if err := m.checkCallGrant(tool); err != nil {
		return err
	}
	return m.node.call(ctx, m.def.Name, tool, req, resp, id)
}

func (mm *moduleMesh) Consume(queue string, prefetch int, h sdk.Handler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	return mm.module.setup.Consume(queue, prefetch, h, o, err) // a nil h arrives as a nil any
}

func (mm *moduleMesh) Hold(queue string, held bool) error { return mm.module.hold(queue, held) }

func (mm *moduleMesh) Exclusive(queue string) error { return mm.module.setup.Exclusive(queue) }

func (mm *moduleMesh) Serve(key string, h sdk.ToolHandler, opts ...sdk.HandlerOption) error {
	o, err := wire.ApplyHandlerOptions(opts)
	err = mm.module.setup.Serve(key, h, o, err)
	if errors.Is(err, sdk.ErrForbidden) {
		mm.module.log.Warn("serving a tool the node config does not grant refused", "tool", key)
	}
	return err
}

func (mm *moduleMesh) Logger() *slog.Logger { return mm.module.log }

// ReportOutbox keeps the backlog of the module's outbox (sdk/outbox's
// relay reports it) for the node's metrics.
func (mm *moduleMesh) ReportOutbox(s wire.OutboxStats) { mm.module.counts.outbox.Store(&s) }

var _ wire.OutboxReporter = (*moduleMesh)(nil)
