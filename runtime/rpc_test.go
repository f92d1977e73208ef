package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

func serveModule(name, key string, h sdk.ToolHandlerFunc) sdk.Module {
	return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error { return m.Serve(key, h) }}
}

func callCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestCallRoundTrip: a call from a handler on one node to a tool on
// another carries its metadata and the handled event as its cause, and
// what the tool emits carries the request as its cause.
func TestCallRoundTrip(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a := testNode(t, url, "anchor", nil)
	b := testNode(t, url, "beacon", nil)
	reqs := make(chan sdk.Request, 1)
	var billing sdk.Mesh
	load(t, a, sdk.Module{Name: "billing", Emits: []string{"invoice.created"}, Setup: func(m sdk.Mesh) error {
		billing = m
		return m.Serve("invoice.create", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			reqs <- req
			var order struct{ Total int }
			if err := req.Decode(&order); err != nil {
				return nil, sdk.Permanent(err)
			}
			if _, err := billing.Emit(ctx, "invoice.created", order); err != nil {
				return nil, err
			}
			return map[string]int{"invoice": 7, "total": order.Total}, nil
		}))
	}}, runtime.ModuleConfig{})
	invoices := newRecorder(nil)
	load(t, b, sdk.Module{Name: "books", Setup: func(m sdk.Mesh) error { return m.On("module.billing.#", invoices) }}, runtime.ModuleConfig{})

	type answer struct {
		Invoice, Total int
	}
	answers := make(chan answer, 1)
	var shop sdk.Mesh
	shopMod := load(t, b, sdk.Module{Name: "shop", Emits: []string{"order.placed"}, Setup: func(m sdk.Mesh) error {
		shop = m
		return m.On("module.shop.order.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var a answer
			if err := shop.Call(ctx, "invoice.create", map[string]int{"total": 99}, &a); err != nil {
				return err
			}
			answers <- a
			return nil
		}))
	}}, runtime.ModuleConfig{})
	before := time.Now()
	orderID, err := shopMod.Mesh().Emit(emitCtx(t), "order.placed", 1)
	if err != nil {
		t.Fatal(err)
	}
	var got answer
	select {
	case got = <-answers:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer")
	}
	if got != (answer{Invoice: 7, Total: 99}) {
		t.Errorf("answer %+v", got)
	}
	req := <-reqs
	if _, err := ulid.ParseStrict(req.ID); err != nil {
		t.Errorf("request id %q: %v", req.ID, err)
	}
	if req.Tool != "invoice.create" || req.Caller != "shop" || req.Node != "beacon" || req.CausationID != orderID {
		t.Errorf("request metadata %+v, want caller shop on beacon caused by %s", req, orderID)
	}
	// The default deadline is the handler's: the node's handler timeout (30s).
	if req.Deadline.Before(before.Add(20*time.Second)) || req.Deadline.After(time.Now().Add(31*time.Second)) {
		t.Errorf("deadline %v is not about 30s after the call", req.Deadline)
	}
	if ev := invoices.next(t); ev.CausationID != req.ID {
		t.Errorf("event emitted by the tool has causation %q, want the request %q", ev.CausationID, req.ID)
	}
}

