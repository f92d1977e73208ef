package dispatcher_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// world is a node on the test's virtual host, a raw amqp091-go channel
// (the outside system), and tools served in-process.
type world struct {
	ctx  context.Context
	url  string
	node *runtime.Node
	ch   *amqp.Channel
	dead <-chan amqp.Delivery
}

func newWorld(t *testing.T) *world {
	t.Helper()
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(context.Background()) })
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return &world{ctx: ctx, url: url, node: node, ch: ch}
}

// queue declares a queue as the outside system does.
func (w *world) queue(t *testing.T, name string) {
	t.Helper()
	if _, err := w.ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func (w *world) publish(t *testing.T, queue, id string, body []byte, headers amqp.Table) {
	t.Helper()
	if err := w.ch.PublishWithContext(w.ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: body, Headers: headers, DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
}

// load loads a module in-process.
func (w *world) load(t *testing.T, def sdk.Module, mc runtime.ModuleConfig) {
	t.Helper()
	m, err := w.node.Load(w.ctx, def, mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop(context.Background()) })
}

// nextDead waits for the next dead letter.
func (w *world) nextDead(t *testing.T) amqp.Delivery {
	t.Helper()
	if w.dead == nil {
		ch, err := w.ch.Consume("mesh.dead-letters", "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.dead = ch
	}
	select {
	case d := <-w.dead:
		return d
	case <-w.ctx.Done():
		t.Fatal("no dead letter")
		return amqp.Delivery{}
	}
}

// depth is a queue's ready and unacknowledged messages, read from the
// broker through a consumer-free passive declare.
func (w *world) depth(t *testing.T, queue string) int {
	t.Helper()
	q, err := w.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// fires pages through the firing record of a trigger.
func (w *world) fires(t *testing.T, trigger string) []dispatcher.Fire {
	t.Helper()
	var all []dispatcher.Fire
	for after := int64(0); ; {
		var page dispatcher.FiresResponse
		if err := w.node.Call(w.ctx, "meshctl", dispatcher.ToolFires, dispatcher.FiresRequest{Trigger: trigger, After: after}, &page); err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Fires...)
		if page.Next == 0 {
			return all
		}
		after = page.Next
	}
}

// firings receives each firing of a dispatcher once it is recorded
// (Config.OnFire).
type firings chan dispatcher.Fire

// wait returns the next n firings.
func (f firings) wait(t *testing.T, ctx context.Context, n int) []dispatcher.Fire {
	t.Helper()
	out := make([]dispatcher.Fire, 0, n)
	for len(out) < n {
		select {
		case x := <-f:
			out = append(out, x)
		case <-ctx.Done():
			t.Fatalf("%d of %d firings: %+v", len(out), n, out)
		}
	}
	return out
}

func openDispatcher(t *testing.T, triggers ...dispatcher.Trigger) (*dispatcher.Dispatcher, firings) {
	t.Helper()
	fired := make(firings, 1000)
	d, err := dispatcher.Open(dispatcher.Config{Store: filepath.Join(t.TempDir(), "fires.db"), Triggers: triggers,
		OnFire: func(x dispatcher.Fire) { fired <- x }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, fired
}

// tools serves the test's tools, counting the calls of each.
type tools struct {
	mu    sync.Mutex
	calls map[string][]json.RawMessage
}

func (ts *tools) record(tool string, body json.RawMessage) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.calls[tool] = append(ts.calls[tool], body)
	return len(ts.calls[tool])
}

func (ts *tools) count(tool string) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.calls[tool])
}

func (ts *tools) module() sdk.Module {
	return sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.Serve("t.ok", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
				return map[string]int{"invoice": ts.record("t.ok", r.Body)}, nil
			})),
			m.Serve("t.reject", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
				ts.record("t.reject", r.Body)
				return nil, &sdk.ToolError{Code: "no_customer", Message: "order has no customer", Permanent: true}
			})),
			m.Serve("t.flaky", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
				if ts.record("t.flaky", r.Body) <= 2 {
					return nil, &sdk.ToolError{Code: "overloaded", Message: "busy"}
				}
				return "done", nil
			})),
			m.Serve("t.slow", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
				ts.record("t.slow", r.Body)
				<-ctx.Done()
				return nil, ctx.Err()
			})),
		)
	}}
}

