// Package tracecontext moves a handling's trace context where the hosts
// need it: across the plugin protocol as W3C traceparent and tracestate
// strings, and into the ids a handler's logger is tagged with.
package tracecontext

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

var w3c propagation.TraceContext

// IDs are the trace and span ids of the span ctx carries, or "" when it
// carries none.
func IDs(ctx context.Context) (traceID, spanID string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

// Inject is the W3C trace context of the span ctx carries ("" when none).
func Inject(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// Extract returns ctx carrying the remote span context traceparent and
// tracestate describe; ctx as it is when they describe none (an invalid
// traceparent is ignored, as the W3C rules say).
func Extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}