// TestCallErrors: the tool's error comes back with its code and message,
// and permanent is told apart from transient; a panic is an internal error
// and the server goes on serving.
func TestCallErrors(t *testing.T) {
	t.Parallel()
	n := testNode(t, "", "anchor", nil)
	load(t, n, serveModule("errs", "errs.do", func(ctx context.Context, req sdk.Request) (any, error) {
		var kind string
		if err := req.Decode(&kind); err != nil {
			return nil, err
		}
		switch kind {
		case "tool":
			return nil, &sdk.ToolError{Code: "not_found", Message: "no invoice 12", Permanent: true}
		case "permanent":
			return nil, sdk.Permanent(errors.New("order is closed"))
		case "transient":
			return nil, errors.New("database busy")
		case "panic":
			panic("index out of range")
		}
		return "fine", nil
	}), runtime.ModuleConfig{})
	cases := []struct {
		kind, code, message string
		permanent           bool
	}{
		{"tool", "not_found", "no invoice 12", true},
		{"permanent", wire.CodeRejected, "order is closed", true},
		{"transient", wire.CodeFailed, "database busy", false},
		{"panic", wire.CodeInternal, "index out of range", true},
	}
	for _, c := range cases {
		err := n.Call(callCtx(t, 10*time.Second), "test", "errs.do", c.kind, nil)
		var te *sdk.ToolError
		if !errors.As(err, &te) {
			t.Errorf("%s: got %v, want a ToolError", c.kind, err)
			continue
		}
		if te.Code != c.code || !strings.Contains(te.Message, c.message) || te.Permanent != c.permanent {
			t.Errorf("%s: got %+v, want code %s, message %q, permanent %v", c.kind, te, c.code, c.message, c.permanent)
		}
		if errors.Is(err, sdk.ErrPermanent) != c.permanent {
			t.Errorf("%s: errors.Is(err, ErrPermanent) = %v", c.kind, !c.permanent)
		}
	}
	var s string
	if err := n.Call(callCtx(t, 10*time.Second), "test", "errs.do", "ok", &s); err != nil || s != "fine" {
		t.Errorf("after a panic: %q, %v", s, err)
	}
}

