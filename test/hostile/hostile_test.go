// Package hostile holds the trust-boundary tests (docs/security.md): a
// hostile module process (evilmodule, which speaks the plugin protocol
// directly) attempts each attack on a node of the real broker, beside an
// honest module, and each attempt must fail with a clear error while the
// honest module keeps being served.
package hostile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

var evilBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hostile-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Chmod(dir, 0o755) // an unprivileged meshd runs these too
	evilBin = filepath.Join(dir, "evilmodule")
	build := exec.Command("go", "build", "-o", evilBin, "./evilmodule")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build evilmodule: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// world is a node with an honest in-process module and a spy on every
// event, in a virtual host of its own.
type world struct {
	t      *testing.T
	ctx    context.Context
	node   *runtime.Node
	honest sdk.Mesh
	spy    <-chan amqp.Delivery
	raw    *amqp.Channel // the spy's, to publish as a raw client
	conn   *amqp.Connection
	dir    string
	url    string // the test's virtual host
	loads  int    // modules loaded, to name their report sockets
}

// honestAnswer is what honest.echo and honest.secret answer: who asked,
// with which request id.
type honestAnswer struct {
	ID, Caller, Node string
}

func newWorld(t *testing.T) *world {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	// Only this test's plugin sockets in the temporary directory the
	// socket attack scans.
	t.Setenv("TMPDIR", dir)
	n, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: filepath.Join(dir, "state"),
		RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	answer := sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
		return honestAnswer{ID: r.ID, Caller: r.Caller, Node: r.Node}, nil
	})
	honest, err := n.Load(ctx, sdk.Module{Name: "honest", Emits: []string{"ping", "marker"},
		Callers: map[string][]string{"honest.secret": {"meshctl"}},
		Setup: func(m sdk.Mesh) error {
			return errors.Join(m.Serve("honest.echo", answer), m.Serve("honest.secret", answer))
		}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	spy, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, ctx: ctx, node: n, honest: honest.Mesh(), spy: spy, raw: ch, conn: conn, dir: dir, url: url}
}

// load starts the evil module with attack and settings, as entry name.
func (w *world) load(entry string, set map[string]any, mc runtime.ModuleConfig) (*runtime.PluginModule, *reports, error) {
	w.loads++
	report := newReports(w.t, w.dir, fmt.Sprintf("report-%d-%s", w.loads, entry))
	set["report"] = report.path
	if set["name"] == nil {
		set["name"] = entry
	}
	raw, _ := json.Marshal(set)
	mc.Name, mc.Settings = entry, raw
	pm, err := w.node.LoadPlugin(w.ctx, evilBin, nil, mc)
	if pm != nil {
		w.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = pm.Stop(ctx)
		})
	}
	return pm, report, err
}

// untilMarker emits a marker from the honest module and returns every
// event the spy saw before it: what the attack put on the wire, if
// anything.
func (w *world) untilMarker() []amqp.Delivery {
	w.t.Helper()
	id, err := w.honest.Emit(w.ctx, "marker", map[string]int{})
	if err != nil {
		w.t.Fatalf("the honest module's emit: %v", err)
	}
	var seen []amqp.Delivery
	for {
		select {
		case d := <-w.spy:
			if d.Headers["x-event-id"] == id {
				return seen
			}
			seen = append(seen, d)
		case <-w.ctx.Done():
			w.t.Fatal("the marker never came: the node stopped serving the honest module")
		}
	}
}

// honestStillServed: the node still serves the honest module's tool.
func (w *world) honestStillServed() {
	w.t.Helper()
	var a honestAnswer
	if err := w.node.Call(w.ctx, "meshctl", "honest.secret", nil, &a); err != nil || a.Caller != "meshctl" {
		w.t.Fatalf("the operator's call of the honest module's tool: %+v %v", a, err)
	}
}

