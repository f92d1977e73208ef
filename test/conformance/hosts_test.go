package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk/meshtest"
	"github.com/meshkit/mesh/test/conformance"
)

// The node rules every host runs by, small enough for tests to be quick.
const (
	maxAttempts    = 3
	handlerTimeout = 5 * time.Second
	callTimeout    = 1500 * time.Millisecond
	retryMin       = 20 * time.Millisecond
	retryMax       = 80 * time.Millisecond
)

// ModuleConfig is how a scenario asks a host to run a module.
type ModuleConfig struct {
	Concurrency     int
	MaxAttempts     int
	HandlerTimeout  time.Duration
	AllowDuplicates bool
	ToolGrants      []string // nil: no limit
	CallGrants      []string // nil: no limit
	// SkipBodyValidation keeps x-schema but validates no emitted body
	// (skip_body_validation).
	SkipBodyValidation bool
}

// Dead is a dead letter as a scenario sees it.
type Dead struct {
	ID, Type, Queue, Reason, Err string
	Attempts                     int
}

// Host runs conformance modules. Each scenario gets a new Host.
type Host interface {
	// Load runs the named conformance module; its records go to the
	// returned log.
	Load(t *testing.T, name string, mc ModuleConfig) *Log
	// Emit publishes an event from outside the modules; it returns the
	// id.
	Emit(t *testing.T, eventType string, body any) string
	// EmitTraced is Emit in a new trace, whose id it returns too.
	EmitTraced(t *testing.T, eventType string, body any) (id, traceID string)
	// CallTraced is Call in a new trace, whose id it returns.
	CallTraced(t *testing.T, tool string, req any) string
	// Logs is what the host (the node, the test mesh) logged so far, as
	// text lines.
	Logs() string
	// WaitLogs waits, up to d, until what the host logged satisfies cond
	// (a module process's lines reach the host on their own pipe, after
	// what the module recorded), and returns it.
	WaitLogs(d time.Duration, cond func(string) bool) (string, bool)
	// Failed waits until the host shows the named module's Run failed,
	// and returns what it shows: meshtest's WaitRun error; in-process,
	// the node's readiness; for a module process, the log line of the
	// failure once the process was started again.
	Failed(t *testing.T, name string) string
	// Redeliver publishes again a copy of the event with that id, type
	// and body, as a broker does after a lost ack.
	Redeliver(t *testing.T, id, eventType string, body any)
	// Queue makes an existing broker queue that modules may consume, as
	// another system would (nothing to do on the test mesh).
	Queue(t *testing.T, name string)
	// Put puts a message into that queue: body as is, id as its message
	// id, with those headers.
	Put(t *testing.T, queue, id string, body []byte, headers map[string]string)
	// Call calls a tool from outside the modules.
	Call(ctx context.Context, tool string, req, resp any) error
	// Dead waits for the n-th dead letter and returns the first n.
	Dead(t *testing.T, n int) []Dead
	// Stop stops the named module.
	Stop(t *testing.T, name string)
	// Settle lets everything pending run (meshtest), or does nothing
	// (a real mesh runs by itself).
	Settle()
	// Advance lets d pass: meshtest's clock moves by d (what comes due
	// runs at the next Settle); a real mesh's time passes by itself.
	Advance(d time.Duration)
	// Clocked says whether time passes only by Advance (meshtest).
	Clocked() bool
	// Previous says whether the host runs the previous release's module
	// binary, which has only the modules of that release.
	Previous() bool
}

// Log reads what one module recorded.
type Log struct {
	host Host
	path string
}

// Records returns every record so far.
func (l *Log) Records(t *testing.T) []conformance.Record {
	t.Helper()
	f, err := os.Open(l.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []conformance.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r conformance.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue // a line being written
		}
		out = append(out, r)
	}
	return out
}