// TestNoServer: a tool nobody declared, one whose queue exists with no
// consumer, and one whose queue is consumed but not bound (the request
// comes back as a basic.return) all fail with ErrNoServer, not with the
// long deadline.
func TestNoServer(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	raw := rawConn(t, url)
	if _, err := raw.QueueDeclare("serve.idle.tool", true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	if err := raw.QueueBind("serve.idle.tool", "idle.tool", "mesh.rpc", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.QueueDeclare("serve.unbound.tool", true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Consume("serve.unbound.tool", "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// A server that stopped leaves its queue without a consumer.
	stop(t, load(t, n, serveModule("gone", "gone.tool", func(ctx context.Context, req sdk.Request) (any, error) {
		return nil, nil
	}), runtime.ModuleConfig{}))
	for _, tool := range []string{"never.declared", "idle.tool", "unbound.tool", "gone.tool"} {
		err := n.Call(callCtx(t, 60*time.Second), "test", tool, 1, nil)
		if !errors.Is(err, sdk.ErrNoServer) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: got %v, want ErrNoServer", tool, err)
		}
	}
}

// TestServersCompete: two servers of one tool on two nodes; every call is
// answered exactly once.
func TestServersCompete(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	var handled atomic.Int32
	for _, name := range []string{"anchor", "beacon"} {
		n := testNode(t, url, name, nil)
		load(t, n, serveModule("worker", "work.do", func(ctx context.Context, req sdk.Request) (any, error) {
			handled.Add(1)
			var i int
			err := req.Decode(&i)
			return i * 2, err
		}), runtime.ModuleConfig{})
	}
	caller := testNode(t, url, "caller", nil)
	const calls = 100
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got int
			if err := caller.Call(callCtx(t, 20*time.Second), "test", "work.do", i, &got); err != nil {
				errs <- err
			} else if got != i*2 {
				errs <- fmt.Errorf("call %d answered %d", i, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := handled.Load(); got != calls {
		t.Errorf("servers handled %d requests for %d calls", got, calls)
	}
	q, err := rawConn(t, url).QueueDeclarePassive("serve.work.do", true, false, false, false, nil)
	if err != nil || q.Consumers != 2 {
		t.Errorf("serve.work.do has %d consumers (%v), want 2 sharing it", q.Consumers, err)
	}
}

// TestServerStoppedMidRequest: a server stopped while handling a request
// gives it back, and the other server answers it.
func TestServerStoppedMidRequest(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	a := testNode(t, url, "anchor", nil)
	started := make(chan struct{}, 1)
	slow := load(t, a, serveModule("slow", "job.run", func(ctx context.Context, req sdk.Request) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}), runtime.ModuleConfig{})
	caller := testNode(t, url, "caller", nil)
	answer := make(chan error, 1)
	var by string
	go func() { answer <- caller.Call(callCtx(t, 30*time.Second), "test", "job.run", 1, &by) }()
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the first server never got the request")
	}
	b := testNode(t, url, "beacon", nil)
	load(t, b, serveModule("fast", "job.run", func(ctx context.Context, req sdk.Request) (any, error) {
		return "beacon", nil
	}), runtime.ModuleConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // grace runs out
	defer cancel()
	_ = slow.Stop(ctx)
	if err := <-answer; err != nil || by != "beacon" {
		t.Errorf("answered by %q with %v, want the second server", by, err)
	}
}

// TestDeadlines: a slow server's late answer is dropped and the caller sees
// the deadline; a request that expired in the queue, or whose deadline
// passed before a server took it, is never run.
func TestDeadlines(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	var runs atomic.Int32
	release := make(chan struct{})
	slowMod := sdk.Module{Name: "slow", Setup: func(m sdk.Mesh) error {
		return m.Serve("slow.op", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			runs.Add(1)
			var wait bool
			_ = req.Decode(&wait)
			if wait {
				<-release // ignores its deadline, on purpose
			}
			return "late", nil
		}))
	}}
	load(t, n, slowMod, runtime.ModuleConfig{})
	err := n.Call(callCtx(t, 200*time.Millisecond), "test", "slow.op", true, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow call: %v, want the deadline error", err)
	}
	close(release) // the late answer arrives and is dropped
	var s string
	if err := n.Call(callCtx(t, 10*time.Second), "test", "slow.op", false, &s); err != nil || s != "late" {
		t.Errorf("next call: %q %v", s, err)
	}
	runsBefore := runs.Load()

	// Requests that wait in the queue while no server runs: one with an
	// expiration the broker enforces, one whose deadline already passed
	// (only the server's own check can refuse it).
	n2 := testNode(t, url, "beacon", nil)
	raw := rawConn(t, url)
	m2 := load(t, n2, sdk.Module{Name: "idle", Setup: func(m sdk.Mesh) error {
		return m.Serve("later.op", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			runs.Add(1)
			return nil, nil
		}))
	}}, runtime.ModuleConfig{})
	stop(t, m2)
	past := time.Now().Add(-time.Second).UTC()
	for _, p := range []amqp.Publishing{
		{Expiration: "50", Headers: requestHeaders(time.Now().Add(50 * time.Millisecond))},
		{Headers: requestHeaders(past)},
	} {
		p.ContentType, p.Body = "application/json", []byte("1")
		if err := raw.PublishWithContext(emitCtx(t), "mesh.rpc", "later.op", true, false, p); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	load(t, n2, sdk.Module{Name: "idle", Setup: func(m sdk.Mesh) error {
		return m.Serve("later.op", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			runs.Add(1)
			return nil, nil
		}))
	}}, runtime.ModuleConfig{})
	if err := n.Call(callCtx(t, 10*time.Second), "test", "later.op", 1, nil); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load() - runsBefore; got != 1 {
		t.Errorf("the server ran %d requests, want only the live call's", got)
	}
	if depth := queueDepth(t, raw, "serve.later.op"); depth != 0 {
		t.Errorf("%d requests left in the queue", depth)
	}
}

func requestHeaders(deadline time.Time) amqp.Table {
	return amqp.Table{
		"x-event-id": ulid.Make().String(), "x-source": "raw", "x-node": "raw",
		"x-time": time.Now().UTC().Format(time.RFC3339Nano), "x-deadline": deadline.UTC().Format(time.RFC3339Nano),
	}
}