// TestOutcomes: one trigger per row of the outcome table, each on a queue
// of its own; the broker's state afterwards (acknowledged, dead-lettered
// with the reason) and the firing record say what happened.
func TestOutcomes(t *testing.T) {
	w := newWorld(t)
	ts := &tools{calls: map[string][]json.RawMessage{}}
	w.load(t, ts.module(), runtime.ModuleConfig{})
	rows := []struct {
		trigger, tool string
		timeout       time.Duration
		headers       amqp.Table
		calls         int    // tool calls made
		outcomes      string // recorded, in order
		dead          string // the dead letter's error, or "" for acknowledged
	}{
		{"ok", "t.ok", 0, nil, 1, "ok", ""},
		{"reject", "t.reject", 0, nil, 1, "rejected", "tool t.reject rejected it (no_customer): order has no customer"},
		{"flaky", "t.flaky", 0, nil, 3, "failed failed ok", ""},
		{"slow", "t.slow", 100 * time.Millisecond, nil, 3, "failed failed failed", "tool t.slow: "},
		{"noserver", "t.nobody", 0, nil, 0, "failed failed failed", "tool t.nobody: "},
		// The node dead-letters it before the dispatcher sees it: no firing.
		{"expired", "t.ok", 0, amqp.Table{"x-deadline": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)}, 0, "", "its deadline"},
	}
	var triggers []dispatcher.Trigger
	for _, r := range rows {
		w.queue(t, "q."+r.trigger)
		triggers = append(triggers, dispatcher.Trigger{Name: r.trigger, Queue: "q." + r.trigger, Tool: r.tool, Timeout: dispatcher.Duration(r.timeout)})
	}
	d, fired := openDispatcher(t, triggers...)
	w.load(t, d.Module(), runtime.ModuleConfig{MaxAttempts: 3})
	okBefore := 0
	for _, r := range rows {
		w.publish(t, "q."+r.trigger, "msg-"+r.trigger, []byte(`{"order":7}`), r.headers)
		if r.dead != "" {
			dl := w.nextDead(t)
			wantReason := map[string]string{"reject": "permanent", "expired": "expired"}[r.trigger]
			if wantReason == "" {
				wantReason = "delivery_limit"
			}
			if dl.Headers["x-mesh-dead-reason"] != wantReason {
				t.Errorf("%s: dead-letter reason %v, want %s", r.trigger, dl.Headers["x-mesh-dead-reason"], wantReason)
			}
			if dl.MessageId != "msg-"+r.trigger || dl.Headers["x-mesh-dead-queue"] != "q."+r.trigger ||
				!strings.HasPrefix(strings.TrimPrefix(fmt.Sprint(dl.Headers["x-mesh-dead-error"]), "permanent: "), r.dead) {
				t.Errorf("%s: dead letter %s from %v: %v", r.trigger, dl.MessageId, dl.Headers["x-mesh-dead-queue"], dl.Headers["x-mesh-dead-error"])
			}
		}
		// Rows go one at a time: these firings are this row's. (A row
		// without one ends with its dead letter, which comes after.)
		fired.wait(t, w.ctx, len(strings.Fields(r.outcomes)))
		var got []string
		for _, f := range w.fires(t, r.trigger) {
			got = append(got, f.Outcome)
		}
		if strings.Join(got, " ") != r.outcomes {
			t.Errorf("%s: recorded %v, want %s", r.trigger, got, r.outcomes)
		}
		if n := w.depth(t, "q."+r.trigger); n != 0 {
			t.Errorf("%s: %d messages left in the queue", r.trigger, n)
		}
		calls := ts.count(r.tool)
		if r.tool == "t.ok" {
			calls -= okBefore
			okBefore += calls
		}
		if calls != r.calls {
			t.Errorf("%s: the tool was called %d times, want %d", r.trigger, calls, r.calls)
		}
	}
	var req struct {
		Message map[string]int
		Meta    dispatcher.Meta
	}
	if err := json.Unmarshal(ts.calls["t.ok"][0], &req); err != nil || req.Message["order"] != 7 ||
		req.Meta != (dispatcher.Meta{MessageID: "msg-ok", RoutingKey: "q.ok", Queue: "q.ok", Trigger: "ok", Attempt: 1}) {
		t.Errorf("the tool got %s (%v)", ts.calls["t.ok"][0], err)
	}
}

