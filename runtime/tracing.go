package runtime

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/wire"
)

// Traces: the W3C trace context travels in each event's and request's
// traceparent and tracestate headers. Emitting starts a producer span,
// handling a consumer span whose parent is the emitter's (a foreign
// publisher's traceparent is continued, not replaced), calling a client
// span and serving a server span, so emit → handle → emit and call → serve
// form one trace across nodes and module processes. Spans follow the
// OpenTelemetry messaging conventions (messaging.system rabbitmq). Without
// Config.TracerProvider no span is made, but an incoming trace context is
// still passed on to what its handler emits and calls.

// propagator is the W3C trace context (traceparent, tracestate).
var propagator = propagation.TraceContext{}

// startTracing makes the node's tracer; without a provider there is none,
// and the start functions below make no span (a nil one, which endSpan
// takes): they only pass an incoming trace context on, at no cost when
// there is none.
func (n *Node) startTracing() {
	if n.cfg.TracerProvider != nil {
		n.trace = n.cfg.TracerProvider.Tracer(meterName)
	}
}

// headerCarrier carries the trace context in an AMQP message's headers.
type headerCarrier amqp.Table

func (c headerCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// injectTrace puts ctx's trace context into headers (nothing when ctx has
// none).
func injectTrace(ctx context.Context, headers amqp.Table) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, headerCarrier(headers))
	}
}

// extractTrace is ctx with the trace context of a delivery's headers, if
// it carries one.
func extractTrace(ctx context.Context, headers amqp.Table) context.Context {
	if _, ok := headers["traceparent"]; !ok {
		return ctx
	}
	return propagator.Extract(ctx, headerCarrier(headers))
}

// Messaging attributes (OpenTelemetry semantic conventions).
var (
	attrSystem     = attribute.String("messaging.system", "rabbitmq")
	attrSend       = attribute.String("messaging.operation.type", "send")
	attrProcess    = attribute.String("messaging.operation.type", "process")
	attrEventsExch = attribute.String("messaging.destination.name", wire.ExchangeEvents)
	attrRPCExch    = attribute.String("messaging.destination.name", wire.ExchangeRPC)
)

// startPublish starts the producer span of an emit of eventType with id.
func (n *Node) startPublish(ctx context.Context, eventType, id string) (context.Context, trace.Span) {
	if n.trace == nil {
		return ctx, nil
	}
	return n.trace.Start(ctx, "publish "+eventType, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrSystem, attrSend, attrEventsExch,
			attribute.String("messaging.rabbitmq.destination.routing_key", eventType),
			attribute.String("messaging.message.id", id)))
}

// startProcess starts the consumer span of handling d from queue, the
// emitter's span (from d's headers) as its parent.
func (n *Node) startProcess(ctx context.Context, d amqp.Delivery, queue, eventType, module string) (context.Context, trace.Span) {
	if n.trace == nil {
		return extractTrace(ctx, d.Headers), nil
	}
	return n.trace.Start(extractTrace(ctx, d.Headers), "process "+eventType, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrSystem, attrProcess,
			attribute.String("messaging.destination.name", queue),
			attribute.String("messaging.rabbitmq.destination.routing_key", d.RoutingKey),
			attribute.String("messaging.message.id", d.MessageId),
			attribute.String("mesh.module", module)))
}

// startCall starts the client span of a call of tool.
func (n *Node) startCall(ctx context.Context, tool, id string) (context.Context, trace.Span) {
	if n.trace == nil {
		return ctx, nil
	}
	return n.trace.Start(ctx, "call "+tool, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrSystem, attrRPCExch, attribute.String("rpc.method", tool), attribute.String("messaging.message.id", id)))
}

// startServe starts the server span of answering a request d for tool.
func (n *Node) startServe(ctx context.Context, d amqp.Delivery, tool, module string) (context.Context, trace.Span) {
	if n.trace == nil {
		return extractTrace(ctx, d.Headers), nil
	}
	return n.trace.Start(extractTrace(ctx, d.Headers), "serve "+tool, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrSystem, attribute.String("rpc.method", tool),
			attribute.String("messaging.message.id", d.MessageId), attribute.String("mesh.module", module)))
}

// endSpan ends span, marked failed when err is not nil; a nil span
// (tracing off) is nothing to end.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