// TestRPCOnTheWire checks requests, the reply queue and the serve queue with
// raw amqp091-go.
func TestRPCOnTheWire(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	load(t, n, serveModule("echo", "echo.say", func(ctx context.Context, req sdk.Request) (any, error) {
		return req.Body, nil
	}), runtime.ModuleConfig{})
	raw := rawConn(t, url)
	spy, err := raw.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.QueueBind(spy.Name, "#", "mesh.rpc", false, nil); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := n.Call(callCtx(t, 10*time.Second), "tester", "echo.say", "hi", &got); err != nil || got != "hi" {
		t.Fatalf("call: %q %v", got, err)
	}
	d := nextFrom(t, raw, spy.Name)
	id, _ := d.Headers["x-event-id"].(string)
	if _, err := ulid.ParseStrict(id); err != nil || d.MessageId != id {
		t.Errorf("request id %q, message-id %q", id, d.MessageId)
	}
	// The reply is matched by a correlation id of the call's own, not by
	// the request id another caller could name too.
	if _, err := ulid.ParseStrict(d.CorrelationId); err != nil || d.CorrelationId == id {
		t.Errorf("request id %q, correlation %q: want a ULID of its own", id, d.CorrelationId)
	}
	if d.UserId != "guest" {
		t.Errorf("request user-id %q, want the node's broker user guest (the serving node's callers rely on it)", d.UserId)
	}
	if d.RoutingKey != "echo.say" || d.Headers["x-source"] != "tester" || d.Headers["x-node"] != "anchor" || d.ContentType != "application/json" {
		t.Errorf("request %s headers %v content type %q", d.RoutingKey, d.Headers, d.ContentType)
	}
	for _, h := range []string{"x-time", "x-deadline"} {
		s, _ := d.Headers[h].(string)
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil || !strings.HasSuffix(s, "Z") {
			t.Errorf("%s = %q, not RFC 3339 UTC", h, s)
		}
	}
	if d.Expiration == "" || d.Expiration == "0" {
		t.Errorf("request expiration %q, want the remaining deadline", d.Expiration)
	}
	if !strings.HasPrefix(d.ReplyTo, "amq.gen-") {
		t.Errorf("reply queue %q is not server-named", d.ReplyTo)
	}
	// Exclusive: another connection may not touch it.
	other := rawConn(t, url)
	if _, err := other.QueueDeclarePassive(d.ReplyTo, false, true, true, false, nil); !isAMQPCode(err, amqp.ResourceLocked) {
		t.Errorf("reply queue from another connection: %v, want 405 (exclusive)", err)
	}
	// The serve queue is durable and classic, shared (not exclusive).
	sq := rawConn(t, url)
	if _, err := sq.QueueDeclare("serve.echo.say", true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Errorf("serve.echo.say is not a durable shared classic queue: %v", err)
	}
	// Auto-delete: gone when the caller's node closes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	check := rawConn(t, url)
	if _, err := check.QueueDeclarePassive(d.ReplyTo, false, true, true, false, nil); !isAMQPCode(err, amqp.NotFound) {
		t.Errorf("reply queue after the node closed: %v, want 404 (auto-deleted)", err)
	}
}

// TestCallFailsWhenTheConnectionDrops: a call in flight when the caller's
// connection is cut fails at once with ErrConnectionLost, not at its
// deadline (its reply queue is gone); a call made while the node cannot
// reconnect waits for it until its deadline, then fails with
// ErrConnectionLost too.
func TestCallFailsWhenTheConnectionDrops(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	server := testNode(t, url, "anchor", nil)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	load(t, server, serveModule("slow", "slow.op", func(ctx context.Context, req sdk.Request) (any, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil, errors.New("released")
	}), runtime.ModuleConfig{})
	t.Cleanup(func() { close(release) }) // runs before the server node's close
	proxy := brokertest.NewProxy(t)
	caller := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "caller", nil)
	answer := make(chan error, 1)
	go func() { answer <- caller.Call(callCtx(t, 60*time.Second), "test", "slow.op", 1, nil) }()
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the server never got the request")
	}
	proxy.Down()
	select {
	case err := <-answer:
		if !errors.Is(err, wire.ErrConnectionLost) {
			t.Errorf("got %v, want ErrConnectionLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call hangs after its connection dropped")
	}
	if err := caller.Call(callCtx(t, 2*time.Second), "test", "slow.op", 1, nil); !errors.Is(err, wire.ErrConnectionLost) {
		t.Errorf("a call while the broker is unreachable: %v, want ErrConnectionLost", err)
	}
}