// TestClaimingAnotherName: a process whose entry is evil says it is
// billing: it is refused before it may emit, and no event of billing
// reaches the wire.
func TestClaimingAnotherName(t *testing.T) {
	w := newWorld(t)
	_, report, err := w.load("evil", map[string]any{"attack": "name", "name": "billing"}, runtime.ModuleConfig{})
	if !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), `says it is module "billing"`) {
		t.Fatalf("load: %v, want ErrForbidden naming the claimed name", err)
	}
	for _, d := range w.untilMarker() {
		if d.Headers["x-source"] == "billing" || strings.HasPrefix(d.RoutingKey, "module.billing.") {
			t.Errorf("an event of the claimed name reached the wire: %s %v", d.RoutingKey, d.Headers)
		}
	}
	if l := step(readReport(report), "emit as claimed name"); l.Step != "" {
		t.Errorf("the process got to emit: %+v", l)
	}
	w.honestStillServed()
}

// TestUngrantedQueueAndDeadLetters: consuming a queue, or receiving dead
// letters, that the entry does not grant is refused at load, naming the
// grant to add.
func TestUngrantedQueueAndDeadLetters(t *testing.T) {
	w := newWorld(t)
	for _, q := range []string{"mesh.dead-letters", "anchor.audit-logger.events", "serve.honest.secret"} {
		_, _, err := w.load("evil", map[string]any{"attack": "consume", "queue": q}, runtime.ModuleConfig{ConsumeGrants: []string{"shop.orders"}})
		if !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "consumes:") {
			t.Errorf("consume %s: %v, want ErrForbidden naming consumes:", q, err)
		}
	}
	// A wildcard grant gives every queue its words match but the mesh's
	// own, which only their exact names grant.
	for _, q := range []string{"mesh.dead-letters", "mesh.unrouted", "mesh.history", "mesh.node.anchor.due", "mesh.delay.3"} {
		for _, grant := range []string{"#", "mesh.#", "mesh.*"} {
			_, _, err := w.load("evil", map[string]any{"attack": "consume", "queue": q}, runtime.ModuleConfig{ConsumeGrants: []string{grant}})
			if !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "exact name only") {
				t.Errorf("consume %s granted %q: %v, want ErrForbidden saying the mesh's own queues are granted by exact name", q, grant, err)
			}
		}
	}
	_, _, err := w.load("evil", map[string]any{"attack": "deadletters"}, runtime.ModuleConfig{DeadLetterGrants: []string{}})
	if !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), "dead_letters:") {
		t.Errorf("dead letters: %v, want ErrForbidden naming dead_letters:", err)
	}
	w.honestStillServed()
}

