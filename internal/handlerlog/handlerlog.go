// Package handlerlog carries the logger of a handling in its context: the
// module's logger tagged with what is handled, which every host puts in
// the ctx it hands a handler, a tool handler and Run, and sdk.Logger
// reads. The tagged logger is made when it is first asked for, so a
// handler that does not log pays for a context value only.
package handlerlog

import (
	"context"
	"log/slog"
	"sync"
)

type key struct{}

type lazy struct {
	once sync.Once
	make func() *slog.Logger
	l    *slog.Logger
}

// With returns ctx carrying l.
func With(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, key{}, &lazy{make: func() *slog.Logger { return l }})
}

// IDs are the trace and span ids of the span a ctx carries, "" for none
// (tracecontext.IDs; this package does not depend on a tracer).
type IDs func(context.Context) (traceID, spanID string)

// Event returns ctx carrying base tagged with an event's id and type, and
// with the trace and span ids ids finds in ctx.
func Event(ctx context.Context, base *slog.Logger, id, eventType string, ids IDs) context.Context {
	return context.WithValue(ctx, key{}, &lazy{make: func() *slog.Logger {
		return traced(ctx, base.With("event_id", id, "event_type", eventType), ids)
	}})
}

// Request returns ctx carrying base tagged with a tool request's id, tool
// and caller, and with the trace and span ids ids finds in ctx.
func Request(ctx context.Context, base *slog.Logger, id, tool, caller string, ids IDs) context.Context {
	return context.WithValue(ctx, key{}, &lazy{make: func() *slog.Logger {
		return traced(ctx, base.With("request_id", id, "tool", tool, "caller", caller), ids)
	}})
}

// From is the logger ctx carries, if any.
func From(ctx context.Context) (*slog.Logger, bool) {
	z, ok := ctx.Value(key{}).(*lazy)
	if !ok {
		return nil, false
	}
	z.once.Do(func() { z.l = z.make() })
	return z.l, z.l != nil
}

func traced(ctx context.Context, l *slog.Logger, ids IDs) *slog.Logger {
	if ids == nil {
		return l
	}
	traceID, spanID := ids(ctx)
	if traceID == "" {
		return l
	}
	return l.With("trace_id", traceID, "span_id", spanID)
}
