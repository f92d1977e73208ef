package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestEmitAndTail runs the meshctl binary's `tail --json` and `emit`
// against the real broker: tail prints the emitted event, with its headers
// and body, as one JSON object per line. (Separate processes: urfave/cli
// keeps global flag state that two apps in one process would race on.)
func TestEmitAndTail(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel) // after the cleanup below, which stops tail with SIGTERM
	// Both take a list of the broker's addresses whose first does not
	// answer: tail from the environment, emit from the flag.
	deadURL := strings.Replace(url, brokertest.Host(), "127.0.0.1:1", 1)
	tail := exec.CommandContext(ctx, bin, "tail", "--json", "mesh.ops.#")
	tail.Env = append(os.Environ(), "MESH_AMQP_URLS="+deadURL+","+url)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var tailErr bytes.Buffer
	tail.Stderr = &tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tail.Process.Signal(syscall.SIGTERM)
		if err := tail.Wait(); err != nil {
			t.Errorf("tail exited with %v: %s", err, tailErr.String())
		}
	})
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	// Emit until tail has bound its queue and prints the event.
	var line string
	for line == "" {
		out, err := exec.CommandContext(ctx, bin, "--amqp-urls", deadURL, "--amqp-urls", url, "--node", "ops-laptop", "emit", "--schema", "2",
			"mesh.ops.restarted", `{"service":"db"}`).Output()
		if err != nil {
			t.Fatalf("emit: %v", err)
		}
		id := strings.TrimSpace(string(out))
		if _, err := ulid.ParseStrict(id); err != nil {
			t.Fatalf("emit printed %q, not an id", id)
		}
		select {
		case line = <-lines:
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("tail printed nothing: %s", tailErr.String())
		}
	}
	var got struct {
		ID, Type, Source, Node, Schema string
		Headers                        map[string]string
		Body                           json.RawMessage
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("tail line %q: %v", line, err)
	}
	if got.Type != "mesh.ops.restarted" || got.Source != "meshctl" || got.Node != "ops-laptop" || got.Schema != "2" {
		t.Errorf("tail printed %+v", got)
	}
	if got.Headers["x-event-id"] != got.ID || got.Headers["x-source"] != "meshctl" {
		t.Errorf("headers %v", got.Headers)
	}
	if string(got.Body) != `{"service":"db"}` {
		t.Errorf("body %s", got.Body)
	}
}

