package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// moduleMesh is a module's sdk.Mesh: it emits under the module's namespace
// and subscribes the module's queue.
type moduleMesh struct {
	module *Module
}

var _ sdk.Mesh = (*moduleMesh)(nil)

func (mm *moduleMesh) Emit(ctx context.Context, name string, body any, opts ...sdk.EmitOption) (string, error) {
	m := mm.module
	o, err := sdk.ApplyEmitOptions(opts...)
	if err != nil {
		return "", err
	}
	eventType, err := m.eventType(name, o.FullType)
	if err != nil {
		return "", fmt.Errorf("emit: %w", err)
	}
	return m.node.emit(ctx, m.def.Name, eventType, body, o)
}

// eventType is the full type a module's emit of name makes, if the module
// may emit it: its own namespace always, another only where a grant
// matches.
func (m *Module) eventType(name string, full bool) (string, error) {
	if !full {
		if err := wire.ValidateRelativeType(name); err != nil {
			return "", err
		}
		t := wire.ModuleEventType(m.def.Name, name)
		return t, wire.ValidateEventType(t)
	}
	if err := wire.ValidateEventType(name); err != nil {
		return "", err
	}
	if strings.HasPrefix(name, "module."+m.def.Name+".") {
		return name, nil
	}
	for _, g := range m.cfg.EmitGrants {
		if wire.MatchPattern(g, name) {
			return name, nil
		}
	}
	m.log.Warn("emit outside the module's namespace refused", "event_type", name)
	return "", fmt.Errorf("%w: module %s may emit %s only if its node config grants it (emit_grants)", sdk.ErrForbidden, m.def.Name, name)
}

func (mm *moduleMesh) On(pattern string, h sdk.Handler) error {
	m := mm.module
	if err := wire.ValidatePattern(pattern); err != nil {
		return fmt.Errorf("on: %w", err)
	}
	if h == nil {
		return fmt.Errorf("on %q: handler is nil", pattern)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return fmt.Errorf("on %q: %w", pattern, sdk.ErrAlreadyStarted)
	}
	for _, s := range m.subs {
		if s.pattern == pattern {
			return fmt.Errorf("on %q: pattern already subscribed by module %s", pattern, m.def.Name)
		}
	}
	m.subs = append(m.subs, subscription{pattern: pattern, handler: h})
	return nil
}

func (mm *moduleMesh) Call(ctx context.Context, tool string, req, resp any) error {
	return mm.module.node.call(ctx, mm.module.def.Name, tool, req, resp)
}

func (mm *moduleMesh) Serve(key string, h sdk.ToolHandler) error {
	m := mm.module
	if err := wire.ValidateToolKey(key); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if h == nil {
		return fmt.Errorf("serve %q: handler is nil", key)
	}
	if g := m.cfg.ToolGrants; g != nil && !slices.ContainsFunc(g, func(p string) bool { return wire.MatchPattern(p, key) }) {
		m.log.Warn("serving a tool the node config does not grant refused", "tool", key)
		return fmt.Errorf("serve %q: %w: module %s may serve only %v (tool_grants)", key, sdk.ErrForbidden, m.def.Name, g)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return fmt.Errorf("serve %q: %w", key, sdk.ErrAlreadyStarted)
	}
	for _, t := range m.tools {
		if t.key == key {
			return fmt.Errorf("serve %q: tool already served by module %s", key, m.def.Name)
		}
	}
	m.tools = append(m.tools, tool{key: key, handler: h})
	return nil
}

func (mm *moduleMesh) Logger() *slog.Logger { return mm.module.log }