// TestRequestAndRepeats: a body that is not JSON arrives base64-encoded
// beside the trigger's inputs; a message handled already is not handed
// to the tool again; the same id with another body is a conflict.
func TestRequestAndRepeats(t *testing.T) {
	w := newWorld(t)
	ts := &tools{calls: map[string][]json.RawMessage{}}
	w.load(t, ts.module(), runtime.ModuleConfig{})
	w.queue(t, "legacy.orders")
	d, _ := openDispatcher(t, dispatcher.Trigger{Name: "orders", Queue: "legacy.orders", Tool: "t.ok",
		Inputs: map[string]json.RawMessage{"currency": json.RawMessage(`"EUR"`)}})
	w.load(t, d.Module(), runtime.ModuleConfig{})
	w.publish(t, "legacy.orders", "o-1", []byte("ORDER;7;not json"), nil)
	w.publish(t, "legacy.orders", "o-1", []byte("ORDER;7;not json"), nil) // a resend
	w.publish(t, "legacy.orders", "o-1", []byte("ORDER;8;changed"), nil)  // the same id, another body
	dl := w.nextDead(t)
	if !strings.Contains(fmt.Sprint(dl.Headers["x-mesh-dead-error"]), "conflict") || string(dl.Body) != "ORDER;8;changed" {
		t.Errorf("dead letter %q: %v", dl.Body, dl.Headers["x-mesh-dead-error"])
	}
	var got []string
	for _, f := range w.fires(t, "orders") {
		got = append(got, f.Outcome)
	}
	if strings.Join(got, " ") != "ok repeated conflict" || ts.count("t.ok") != 1 {
		t.Errorf("recorded %v with %d calls, want ok repeated conflict with 1", got, ts.count("t.ok"))
	}
	var req struct {
		Currency string
		Message  struct {
			RawBodyB64 string `json:"raw_body_b64"`
		}
	}
	if err := json.Unmarshal(ts.calls["t.ok"][0], &req); err != nil || req.Currency != "EUR" {
		t.Fatalf("request %s: %v", ts.calls["t.ok"][0], err)
	}
	if b, _ := base64.StdEncoding.DecodeString(req.Message.RawBodyB64); string(b) != "ORDER;7;not json" {
		t.Errorf("raw body %q", b)
	}
}

// TestMaxConcurrentRuns: 16 messages queued, a limit of 4: the tool, which
// counts its calls at once and holds them until four are in, never sees
// more than four.
func TestMaxConcurrentRuns(t *testing.T) {
	w := newWorld(t)
	var in, most atomic.Int32
	four := make(chan struct{})
	var once sync.Once
	w.load(t, sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return m.Serve("t.hold", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
			n := in.Add(1)
			defer in.Add(-1)
			for { // record the most at once
				if old := most.Load(); n <= old || most.CompareAndSwap(old, n) {
					break
				}
			}
			if n >= 4 {
				once.Do(func() { close(four) })
			}
			select {
			case <-four:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return "ok", nil
		}))
	}}, runtime.ModuleConfig{Prefetch: 64})
	w.queue(t, "work")
	for i := range 16 {
		w.publish(t, "work", fmt.Sprint("w-", i), []byte(fmt.Sprint(i)), nil)
	}
	d, fired := openDispatcher(t, dispatcher.Trigger{Name: "work", Queue: "work", Tool: "t.hold", MaxConcurrentRuns: 4})
	w.load(t, d.Module(), runtime.ModuleConfig{})
	fired.wait(t, w.ctx, 16)
	if m := most.Load(); m != 4 {
		t.Errorf("the tool saw %d calls at once, want 4 (the limit, reached)", m)
	}
}