func TestEmitRefusesBadInput(t *testing.T) {
	url := brokertest.VHost(t)
	for _, args := range [][]string{
		{"emit", "mesh.ops", "{}"},
		{"emit", "mesh.ops.x", "not json"},
		{"emit", "mesh.ops.x"},
		{"tail", "a..b"},
		{"call", "nobody.serves", "{}"},
		{"call", "bad tool", "{}"},
	} {
		a := app()
		a.Writer = io.Discard
		if err := a.Run(append([]string{"meshctl", "--amqp-url", url}, args...)); err == nil {
			t.Errorf("meshctl %v succeeded", args)
		}
	}
}

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "meshctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestCall runs `meshctl call` against a tool served in-process: it prints
// the response, or the tool's error and exits 1.
func TestCall(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	_, err = node.Load(ctx, sdk.Module{Name: "greeter", Setup: func(m sdk.Mesh) error {
		return m.Serve("greet.hello", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			var in struct{ Name string }
			if err := req.Decode(&in); err != nil || in.Name == "" {
				return nil, &sdk.ToolError{Code: "bad_name", Message: "say who", Permanent: true}
			}
			return map[string]string{"greeting": "hello " + in.Name, "caller": req.Caller}, nil
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "call", "--timeout", "10s", "greet.hello", `{"name":"ops"}`).Output()
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != `{"caller":"meshctl","greeting":"hello ops"}` {
		t.Errorf("call printed %s", got)
	}
	cmd := exec.CommandContext(ctx, bin, "--amqp-url", url, "call", "greet.hello", `{}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "bad_name") || !strings.Contains(stderr.String(), "say who") {
		t.Errorf("failing call: %v, stderr %q", err, stderr.String())
	}
}

// TestTailSurvivesACut: `meshctl tail` whose connection is cut connects
// again, says on stderr which span it could not see, and prints the events
// emitted after it resumed; it exits 0 on SIGTERM.
func TestTailSurvivesACut(t *testing.T) {
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tail := exec.CommandContext(ctx, bin, "--amqp-url", strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "tail", "--json", "mesh.ops.#")
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := tail.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	defer tail.Process.Kill()
	scan := func(r io.Reader) <-chan string {
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		return lines
	}
	events, notes := scan(stdout), scan(stderr)
	await := func(lines <-chan string, what string) string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("tail ended before %q", what)
				}
				if strings.Contains(l, what) {
					return l
				}
			case <-ctx.Done():
				t.Fatalf("tail never printed %q", what)
			}
		}
	}
	emitter, err := runtime.New(ctx, runtime.Config{Node: "ops", AMQPURL: url, Ephemeral: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer emitter.Close(context.Background())

	await(notes, "tail: following mesh.ops.#")
	before, err := emitter.Emit(ctx, "test", "mesh.ops.before", 1)
	if err != nil {
		t.Fatal(err)
	}
	await(events, before)
	proxy.Cut()
	await(notes, "tail: connection lost")
	gap := await(notes, "tail: resumed")
	if !strings.Contains(gap, "were not seen") {
		t.Errorf("the resume note does not name the gap: %q", gap)
	}
	after, err := emitter.Emit(ctx, "test", "mesh.ops.after", 2)
	if err != nil {
		t.Fatal(err)
	}
	await(events, after)
	if err := tail.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := tail.Wait(); err != nil {
		t.Errorf("tail exited with %v", err)
	}
}

// TestNodesAnswersAtRollCall: without --wait, `meshctl nodes` calls the
// roll and answers once every node has: two nodes whose next heartbeat is
// an hour away are both listed, and the command returns on its own long
// before its --within limit of ten minutes (the test's context would end
// first).
func TestNodesAnswersAtRollCall(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{"first", "second"} {
		n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(),
			HeartbeatInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close(context.Background())
	}
	out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "nodes", "--within", "10m").CombinedOutput()
	if err != nil {
		t.Fatalf("nodes: %v (the test's context ends before --within)\n%s", err, out)
	}
	for _, want := range []string{"first", "second"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nodes did not list %s:\n%s", want, out)
		}
	}
}

// TestNodes: `meshctl nodes` lists the nodes it hears within --wait, with
// their modules; --json prints one object per node; `meshctl graph` draws
// the same declarations.
func TestNodes(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "beating", AMQPURL: url, StateDir: t.TempDir(),
		HeartbeatInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if _, err := n.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"order.created"}, Calls: []string{"billing.charge"}}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Load(ctx, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("module.shop.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })),
			m.Serve("billing.charge", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return nil, nil })),
		)
	}}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "nodes", "--wait", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("nodes: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "NODE") || !strings.Contains(string(out), "RELEASE") || !strings.Contains(string(out), runtime.Build().Release) || !strings.Contains(string(out), "beating") ||
		!strings.Contains(string(out), "shop") || strings.Contains(string(out), "WAITING") {
		t.Errorf("nodes printed:\n%s", out)
	}
	out, err = exec.CommandContext(ctx, bin, "--amqp-url", url, "nodes", "--json", "--wait", "1s").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Node    string `json:"node"`
		Modules []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &got); err != nil || got.Node != "beating" || len(got.Modules) != 2 {
		t.Errorf("nodes --json printed %q: %v", out, err)
	}
	// The graph, from the same heartbeats.
	out, err = exec.CommandContext(ctx, bin, "--amqp-url", url, "graph", "--wait", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("graph: %v\n%s", err, out)
	}
	for _, want := range []string{
		"module_beating_shop --> event_module_shop_order_created",
		`event_module_shop_order_created -->|"module.shop.#"| module_beating_billing`,
		`module_beating_shop -->|"calls"| tool_billing_charge`,
		`tool_billing_charge -->|"serves"| module_beating_billing`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("graph lacks %q:\n%s", want, out)
		}
	}
}

// TestEmitDelayedAndAtMostOnce runs the meshctl binary's emit with --after
// --via (the node's mover delivers it when due, never before, with x-due)
// and with --at-most-once (not persistent), and refuses a delayed emit
// without --via, with --after and --at, or via a node without a due queue.
func TestEmitDelayedAndAtMostOnce(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clockNode(ctx, t, url) // its mover delivers what meshctl schedules --via clock
	tap := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.ops.#")
	emit := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "emit"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	start := time.Now()
	id, err := emit("--after", "1s", "--via", "clock", "mesh.ops.later", `{"n":1}`)
	if err != nil {
		t.Fatalf("emit --after: %v: %s", err, id)
	}
	select {
	case d := <-tap:
		if d.MessageId != id || d.RoutingKey != "mesh.ops.later" || d.Headers[wire.HeaderDue] == nil || time.Since(start) < time.Second {
			t.Errorf("delivered %q %s headers %v after %v; want %s with x-due, no sooner than 1s", d.MessageId, d.RoutingKey, d.Headers, time.Since(start), id)
		}
	case <-ctx.Done():
		t.Fatal("the delayed emit never came due")
	}
	id, err = emit("--at-most-once", "mesh.ops.lossy", `{}`)
	if err != nil {
		t.Fatalf("emit --at-most-once: %v: %s", err, id)
	}
	select {
	case d := <-tap:
		if d.MessageId != id || d.DeliveryMode != amqp.Transient {
			t.Errorf("at most once: got %q mode %d, want %s transient", d.MessageId, d.DeliveryMode, id)
		}
	case <-ctx.Done():
		t.Fatal("the emit at most once never came")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--after", "1s", "mesh.ops.x", "{}"}, "needs --via"},
		{[]string{"--after", "1s", "--at", "2030-01-01T00:00:00Z", "--via", "clock", "mesh.ops.x", "{}"}, "not both"},
		{[]string{"--via", "clock", "mesh.ops.x", "{}"}, "give --after or --at"},
		{[]string{"--after", "1s", "--via", "ghost", "mesh.ops.x", "{}"}, "no due queue"},
		{[]string{"--after", "80000h", "--via", "clock", "mesh.ops.x", "{}"}, "over the longest"},
	} {
		if out, err := emit(c.args...); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("emit %v: %v, %q; want a failure saying %q", c.args, err, out, c.want)
		}
	}
}

// TestDelayedCount: meshctl delayed count tells how many events wait in
// each delay level and what came due for a node's mover, read from the
// broker; before any node with delays on ran, it says so and fails.
func TestDelayedCount(t *testing.T) {
	url := brokertest.VHost(t)
	run := func(args ...string) (string, error) {
		return runMeshctl(url, append([]string{"delayed", "count"}, args...)...)
	}
	if out, err := run(); err == nil || !strings.Contains(err.Error(), "no node with delays on") {
		t.Errorf("count before the cascade exists: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := clockNode(ctx, t, url)
	for _, d := range []time.Duration{time.Hour, time.Hour, 3 * time.Hour} {
		if _, err := node.Emit(ctx, "test", "mesh.ops.later", 1, sdk.After(d)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := run("--due-of", "clock")
	if err != nil {
		t.Fatal(err)
	}
	// 3600 s waits first in level 11 (2048 s), 10800 s in level 13 (8192 s).
	for _, want := range []string{"waiting in the delay cascade: 3", "mesh.delay.11         2", "mesh.delay.13         1", "due for node clock, not yet delivered: 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("count lacks %q:\n%s", want, out)
		}
	}
	out, err = run("--json")
	var got struct {
		Waiting int
		Levels  []struct{ Queue string }
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.Waiting != 3 || len(got.Levels) != 2 {
		t.Errorf("count --json: %v %+v\n%s", err, got, out)
	}
	if out, err := run("--due-of", "ghost"); err == nil || !strings.Contains(err.Error(), "node ghost") {
		t.Errorf("count of a node without a due queue: %v\n%s", err, out)
	}
}

// TestDelayedLsAndCancel: meshctl delayed ls lists what a node scheduled
// and has not delivered, and delayed cancel has its mover drop one; a
// node without delays, or an id it does not hold, fails with the reason.
func TestDelayedLsAndCancel(t *testing.T) {
	url := brokertest.VHost(t)
	run := func(args ...string) (string, error) { return runMeshctl(url, append([]string{"delayed"}, args...)...) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := clockNode(ctx, t, url)
	later, err := node.Emit(ctx, "shop", "mesh.shop.reminder", 1, sdk.After(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Emit(ctx, "billing", "mesh.shop.invoice", 2, sdk.After(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// What meshctl schedules for the node is in its book too.
	fromOps, err := runMeshctl(url, "emit", "--after", "3h", "--via", "clock", "mesh.ops.later", "{}")
	fromOps = strings.TrimSpace(fromOps)
	if err != nil || strings.Contains(fromOps, "did not enter") {
		t.Fatalf("emit --after --via clock: %v: %s", err, fromOps)
	}
	out, err := run("ls", "--via", "clock")
	if err != nil || !strings.Contains(out, later) || !strings.Contains(out, "mesh.shop.invoice") || strings.Index(out, later) > strings.Index(out, "mesh.shop.invoice") ||
		!strings.Contains(out, fromOps) || strings.Index(out, fromOps) < strings.Index(out, "mesh.shop.invoice") {
		t.Errorf("ls (want %s, then the invoice, then meshctl's %s): %v\n%s", later, fromOps, err, out)
	}
	if out, err := run("cancel", "--via", "clock", fromOps); err != nil || !strings.Contains(out, "cancelled "+fromOps) {
		t.Errorf("cancel of meshctl's schedule: %v\n%s", err, out)
	}
	out, err = run("ls", "--via", "clock", "--source", "billing", "--json")
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"type":"mesh.shop.invoice"`) {
		t.Errorf("ls --source billing --json: %v\n%s", err, out)
	}
	if out, err := run("cancel", "--via", "clock", later); err != nil || !strings.Contains(out, "cancelled "+later) {
		t.Errorf("cancel: %v\n%s", err, out)
	}
	if out, err := run("ls", "--via", "clock", "--type", "mesh.shop.reminder"); err != nil || !strings.Contains(out, "cancelled") {
		t.Errorf("ls after cancel: %v\n%s", err, out)
	}
	if out, err := run("cancel", "--via", "clock", "01NOSUCHEVENT0000000000000"); err == nil || !strings.Contains(err.Error(), "holds no delayed event") {
		t.Errorf("cancel of an unknown id: %v\n%s", err, out)
	}
	if out, err := run("ls", "--via", "ghost"); err == nil || !strings.Contains(err.Error(), "runs without delays") {
		t.Errorf("ls of a node without delays: %v\n%s", err, out)
	}
}

// runMeshctl runs meshctl's app in-process against url with args, and
// returns what it printed, stdout and stderr together.
func runMeshctl(url string, args ...string) (string, error) {
	a := app()
	var out bytes.Buffer
	a.Writer, a.ErrWriter = &out, &out
	err := a.Run(append([]string{"meshctl", "--amqp-url", url}, args...))
	return out.String(), err
}

// clockNode starts a node "clock" with delays on, on url, closed when t
// ends.
func clockNode(ctx context.Context, t *testing.T, url string) *runtime.Node {
	t.Helper()
	node, err := runtime.New(ctx, runtime.Config{Node: "clock", AMQPURL: url, StateDir: t.TempDir(), Delays: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(context.Background()) })
	return node
}

// TestGroups: `meshctl groups` lists a group with its queue, the events
// waiting in it and its consumers (the broker's), and its members (their
// heartbeats'): two nodes running billing in group eu, one of them with a
// module of no group, which is no group's, and both ledger in group books,
// which keeps order over 4 partitions: the partitions, and how many each
// member owns.
func TestGroups(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "groups", "--within", "2s").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no group heard") {
		t.Fatalf("groups with no node: %v\n%s", err, out)
	}
	var east *runtime.Node
	handled := make(chan struct{}, 100)
	release := make(chan struct{})
	for _, name := range []string{"east", "west"} {
		n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(),
			HeartbeatInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close(context.Background())
		if _, err := n.Load(ctx, sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
			return m.On("module.shop.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
		}}, runtime.ModuleConfig{Group: "eu"}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
			return m.On("module.bank.#", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error {
				if ev.Headers[wire.HeaderPartitionKey] == "acct-hot" {
					<-release // held: its key's later events wait behind it
				}
				handled <- struct{}{}
				return nil
			}))
		}}, runtime.ModuleConfig{Group: "books", Partitions: 4, Concurrency: 4}); err != nil {
			t.Fatal(err)
		}
		if name == "east" {
			east = n
			if _, err := n.Load(ctx, sdk.Module{Name: "shop", Setup: func(m sdk.Mesh) error {
				return m.On("module.tax.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
			}}, runtime.ModuleConfig{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Events on every partition of books, which east owns: it consumed
	// first (its heartbeat, an hour apart, moves none).
	fed := map[int]bool{}
	for k := 0; len(fed) < 4; k++ {
		key := fmt.Sprintf("acct-%d", k)
		fed[wire.Slot(key)%4] = true
		if _, err := east.Emit(ctx, "bank", "module.bank.paid", k, sdk.WithKey(key)); err != nil {
			t.Fatal(err)
		}
		<-handled
	}
	out, err = exec.CommandContext(ctx, bin, "--amqp-url", url, "groups", "--within", "30s").CombinedOutput()
	if err != nil {
		t.Fatalf("groups: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "GROUP") || strings.Join(strings.Fields(lines[1]), " ") != "books ledger group.books.ledger.p000..p003 0 4 east (4 of 4 partitions), west (0 of 4 partitions) -" ||
		strings.Join(strings.Fields(lines[2]), " ") != "eu billing group.eu.billing.events 0 2 east, west" {
		t.Errorf("groups printed:\n%s", out)
	}
	out, err = exec.CommandContext(ctx, bin, "--amqp-url", url, "groups", "--json", "--within", "30s").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Group, Module, Queue string
		Ready, Consumers     *int
		Members              map[string]string
	}
	jsonLines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(jsonLines) != 2 {
		t.Fatalf("groups --json printed %s", out)
	}
	if err := json.Unmarshal([]byte(jsonLines[1]), &got); err != nil || got.Group != "eu" || got.Consumers == nil || *got.Consumers != 2 || len(got.Members) != 2 || got.Members["west"] != "running" {
		t.Errorf("groups --json printed %s: %v", out, err)
	}
	var books struct {
		Partitions int
		Each       []struct {
			Queue, Owner string
			Ready        *int
		}
	}
	if err := json.Unmarshal([]byte(jsonLines[0]), &books); err != nil || books.Partitions != 4 || len(books.Each) != 4 || books.Each[3].Owner != "east" ||
		books.Each[3].Queue != "group.books.ledger.p003" || books.Each[3].Ready == nil || *books.Each[3].Ready != 0 {
		t.Errorf("groups --json printed %s: %v", jsonLines[0], err)
	}

	// A hot key: its first event held in the handler, two behind it, all
	// three on east; another key of its partition goes past it.
	for range 3 {
		if _, err := east.Emit(ctx, "bank", "module.bank.paid", 0, sdk.WithKey("acct-hot")); err != nil {
			t.Fatal(err)
		}
	}
	part := wire.Slot("acct-hot") % 4
	var past string
	for k := 0; past == ""; k++ {
		if key := fmt.Sprintf("acct-%d", k); wire.Slot(key)%4 == part {
			past = key
		}
	}
	if _, err := east.Emit(ctx, "bank", "module.bank.paid", 0, sdk.WithKey(past)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled: // past's, while acct-hot's first is in hand
	case <-ctx.Done():
		t.Fatalf("key %s, behind no event of its own, waited for acct-hot's first (in the same partition) to be released", past)
	}
	want := fmt.Sprintf("acct-hot (3 on east, p%03d)", part)
	for {
		out, err = exec.CommandContext(ctx, bin, "--amqp-url", url, "groups", "--within", "30s").CombinedOutput()
		if err != nil {
			t.Fatalf("groups: %v\n%s", err, out)
		}
		if strings.Contains(string(out), want) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("groups never named the hot key as %q:\n%s", want, out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	close(release)
	for range 3 {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatal("acct-hot's events were not handled once released")
		}
	}
}