// Of returns the records of kind.
func (l *Log) Of(t *testing.T, kind string) []conformance.Record {
	t.Helper()
	var out []conformance.Record
	for _, r := range l.Records(t) {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// Wait waits until cond holds on the records, and returns them.
func (l *Log) Wait(t *testing.T, what string, cond func([]conformance.Record) bool) []conformance.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l.host.Settle()
		rs := l.Records(t)
		if cond(rs) {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s; the module recorded %+v", what, rs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitKind waits for n records of kind and returns them.
func (l *Log) WaitKind(t *testing.T, kind string, n int) []conformance.Record {
	t.Helper()
	l.Wait(t, fmt.Sprintf("%d %q records", n, kind), func(rs []conformance.Record) bool {
		c := 0
		for _, r := range rs {
			if r.Kind == kind {
				c++
			}
		}
		return c >= n
	})
	return l.Of(t, kind)
}

// ---- meshtest ----

type memHost struct {
	mesh *meshtest.Mesh
	dir  string
	logs *logBuffer
}

func newMemHost(t *testing.T) Host {
	dir := t.TempDir() // removed after the mesh closes (cleanups run last first)
	logs := &logBuffer{}
	m := meshtest.New(meshtest.Config{Node: "conf", MaxAttempts: maxAttempts, HandlerTimeout: handlerTimeout,
		RetryMin: retryMin, RetryMax: retryMax, CallTimeout: callTimeout, Logger: logs.logger()})
	t.Cleanup(m.Close)
	return &memHost{mesh: m, dir: dir, logs: logs}
}

func (h *memHost) Logs() string { return h.logs.String() }

func (h *memHost) WaitLogs(d time.Duration, cond func(string) bool) (string, bool) {
	return h.logs.waitFor(d, cond)
}

func (h *memHost) Failed(t *testing.T, name string) string {
	t.Helper()
	h.mesh.Settle() // what the module was sent runs
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := h.mesh.WaitRun(ctx, name)
	if err == nil {
		t.Fatalf("%s's Run returned nil", name)
	}
	return err.Error()
}

func (h *memHost) EmitTraced(t *testing.T, eventType string, body any) (string, string) {
	t.Helper()
	ctx, tid := traced()
	id, err := h.mesh.Emit(ctx, "conformance", eventType, body)
	if err != nil {
		t.Fatalf("emit %s: %v", eventType, err)
	}
	return id, tid
}

func (h *memHost) CallTraced(t *testing.T, tool string, req any) string {
	t.Helper()
	ctx, tid := traced()
	if err := h.mesh.Call(ctx, "conformance", tool, req, nil); err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return tid
}

// traced is a context in a new trace (a remote span of it), and the
// trace's id.
func traced() (context.Context, string) {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), tid.String()
}

// logBuffer keeps what a host logs, as text lines.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // closed (and replaced) at each write
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

// waitFor waits, at most d, until what was logged satisfies cond, and
// returns it; it looks again at each write.
func (b *logBuffer) waitFor(d time.Duration, cond func(string) bool) (string, bool) {
	timeout := time.After(d)
	for {
		b.mu.Lock()
		logs := b.buf.String()
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		if cond(logs) {
			return logs, true
		}
		select {
		case <-written:
		case <-timeout:
			return logs, false
		}
	}
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	var w io.Writer = b
	if os.Getenv("MESH_TEST_LOG") != "" {
		w = io.MultiWriter(b, os.Stderr)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (h *memHost) Load(t *testing.T, name string, mc ModuleConfig) *Log {
	t.Helper()
	path := filepath.Join(h.dir, name+".log")
	def, err := conformance.Module(name, conformance.NewProbe(path))
	if err != nil {
		t.Fatal(err)
	}
	cfg := meshtest.ModuleConfig{Concurrency: mc.Concurrency, MaxAttempts: mc.MaxAttempts, HandlerTimeout: mc.HandlerTimeout,
		AllowDuplicates: mc.AllowDuplicates, ToolGrants: mc.ToolGrants, SkipBodyValidation: mc.SkipBodyValidation}
	if mc.CallGrants != nil { // held to a node entry's grants: what the scenario leaves open, all
		tools := mc.ToolGrants
		if tools == nil {
			tools = []string{"#"}
		}
		cfg.Grants = &meshtest.Grants{Tools: tools, Calls: mc.CallGrants, Consumes: []string{"#"}, DeadLetters: []string{"#"}, History: true}
	}
	if err := h.mesh.Load(def, cfg); err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return &Log{host: h, path: path}
}

func (h *memHost) Emit(t *testing.T, eventType string, body any) string {
	t.Helper()
	id, err := h.mesh.Emit(context.Background(), "conformance", eventType, body)
	if err != nil {
		t.Fatalf("emit %s: %v", eventType, err)
	}
	return id
}

func (h *memHost) Queue(*testing.T, string) {}

func (h *memHost) Put(t *testing.T, queue, id string, body []byte, headers map[string]string) {
	t.Helper()
	if err := h.mesh.Put(queue, id, "", body, headers); err != nil {
		t.Fatal(err)
	}
}

func (h *memHost) Redeliver(t *testing.T, id, _ string, body any) {
	t.Helper()
	if err := h.mesh.RedeliverWith(id, body); err != nil {
		t.Fatal(err)
	}
}

func (h *memHost) Call(ctx context.Context, tool string, req, resp any) error {
	return h.mesh.Call(ctx, "conformance", tool, req, resp)
}

func (h *memHost) Dead(t *testing.T, n int) []Dead {
	t.Helper()
	h.mesh.Settle()
	dl := h.mesh.DeadLetters()
	if len(dl) < n {
		t.Fatalf("%d dead letters, want %d: %+v", len(dl), n, dl)
	}
	out := make([]Dead, n)
	for i, d := range dl[:n] {
		out[i] = Dead{ID: d.Event.ID, Type: d.Event.Type, Queue: d.Queue, Reason: d.Reason, Err: d.Err, Attempts: d.Attempts}
	}
	return out
}

func (h *memHost) Stop(t *testing.T, name string) { h.mesh.Close() }

func (h *memHost) Settle() { h.mesh.Settle() }

func (h *memHost) Advance(d time.Duration) {
	h.mesh.Settle()
	h.mesh.Advance(d)
}

func (h *memHost) Clocked() bool { return true }

func (h *memHost) Previous() bool { return false }

// ---- the runtime on RabbitMQ, in-process or as module processes ----

type brokerHost struct {
	node    *runtime.Node
	url     string
	dir     string
	process string // the module binary; "" runs modules in-process
	// previous: process is the previous release's module binary.
	previous bool

	mu      sync.Mutex
	stops   map[string]func(context.Context) error
	logs    *logBuffer
	deadCh  *amqp.Channel
	deadQ   <-chan amqp.Delivery
	dead    []Dead
	rawConn *amqp.Connection
}

func newBrokerHost(t *testing.T, process string, delays bool) Host {
	url := brokertest.VHost(t)
	dir := t.TempDir()
	logs := &logBuffer{}
	cfg := runtime.Config{Node: "conf", AMQPURL: url, StateDir: t.TempDir(), RetryMin: retryMin, RetryMax: retryMax,
		CallTimeout: callTimeout, Logger: logs.logger(), Delays: delays,
		Module: runtime.ModuleConfig{MaxAttempts: maxAttempts, HandlerTimeout: handlerTimeout}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, cfg)
	if err != nil {
		t.Fatalf("new node: %v", err)
	}
	h := &brokerHost{node: n, url: url, dir: dir, process: process, stops: map[string]func(context.Context) error{}, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		h.mu.Lock()
		stops := h.stops
		h.stops = nil
		h.mu.Unlock()
		for _, stop := range stops {
			_ = stop(ctx)
		}
		if err := n.Close(ctx); err != nil {
			t.Errorf("close node: %v", err)
		}
		if h.rawConn != nil {
			h.rawConn.Close()
		}
	})
	return h
}

func (h *brokerHost) Load(t *testing.T, name string, mc ModuleConfig) *Log {
	t.Helper()
	path := filepath.Join(h.dir, name+".log")
	rc := runtime.ModuleConfig{Concurrency: mc.Concurrency, MaxAttempts: mc.MaxAttempts, HandlerTimeout: mc.HandlerTimeout, AllowDuplicates: mc.AllowDuplicates,
		ToolGrants: mc.ToolGrants, CallGrants: mc.CallGrants, SkipBodyValidation: mc.SkipBodyValidation}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stop func(context.Context) error
	if h.process != "" {
		pm, err := h.node.LoadPlugin(ctx, h.process, []string{name, path}, rc)
		if err != nil {
			t.Fatalf("load %s as a module process: %v", name, err)
		}
		stop = pm.Stop
	} else {
		def, err := conformance.Module(name, conformance.NewProbe(path))
		if err != nil {
			t.Fatal(err)
		}
		m, err := h.node.Load(ctx, def, rc)
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		stop = m.Stop
	}
	h.mu.Lock()
	h.stops[name] = stop
	h.mu.Unlock()
	return &Log{host: h, path: path}
}

func (h *brokerHost) Emit(t *testing.T, eventType string, body any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	id, err := h.node.Emit(ctx, "conformance", eventType, body)
	if err != nil {
		t.Fatalf("emit %s: %v", eventType, err)
	}
	return id
}

func (h *brokerHost) Logs() string { return h.logs.String() }

func (h *brokerHost) WaitLogs(d time.Duration, cond func(string) bool) (string, bool) {
	return h.logs.waitFor(d, cond)
}

func (h *brokerHost) Failed(t *testing.T, name string) string {
	t.Helper()
	// Logged in this order: the failure, then (in-process) the stop, after
	// which the node's readiness has it, or (a module process) the restart.
	then := "module process restarted"
	if h.process == "" {
		then = "module stopped"
	}
	logs, ok := h.logs.waitFor(20*time.Second, func(logs string) bool {
		i := strings.Index(logs, "module run failed")
		return i >= 0 && strings.Contains(logs[i:], then)
	})
	if !ok {
		t.Fatalf("the host did not show that %s's Run failed; its log:\n%s", name, logs)
	}
	if h.process == "" {
		if err := h.node.Ready(); err != nil {
			return err.Error()
		}
		t.Fatalf("the node is ready after %s's Run failed", name)
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "module run failed") {
			return l
		}
	}
	return ""
}

func (h *brokerHost) EmitTraced(t *testing.T, eventType string, body any) (string, string) {
	t.Helper()
	ctx, tid := traced()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	id, err := h.node.Emit(ctx, "conformance", eventType, body)
	if err != nil {
		t.Fatalf("emit %s: %v", eventType, err)
	}
	return id, tid
}

func (h *brokerHost) CallTraced(t *testing.T, tool string, req any) string {
	t.Helper()
	ctx, tid := traced() // no deadline: the node's call timeout
	if err := h.node.Call(ctx, "conformance", tool, req, nil); err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return tid
}

// raw is a plain amqp091-go channel on the host's virtual host.
func (h *brokerHost) raw(t *testing.T) *amqp.Channel {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rawConn == nil {
		c, err := amqp.Dial(h.url)
		if err != nil {
			t.Fatal(err)
		}
		h.rawConn = c
	}
	ch, err := h.rawConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func (h *brokerHost) Queue(t *testing.T, name string) {
	t.Helper()
	if _, err := h.raw(t).QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func (h *brokerHost) Put(t *testing.T, queue, id string, body []byte, headers map[string]string) {
	t.Helper()
	table := amqp.Table{}
	for k, v := range headers {
		table[k] = v
	}
	if err := h.raw(t).Publish("", queue, false, false, amqp.Publishing{MessageId: id, Headers: table, Body: body, DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
}

func (h *brokerHost) Redeliver(t *testing.T, id, eventType string, body any) {
	t.Helper()
	ch := h.raw(t)
	defer ch.Close()
	raw, _ := json.Marshal(body)
	err := ch.PublishWithContext(context.Background(), wire.ExchangeEvents, eventType, false, false, amqp.Publishing{
		Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "conformance", wire.HeaderNode: "conf",
			wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)},
		ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, Body: raw,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (h *brokerHost) Call(ctx context.Context, tool string, req, resp any) error {
	return h.node.Call(ctx, "conformance", tool, req, resp)
}

// Dead reads the dead-letter queue with raw amqp091-go: what the wire
// says, not what the runtime reports.
func (h *brokerHost) Dead(t *testing.T, n int) []Dead {
	t.Helper()
	if h.deadQ == nil {
		h.deadCh = h.raw(t)
		q, err := h.deadCh.Consume(wire.QueueDead, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.deadQ = q
	}
	timeout := time.After(30 * time.Second)
	for len(h.dead) < n {
		select {
		case d := <-h.deadQ:
			attempts, _ := d.Headers[wire.HeaderDeadAttempts].(int64)
			str := func(k string) string { s, _ := d.Headers[k].(string); return s }
			id := str(wire.HeaderEventID)
			if id == "" {
				id = d.MessageId // a message of a consumed queue, not an event
			}
			h.dead = append(h.dead, Dead{ID: id, Type: d.RoutingKey, Queue: str(wire.HeaderDeadQueue),
				Reason: str(wire.HeaderDeadReason), Err: str(wire.HeaderDeadError), Attempts: int(attempts)})
		case <-timeout:
			t.Fatalf("waited 30s for dead letter %d; got %+v", n, h.dead)
		}
	}
	return h.dead[:n]
}

func (h *brokerHost) Stop(t *testing.T, name string) {
	t.Helper()
	h.mu.Lock()
	stop := h.stops[name]
	delete(h.stops, name)
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		t.Errorf("stop %s: %v", name, err)
	}
}

func (h *brokerHost) Settle() {}

func (h *brokerHost) Advance(time.Duration) {}

func (h *brokerHost) Clocked() bool { return false }

func (h *brokerHost) Previous() bool { return h.previous }

// buildModule builds the conformance module binary once per test run.
var buildModule = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "mesh-conformance-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "module")
	out, err := exec.Command("go", "build", "-o", bin, "./module").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build the conformance module: %v\n%s", err, out)
	}
	return bin, nil
})