// TestBadTarget: a trigger whose tool key the mesh refuses stops the
// module's start, naming the key: nothing is consumed, so nothing is
// requeued without end or acknowledged unseen.
func TestBadTarget(t *testing.T) {
	w := newWorld(t)
	w.queue(t, "q.bad")
	d, _ := openDispatcher(t, dispatcher.Trigger{Name: "bad", Queue: "q.bad", Tool: "t..bad"})
	if _, err := w.node.Load(w.ctx, d.Module(), runtime.ModuleConfig{}); err == nil || !strings.Contains(err.Error(), "t..bad") {
		t.Errorf("load with a bad tool key: %v", err)
	}
}

// TestMissingQueue: a trigger on a queue that is not there fails the
// module's start, naming the queue, which is not declared.
func TestMissingQueue(t *testing.T) {
	w := newWorld(t)
	d, _ := openDispatcher(t, dispatcher.Trigger{Name: "gone", Queue: "legacy.gone", Tool: "t.ok"})
	if _, err := w.node.Load(w.ctx, d.Module(), runtime.ModuleConfig{}); err == nil || !strings.Contains(err.Error(), "legacy.gone") {
		t.Errorf("load with a missing queue: %v", err)
	}
	if _, err := w.ch.QueueDeclarePassive("legacy.gone", true, false, false, false, nil); err == nil {
		t.Error("the dispatcher declared the missing queue")
	}
}

// TestConfig: what a config gets wrong is named.
func TestConfig(t *testing.T) {
	_, err := dispatcher.Open(dispatcher.Config{Triggers: []dispatcher.Trigger{
		{Name: "a", Tool: "t.x"},
		{Name: "a", Queue: "q", Pattern: "p.#", Tool: "t.x", MaxConcurrentRuns: 17},
		{Name: "b", Queue: "q", Tool: "t.x", MaxConcurrentRuns: 2, SingleActiveConsumer: true, Inputs: map[string]json.RawMessage{"meta": nil}},
	}})
	for _, want := range []string{"store", "triggers[0]: set exactly one", "triggers[1].name", "triggers[1]: set exactly one",
		"triggers[1].max_concurrent_runs", "triggers[2].single_active_consumer", "triggers[2].inputs", "triggers[0].tool"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			if want != "triggers[0].tool" {
				t.Errorf("error does not name %s: %v", want, err)
			}
		}
	}
}

// consumers is the number of consumers the broker counts on queue.
func (w *world) consumers(t *testing.T, queue string) int {
	t.Helper()
	q, err := w.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Consumers
}