// TestDeadLettersAsGranted: a module granted the dead letters of one
// origin gets those and no other: the broker binds its dead-letter queue
// with the grant (checked on the wire with raw amqp091-go).
func TestDeadLettersAsGranted(t *testing.T) {
	w := newWorld(t)
	got := make(chan sdk.Event, 10)
	_, err := w.node.Load(w.ctx, sdk.Module{Name: "watcher", DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		got <- ev
		return nil
	})}, runtime.ModuleConfig{DeadLetterGrants: []string{"module.shop.#"}})
	if err != nil {
		t.Fatal(err)
	}
	// Dead letters of two origins, published as a queue that gave up
	// would: shop's reaches the watcher, mail's does not.
	for _, key := range []string{"module.mail.sent", "module.shop.sold"} {
		if err := w.raw.PublishWithContext(w.ctx, "mesh.events.dead", key, false, false, amqp.Publishing{Headers: amqp.Table{"x-event-id": "01J00000000000000000000000", "x-source": "x", "x-node": "n", "x-time": time.Now().UTC().Format(time.RFC3339)},
			ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-got:
		if ev.Type != "module.shop.sold" {
			t.Fatalf("the watcher got a dead letter of %s, granted only module.shop.#", ev.Type)
		}
	case <-w.ctx.Done():
		t.Fatal("the granted dead letter never came")
	}
	// Both were published in order on one channel and routed at once: a
	// second granted one arriving proves the mail one was not delivered.
	if err := w.raw.PublishWithContext(w.ctx, "mesh.events.dead", "module.shop.again", false, false, amqp.Publishing{Headers: amqp.Table{"x-event-id": "01J00000000000000000000001", "x-source": "x", "x-node": "n", "x-time": time.Now().UTC().Format(time.RFC3339)},
		ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		if ev.Type != "module.shop.again" {
			t.Fatalf("the watcher got a dead letter of %s, granted only module.shop.#", ev.Type)
		}
	case <-w.ctx.Done():
		t.Fatal("the second granted dead letter never came")
	}
}

// TestUngrantedCallAndCallers: a call the entry does not grant is refused
// by the host, naming calls:; a granted call of a tool whose callers
// exclude the module is refused by the serving node with "forbidden".
func TestUngrantedCallAndCallers(t *testing.T) {
	w := newWorld(t)
	_, report, err := w.load("evil", map[string]any{"attack": "call", "tool": "honest.echo"}, runtime.ModuleConfig{CallGrants: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	l := step(waitReport(t, report, "done"), "call")
	if !strings.HasPrefix(l.Got, "FORBIDDEN|") || !strings.Contains(l.Got, "calls:") {
		t.Errorf("an ungranted call got %q, want FORBIDDEN naming calls:", l.Got)
	}
	_, report, err = w.load("evil2", map[string]any{"attack": "call", "tool": "honest.secret"}, runtime.ModuleConfig{CallGrants: []string{"honest.*"}})
	if err != nil {
		t.Fatal(err)
	}
	l = step(waitReport(t, report, "done"), "call")
	if !strings.HasPrefix(l.Got, "TOOL|forbidden|") || !strings.Contains(l.Got, "anchor/evil2 ") {
		t.Errorf("a call of a tool whose callers exclude the module got %q, want the tool error forbidden naming the caller", l.Got)
	}
	w.honestStillServed()
}

// TestIdsAreTheHosts: a process that names another module's event id (as
// its emit's id and its cause, or as an outbox row's id and scope) gets
// an id of the host's, of its own scope, and one that names another
// caller's request id gets its own answer.
func TestIdsAreTheHosts(t *testing.T) {
	w := newWorld(t)
	victim, err := w.honest.Emit(w.ctx, "ping", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	_, report, err := w.load("evil", map[string]any{"attack": "eventid", "id": victim}, runtime.ModuleConfig{AllowUndeclaredEmits: true})
	if err != nil {
		t.Fatal(err)
	}
	l := step(waitReport(t, report, "done"), "emit with another's id")
	id, _, _ := strings.Cut(l.Got, "|")
	if id == "" || id == victim {
		t.Fatalf("the forged emit got id %q (%+v), want a fresh one, not %s", id, l, victim)
	}
	for _, d := range w.untilMarker() {
		if d.RoutingKey == "module.evil.forged" && d.Headers["x-event-id"] == victim {
			t.Fatalf("the forged event reached the wire with the victim's id")
		}
	}

	// The same through the outbox's fields: the host derives the row's
	// id from the process's module name, never the victim's.
	_, report, err = w.load("evilbox", map[string]any{"attack": "outboxid", "id": victim}, runtime.ModuleConfig{AllowUndeclaredEmits: true})
	if err != nil {
		t.Fatal(err)
	}
	l = step(waitReport(t, report, "done"), "outbox row with another's id")
	ref := causation.OutboxRef{Scope: victim, N: 0, Time: time.UnixMilli(1_700_000_000_000)}
	id, _, _ = strings.Cut(l.Got, "|")
	if id != causation.OutboxID("evilbox", ref) || id == victim || id == causation.OutboxID("honest", ref) {
		t.Fatalf("the forged outbox row got id %q (%+v), want %s, of its own scope", id, l, causation.OutboxID("evilbox", ref))
	}
	for _, d := range w.untilMarker() {
		if d.RoutingKey == "module.evilbox.forged" && (d.Headers["x-event-id"] == victim || d.Headers["x-source"] != "evilbox") {
			t.Fatalf("the forged outbox row reached the wire as %v", d.Headers)
		}
	}

	// A request id another caller used, inside a handling (its answer is
	// stored): the evil process names it and gets its own.
	first := make(chan honestAnswer, 1)
	_, err = w.node.Load(w.ctx, sdk.Module{Name: "caller", Setup: func(m sdk.Mesh) error {
		return m.On("module.honest.ping", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var a honestAnswer
			err := m.Call(ctx, "honest.echo", map[string]int{}, &a)
			first <- a
			return err
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.honest.Emit(w.ctx, "ping", map[string]int{"n": 2}); err != nil {
		t.Fatal(err)
	}
	var a honestAnswer
	select {
	case a = <-first:
	case <-w.ctx.Done():
		t.Fatal("the honest caller never called")
	}
	_, report, err = w.load("evil3", map[string]any{"attack": "requestid", "tool": "honest.echo", "id": a.ID}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l = step(waitReport(t, report, "done"), "call with another's request id")
	body, _, _ := strings.Cut(l.Got, "|")
	var b honestAnswer
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatalf("the evil call's answer %q: %v", l.Got, err)
	}
	if b.ID == a.ID || b.Caller != "evil3" {
		t.Fatalf("the evil call was answered %+v, the honest caller %+v: want an answer of its own", b, a)
	}

	// Handling tokens the host never handed the process, guessed: every
	// emit and call naming one is refused as past its deadline, none
	// reaches the wire or the tool.
	_, report, err = w.load("evil4", map[string]any{"attack": "handling", "tool": "honest.echo"}, runtime.ModuleConfig{AllowUndeclaredEmits: true})
	if err != nil {
		t.Fatal(err)
	}
	l = step(waitReport(t, report, "done"), "guessed handlings")
	lines := strings.Split(l.Got, "\n")
	if len(lines) != 8 {
		t.Fatalf("guessed handlings: %q, want an emit and a call for each of 4 tokens", l.Got)
	}
	for _, line := range lines {
		if !strings.Contains(line, "DEADLINE_EXCEEDED") || !strings.Contains(line, "is over and forgotten") {
			t.Errorf("a guessed handling got %q, want it refused as over", line)
		}
	}
	for _, d := range w.untilMarker() {
		if d.RoutingKey == "module.evil4.guessed" {
			t.Fatalf("an emit in a guessed handling reached the wire: %v", d.Headers)
		}
	}
}

// TestFiltersAreBoundedByTheHost: the filters a module process describes
// are parsed by meshd with the sdk's bounds, not trusted as its sdk made
// them: a filter of a megabyte, one nested two hundred levels deep (which
// a naive recursive parser would follow), more filters than patterns, and
// the same on a consumed queue, each fail the load with the rule named,
// before the module's queue is declared; the honest module is still
// served.
func TestFiltersAreBoundedByTheHost(t *testing.T) {
	w := newWorld(t)
	deep := strings.Repeat("not ", 10_000) + "source = 'x'"
	for i, c := range []struct {
		set  map[string]any
		says string
	}{
		{map[string]any{"size": 1 << 20}, "is over 1024"},
		{map[string]any{"filters": []string{"source = 'a' or " + strings.Repeat("(", 200) + "source = 'b'" + strings.Repeat(")", 200)}}, "nested more than"},
		{map[string]any{"filters": []string{"", "source = 'a'"}}, "2 filters for 1 patterns"},
		{map[string]any{"filters": []string{""}, "queue": "evil.legacy", "filter": deep}, "is over 1024"},
		{map[string]any{"filters": []string{""}, "queue": "evil.legacy", "filter": strings.Repeat("(", 17) + "source = 'x'" + strings.Repeat(")", 17)}, "nested more than"},
	} {
		name := fmt.Sprintf("filters%d", i)
		c.set["attack"], c.set["pattern"] = "filters", "module.honest.#"
		_, _, err := w.load(name, c.set, runtime.ModuleConfig{ConsumeGrants: []string{"evil.*"}})
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.says)
			continue
		}
		if len(err.Error()) > 2000 {
			t.Errorf("%s: the refusal is %d bytes long: it repeats what the module sent", name, len(err.Error()))
		}
		ch, err := w.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive("anchor."+name+".events", true, false, false, false, nil); err == nil {
			t.Errorf("%s: its queue was declared although its load was refused", name)
			ch.Close()
		}
	}
	w.honestStillServed()
}

// TestBoundedAcrossTheBoundary: a 200 MB handler error and a batch of
// 100,000 emits are refused; meshd's (here the test's) peak memory
// stays under a bound, and the honest module is still served.
func TestBoundedAcrossTheBoundary(t *testing.T) {
	w := newWorld(t)
	before := peakRSS(t)
	_, report, err := w.load("evil", map[string]any{"attack": "bigerror", "pattern": "module.honest.ping", "size": 200 << 20}, runtime.ModuleConfig{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.honest.Emit(w.ctx, "ping", map[string]int{}); err != nil {
		t.Fatal(err)
	}
	sent := step(waitReport(t, report, "sent the big error"), "sent the big error")
	// The host broke the stream on the error past its bound and started
	// the module again: the process that sent it must not live on.
	if pid, err := strconv.Atoi(sent.Got); err != nil {
		t.Errorf("the module reported no pid: %+v", sent)
	} else {
		waitGone(t, pid)
	}
	_, report, err = w.load("evil2", map[string]any{"attack": "hugebatch", "size": 100_000}, runtime.ModuleConfig{AllowUndeclaredEmits: true})
	if err != nil {
		t.Fatal(err)
	}
	l := step(waitReport(t, report, "done"), "huge batch")
	if l.Err == "" || !strings.Contains(l.Err, "ResourceExhausted") {
		t.Errorf("a batch of 100,000 emits: %+v, want refused (ResourceExhausted)", l)
	}
	_, report, err = w.load("evil3", map[string]any{"attack": "bigemit", "size": 64 << 20}, runtime.ModuleConfig{AllowUndeclaredEmits: true})
	if err != nil {
		t.Fatal(err)
	}
	l = step(waitReport(t, report, "done"), "big emit")
	if l.Err == "" || !strings.Contains(l.Err, "ResourceExhausted") {
		t.Errorf("a 64 MiB emit: %+v, want refused (ResourceExhausted)", l)
	}
	w.honestStillServed()
	if grew := peakRSS(t) - before; grew > 100<<20 {
		t.Errorf("peak RSS grew by %d MiB across the attacks, want under 100 MiB", grew>>20)
	}
}

// waitGone waits, up to a minute, for process pid to end: its pidfd
// becomes readable when it does.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return // ended and reaped already
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(time.Minute/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll the pidfd of %d: %v", pid, err)
		}
		if n == 0 {
			t.Errorf("the module process %d that broke its stream still runs a minute later: the host left it behind", pid)
		}
		return
	}
}

// TestOtherProcessesSockets: with this run's certificates only, a module
// process cannot use another module's socket nor the host's callback
// listener: every go-plugin socket it finds refuses it.
func TestOtherProcessesSockets(t *testing.T) {
	w := newWorld(t)
	if _, _, err := w.load("victim", map[string]any{"attack": "none"}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	_, report, err := w.load("evil", map[string]any{"attack": "sockets"}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lines := waitReport(t, report, "done")
	tried, _ := strconv.Atoi(step(lines, "sockets tried").Got)
	if tried < 2 {
		t.Fatalf("the hostile module found %d plugin sockets, want the victim's and the host's at least: %+v", tried, lines)
	}
	for _, l := range lines {
		if strings.HasPrefix(l.Step, "socket ") && l.Got == "ACCEPTED" {
			t.Errorf("%s accepted a process without this run's certificate: %s", l.Step, l.Err)
		}
	}
	for _, d := range w.untilMarker() {
		if strings.HasSuffix(d.RoutingKey, ".through.another") {
			t.Errorf("an emit through another's socket reached the wire: %s", d.RoutingKey)
		}
	}
	w.honestStillServed()
}

// peakRSS is the test process's peak resident set (VmHWM).
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmHWM")
	return 0
}

// TestSchemasAreTheHosts: the schemas a module process declares are
// compiled by meshd, which loads nothing for them: one whose $ref names a
// file meshd can read, too many, too large, one for an event it does not
// declare, reads for a pattern it does not subscribe each fail the load
// with the rule named; an emit past the sdk that breaks its declared
// schema, or asks for a version it does not declare, is refused and
// reaches no queue.
func TestSchemasAreTheHosts(t *testing.T) {
	w := newWorld(t)
	secret := filepath.Join(w.dir, "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type": "string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	decl := func(event string, schema string) []map[string]any {
		return []map[string]any{{"event": event, "version": "1", "json": json.RawMessage(schema)}}
	}
	for i, c := range []struct {
		set  map[string]any
		says string
	}{
		{map[string]any{"schemas": decl("order", `{"$ref": "file://`+secret+`"}`)}, "may refer only to itself"},
		{map[string]any{"schemas": decl("order", `{"properties": {"a": {"$ref": "`+secret+`"}}}`)}, "may refer only to itself"},
		{map[string]any{"size": 300}, "at most 256"},
		// 1.2 KB whose validation was exponential: 5.6 s of meshd's CPU
		// per emit at 18 levels.
		{map[string]any{"schemas": decl("order", schemaBomb(18))}, "at most 10,000 (MaxFanOut)"},
		{map[string]any{"big_schema": 300 << 10}, "bytes, at most"},
		{map[string]any{"schemas": decl("refund", `true`)}, "is not in the module's Emits"},
		{map[string]any{"schemas": decl("order", `true`), "pattern": "module.honest.#", "reads": []string{"1"}}, "does not subscribe"},
	} {
		name := fmt.Sprintf("schemas%d", i)
		c.set["attack"] = "schemas"
		_, _, err := w.load(name, c.set, runtime.ModuleConfig{})
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.says)
			continue
		}
		if len(err.Error()) > 2000 {
			t.Errorf("%s: the refusal is %d bytes long: it repeats what the module sent", name, len(err.Error()))
		}
		if strings.Contains(err.Error(), `"type": "string"`) || strings.Contains(err.Error(), `"type":"string"`) {
			t.Errorf("%s: the refusal shows the file's content: %v", name, err)
		}
	}

	order := decl("order", `{"type": "object", "required": ["price"], "properties": {"price": {"type": "number", "minimum": 0}}}`)
	for i, c := range []struct {
		body, version, says string
	}{
		{`{"price": -1}`, "", "/price: minimum:"},
		{`{"cost": 1}`, "", "/: required:"},
		{`{"price": 1}`, "9", `x-schema "9" asked for`},
	} {
		name := fmt.Sprintf("emitter%d", i)
		_, report, err := w.load(name, map[string]any{"attack": "schemas", "schemas": order, "body": json.RawMessage(c.body), "version": c.version}, runtime.ModuleConfig{})
		if err != nil {
			t.Fatal(err)
		}
		l := step(waitReport(t, report, "done"), "emit against its schema")
		id, msg, _ := strings.Cut(l.Got, "|")
		if id != "" || !strings.Contains(msg, c.says) {
			t.Errorf("%s: the emit got %+v, want refused saying %q", name, l, c.says)
		}
		for _, d := range w.untilMarker() {
			if d.RoutingKey == "module."+name+".order" {
				t.Errorf("%s: the refused emit reached the wire: %s", name, d.Body)
			}
		}
	}
	w.honestStillServed()
}

// TestHistoryIsGranted: a module process that describes a History handler
// past the sdk is refused at load by a node that keeps no history
// (ErrInvalid), and by one that keeps it when its entry does not grant it
// (ErrForbidden, as meshd sets for an entry without history: true),
// before the node attaches it to anything.
func TestHistoryIsGranted(t *testing.T) {
	w := newWorld(t)
	if _, _, err := w.load("history0", map[string]any{"attack": "history"}, runtime.ModuleConfig{}); !errors.Is(err, sdk.ErrInvalid) ||
		!strings.Contains(err.Error(), "keeps none") {
		t.Errorf("a History handler on a node without a history: %v, want ErrInvalid", err)
	}
	keeper, err := runtime.New(w.ctx, runtime.Config{Node: "keeper", AMQPURL: w.url, StateDir: filepath.Join(w.dir, "keeper"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), History: runtime.HistoryConfig{Stream: "mesh.history"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = keeper.Close(ctx)
	})
	w.node = keeper
	if _, _, err := w.load("history1", map[string]any{"attack": "history"}, runtime.ModuleConfig{DenyHistory: true}); !errors.Is(err, sdk.ErrForbidden) ||
		!strings.Contains(err.Error(), "does not grant it") {
		t.Errorf("a History handler not granted: %v, want ErrForbidden", err)
	}
}

// schemaBomb is a schema of levels $defs, each an anyOf of two $refs to
// the next: one value is checked against 2^levels subschemas.
func schemaBomb(levels int) string {
	var b strings.Builder
	b.WriteString(`{"$ref": "#/$defs/a0", "$defs": {`)
	for i := range levels {
		fmt.Fprintf(&b, `"a%d": {"anyOf": [{"$ref": "#/$defs/a%d"}, {"$ref": "#/$defs/a%d"}]}, `, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `"a%d": {"type": "string"}}}`, levels)
	return b.String()
}