// TestEmitsSurviveConnectionCuts: a stream of emits from 8 goroutines
// while the connection is cut three times, once for 2 s during which the
// broker is unreachable. Every emit succeeds (confirmed, or spooled and
// resent), and every emitted event reaches the module exactly once.
func TestEmitsSurviveConnectionCuts(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "anchor", func(c *runtime.Config) {
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
	})
	seen := newIDSet()
	m := load(t, n, sdk.Module{Name: "busy", Emits: []string{"tick"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.busy.tick", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			seen.add(ev.ID)
			return nil
		}))
	}}, runtime.ModuleConfig{Prefetch: 64, Concurrency: 4})
	emitted := newIDSet()
	stopEmitting := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopEmitting:
					return
				default:
				}
				id, err := m.Mesh().Emit(emitCtx(t), "tick", i)
				if err != nil {
					t.Errorf("emit: %v", err)
					return
				}
				emitted.add(id)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	proxy.Cut()
	time.Sleep(300 * time.Millisecond)
	proxy.Down()
	time.Sleep(2 * time.Second)
	proxy.Up()
	time.Sleep(500 * time.Millisecond)
	proxy.Cut()
	time.Sleep(500 * time.Millisecond)
	close(stopEmitting)
	wg.Wait()
	waitFor(t, 60*time.Second, func() bool { return seen.len() >= emitted.len() })
	st := n.Stats()
	lost := emitted.missingFrom(seen)
	t.Logf("summary: emitted=%d confirmed=%d spooled=%d resent=%d handled=%d duplicates_suppressed=%d reconnects=%d lost=%d",
		emitted.len(), st.Emitted, st.Spooled, st.Resent, seen.len(), st.Duplicates, st.Reconnects, len(lost))
	if len(lost) > 0 {
		t.Errorf("%d emitted events never handled, e.g. %v", len(lost), lost[:min(3, len(lost))])
	}
	if dups := seen.duplicates(); dups > 0 {
		t.Errorf("%d events handled more than once", dups)
	}
	if st.Reconnects < 3 {
		t.Errorf("reconnects = %d, want at least 3", st.Reconnects)
	}
	if st.Spooled == 0 {
		t.Error("nothing was spooled while the broker was unreachable")
	}
}

// TestWaitingCallsShareTheServerCheck: forty calls waiting on one tool do
// not each ask the broker every second whether it still has a server:
// they share one answer per half recheck period, so four more checks take
// at least a recheck period (a lower bound: a slow machine only makes it
// longer; forty calls asking each would make four checks at once).
func TestWaitingCallsShareTheServerCheck(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	entered := make(chan struct{}, 100)
	release := make(chan struct{})
	load(t, n, sdk.Module{Name: "slow", Setup: func(m sdk.Mesh) error {
		return m.Serve("slow.wait", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return "ok", nil
		}))
	}}, runtime.ModuleConfig{Prefetch: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const calls = 40
	done := make(chan error, calls)
	for range calls {
		go func() { done <- n.Call(ctx, "test", "slow.wait", nil, nil) }()
	}
	for range calls {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the calls never reached the server")
		}
	}
	checks := func(over uint64) {
		for n.Stats().ServerChecks < over {
			select {
			case <-ctx.Done():
				t.Fatal("the waiting calls never checked for a server")
			case <-time.After(time.Millisecond):
			}
		}
	}
	// From the first recheck on: forty calls asking each would make the
	// next four checks at once.
	checks(n.Stats().ServerChecks + 1)
	start, before := time.Now(), n.Stats().ServerChecks
	checks(before + 4)
	if took := time.Since(start); took < time.Second {
		t.Errorf("4 server checks within %v with %d calls waiting: each call asks the broker itself", took, calls)
	}
	close(release)
	for range calls {
		if err := <-done; err != nil {
			t.Errorf("call: %v", err)
		}
	}
}