// TestPauseResume: a paused trigger stops consuming (the broker counts no
// consumer) and its queue keeps what arrives; it stays paused when the
// module starts again; resumed, it fires what waited. A pattern trigger
// cannot be paused alone.
func TestPauseResume(t *testing.T) {
	w := newWorld(t)
	ts := &tools{calls: map[string][]json.RawMessage{}}
	w.load(t, ts.module(), runtime.ModuleConfig{})
	w.queue(t, "legacy.orders")
	store := filepath.Join(t.TempDir(), "fires.db")
	fired := make(firings, 100)
	cfg := dispatcher.Config{Store: store, Triggers: []dispatcher.Trigger{
		{Name: "orders", Queue: "legacy.orders", Tool: "t.ok"},
		{Name: "events", Pattern: "mesh.order.#", Tool: "t.ok"},
	}, OnFire: func(x dispatcher.Fire) { fired <- x }}
	start := func() *runtime.Module {
		d, err := dispatcher.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		m, err := w.node.Load(w.ctx, d.Module(), runtime.ModuleConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := start()
	call := func(tool, trigger string) (dispatcher.PauseResponse, error) {
		var r dispatcher.PauseResponse
		err := w.node.Call(w.ctx, "meshctl", tool, dispatcher.PauseRequest{Trigger: trigger}, &r)
		return r, err
	}
	triggers := func() map[string]dispatcher.TriggerState {
		var r dispatcher.TriggersResponse
		if err := w.node.Call(w.ctx, "meshctl", dispatcher.ToolTriggers, nil, &r); err != nil {
			t.Fatal(err)
		}
		out := map[string]dispatcher.TriggerState{}
		for _, s := range r.Triggers {
			out[s.Name] = s
		}
		return out
	}
	if s := triggers(); len(s) != 2 || s["orders"].Paused || !s["orders"].CanPause || s["events"].CanPause || s["orders"].Queue != "legacy.orders" {
		t.Fatalf("triggers before the pause: %+v", s)
	}
	if r, err := call(dispatcher.ToolPause, "orders"); err != nil || !r.Paused {
		t.Fatalf("pause: %+v, %v", r, err)
	}
	if s := triggers(); !s["orders"].Paused || s["events"].Paused {
		t.Fatalf("triggers after the pause: %+v", s)
	}
	if c := w.consumers(t, "legacy.orders"); c != 0 {
		t.Fatalf("a paused trigger's queue has %d consumers", c)
	}
	for i := range 3 {
		w.publish(t, "legacy.orders", fmt.Sprint("p-", i), []byte(`{}`), nil)
	}
	if err := m.Stop(w.ctx); err != nil {
		t.Fatal(err)
	}
	m = start() // a restart: still paused
	t.Cleanup(func() { m.Stop(context.Background()) })
	if c, n := w.consumers(t, "legacy.orders"), w.depth(t, "legacy.orders"); c != 0 || n != 3 {
		t.Fatalf("after a restart: %d consumers, %d messages; want 0 and 3", c, n)
	}
	if r, err := call(dispatcher.ToolResume, "orders"); err != nil || r.Paused {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if s := triggers(); s["orders"].Paused {
		t.Fatalf("triggers after the resume: %+v", s)
	}
	fired.wait(t, w.ctx, 3)
	if n := len(w.fires(t, "orders")); n != 3 {
		t.Errorf("%d firings recorded after the resume, want 3", n)
	}
	var te *sdk.ToolError
	if _, err := call(dispatcher.ToolPause, "events"); !errors.As(err, &te) || te.Code != "bad_request" {
		t.Errorf("pausing a pattern trigger: %v", err)
	}
	if _, err := call(dispatcher.ToolPause, "nope"); !errors.As(err, &te) || te.Code != "not_found" {
		t.Errorf("pausing an unknown trigger: %v", err)
	}
}

// TestSingleActiveConsumer: two dispatchers on two nodes take one queue
// with single_active_consumer: the first fires every message, in order;
// the second stands by and takes over when the first stops.
func TestSingleActiveConsumer(t *testing.T) {
	w := newWorld(t)
	w.load(t, sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return m.Serve("t.log", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return "ok", nil }))
	}}, runtime.ModuleConfig{})
	w.queue(t, "ordered")
	trigger := dispatcher.Trigger{Name: "ordered", Queue: "ordered", Tool: "t.log", SingleActiveConsumer: true}
	first, firstFired := openDispatcher(t, trigger)
	a, err := w.node.Load(w.ctx, first.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// The first message fired by the first dispatcher says it has the
	// queue, before the second one comes.
	w.publish(t, "ordered", "o-0", []byte(`{}`), nil)
	firstFired.wait(t, w.ctx, 1)
	harbor, err := runtime.New(w.ctx, runtime.Config{Node: "harbor", AMQPURL: w.url, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { harbor.Close(context.Background()) })
	second, secondFired := openDispatcher(t, trigger)
	b, err := harbor.Load(w.ctx, second.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Stop(context.Background()) })
	for i := 1; i < 10; i++ {
		w.publish(t, "ordered", fmt.Sprint("o-", i), []byte(`{}`), nil)
	}
	for i, f := range firstFired.wait(t, w.ctx, 9) {
		if f.MessageID != fmt.Sprint("o-", i+1) {
			t.Errorf("firing %d is %s: not in queue order", i+1, f.MessageID)
		}
	}
	if err := a.Stop(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.publish(t, "ordered", "o-10", []byte(`{}`), nil)
	if f := secondFired.wait(t, w.ctx, 1)[0]; f.MessageID != "o-10" {
		t.Errorf("the dispatcher that took over fired %s, want o-10", f.MessageID)
	}
	if len(secondFired) != 0 {
		t.Errorf("the standing-by dispatcher fired before it took over")
	}
	if c := w.consumers(t, "ordered"); c != 1 {
		t.Errorf("%d consumers after the takeover, want 1", c)
	}
}
