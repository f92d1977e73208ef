package runtime_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// spansNamed returns the ended spans of rec with name.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// oneSpan waits for the ended span called name and returns it.
func oneSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	waitFor(t, 15*time.Second, func() bool { return len(spansNamed(rec, name)) > 0 })
	return spansNamed(rec, name)[0]
}

// TestTraceAcrossEmitHandleCall: emit → handle → emit → handle → call →
// serve is one trace, each span the child of the one before, with the
// messaging conventions' kinds; a foreign publisher's traceparent is
// continued, on the wire too.
func TestTraceAcrossEmitHandleCall(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	rec := tracetest.NewSpanRecorder()
	n := testNode(t, url, "traced", func(c *runtime.Config) {
		c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	})
	load(t, n, sdk.Module{Name: "a", Emits: []string{"next"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.trace.start", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "next", 1)
			return err
		}))
	}}, runtime.ModuleConfig{})
	handled := make(chan struct{}, 1)
	load(t, n, sdk.Module{Name: "b", Calls: []string{"c.echo"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.a.next", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var out int
			err := m.Call(ctx, "c.echo", 2, &out)
			handled <- struct{}{}
			return err
		}))
	}}, runtime.ModuleConfig{})
	load(t, n, sdk.Module{Name: "c", Setup: func(m sdk.Mesh) error {
		return m.Serve("c.echo", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return r.Body, nil }))
	}}, runtime.ModuleConfig{})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.trace.start", 1); err != nil {
		t.Fatal(err)
	}
	<-handled
	chain := []struct {
		name string
		kind trace.SpanKind
	}{
		{"publish mesh.trace.start", trace.SpanKindProducer},
		{"process mesh.trace.start", trace.SpanKindConsumer},
		{"publish module.a.next", trace.SpanKindProducer},
		{"process module.a.next", trace.SpanKindConsumer},
		{"call c.echo", trace.SpanKindClient},
		{"serve c.echo", trace.SpanKindServer},
	}
	var prev sdktrace.ReadOnlySpan
	for _, c := range chain {
		s := oneSpan(t, rec, c.name)
		if s.SpanKind() != c.kind {
			t.Errorf("%s is a %v span, want %v", c.name, s.SpanKind(), c.kind)
		}
		if prev != nil {
			if s.SpanContext().TraceID() != prev.SpanContext().TraceID() {
				t.Errorf("%s is in trace %s, %s in %s", c.name, s.SpanContext().TraceID(), prev.Name(), prev.SpanContext().TraceID())
			}
			if s.Parent().SpanID() != prev.SpanContext().SpanID() {
				t.Errorf("%s's parent is %s, want %s (%s)", c.name, s.Parent().SpanID(), prev.SpanContext().SpanID(), prev.Name())
			}
		}
		prev = s
	}

	// A foreign publisher's trace is continued: the handler's span is its
	// child, and what the handler emits carries the same trace id.
	raw := rawConn(t, url)
	q := watchQueue(t, raw, "module.a.next")
	const foreignTrace, foreignSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	id := "01JTRACE000000000000000000"
	if err := raw.PublishWithContext(emitCtx(t), wire.ExchangeEvents, "mesh.trace.start", false, false, amqp.Publishing{
		Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "foreign", wire.HeaderNode: "x",
			wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano), "traceparent": "00-" + foreignTrace + "-" + foreignSpan + "-01"},
		ContentType: wire.ContentTypeJSON, MessageId: id, Body: []byte("1"),
	}); err != nil {
		t.Fatal(err)
	}
	<-handled
	next := nextFrom(t, raw, q)
	if tp, _ := next.Headers["traceparent"].(string); !strings.HasPrefix(tp, "00-"+foreignTrace+"-") {
		t.Errorf("the emitted event's traceparent %q does not continue trace %s", tp, foreignTrace)
	}
	// The handling's span ends after its handler returns, which may be
	// after b has handled the emitted event: wait for it to end.
	continued := func() bool {
		for _, s := range spansNamed(rec, "process mesh.trace.start") {
			if s.SpanContext().TraceID().String() == foreignTrace && s.Parent().SpanID().String() == foreignSpan && s.Parent().IsRemote() {
				return true
			}
		}
		return false
	}
	t.Log("waiting for a handler span that is the child of the foreign publisher's span")
	waitFor(t, 15*time.Second, continued)
}

// TestTraceThroughAModuleProcess: a handler in a module process emits,
// and the emit's span is the child of the handling's span on the node.
func TestTraceThroughAModuleProcess(t *testing.T) {
	t.Parallel()
	bin, _ := echoModule(t)
	url := brokertest.VHost(t)
	rec := tracetest.NewSpanRecorder()
	n := testNode(t, url, "traced", func(c *runtime.Config) {
		c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	})
	loadPlugin(t, n, bin, runtime.ModuleConfig{})
	pongs := newRecorder(nil)
	load(t, n, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error { return m.On("module.echo.pong", pongs) }}, runtime.ModuleConfig{})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.test.ping", map[string]string{"do": "pong"}); err != nil {
		t.Fatal(err)
	}
	pongs.next(t)
	handling := oneSpan(t, rec, "process mesh.test.ping")
	pong := oneSpan(t, rec, "publish module.echo.pong")
	if pong.SpanContext().TraceID() != handling.SpanContext().TraceID() || pong.Parent().SpanID() != handling.SpanContext().SpanID() {
		t.Errorf("the module process's emit (trace %s, parent %s) is not the child of its handling (trace %s, span %s)",
			pong.SpanContext().TraceID(), pong.Parent().SpanID(), handling.SpanContext().TraceID(), handling.SpanContext().SpanID())
	}
}

// TestTraceContinuedWithTracingOff: a node without a TracerProvider makes
// no span, but a handler's emits carry on the trace of the event it
// handles (here a foreign publisher's), and an emit outside any trace
// carries no traceparent.
func TestTraceContinuedWithTracingOff(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "untraced", nil)
	m := load(t, n, sdk.Module{Name: "a", Emits: []string{"next"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.trace.start", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "next", 1)
			return err
		}))
	}}, runtime.ModuleConfig{})
	raw := rawConn(t, url)
	q := watchQueue(t, raw, "module.a.next")
	const foreignTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	id := "01JTRACE000000000000000001"
	if err := raw.PublishWithContext(emitCtx(t), wire.ExchangeEvents, "mesh.trace.start", false, false, amqp.Publishing{
		Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "foreign", wire.HeaderNode: "x",
			wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano), "traceparent": "00-" + foreignTrace + "-00f067aa0ba902b7-01"},
		ContentType: wire.ContentTypeJSON, MessageId: id, Body: []byte("1"),
	}); err != nil {
		t.Fatal(err)
	}
	if tp, _ := nextFrom(t, raw, q).Headers["traceparent"].(string); !strings.HasPrefix(tp, "00-"+foreignTrace+"-") {
		t.Errorf("the emitted event's traceparent %q does not continue trace %s", tp, foreignTrace)
	}
	if _, err := m.Mesh().Emit(emitCtx(t), "next", 2); err != nil {
		t.Fatal(err)
	}
	if tp, ok := nextFrom(t, raw, q).Headers["traceparent"]; ok {
		t.Errorf("an emit outside any trace carries traceparent %v", tp)
	}
}
