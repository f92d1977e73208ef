package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
	"github.com/meshkit/mesh/sdk"
)

// TestPrintedPermissionsOnTheBroker gives three fresh broker users exactly
// what `meshctl topology permissions` prints, by running the printed
// rabbitmqctl commands: two nodes' users (--for node) and the operator's
// (--for operator).
//   - The nodes run with them: n1's module shop consumes, emits, serves and
//     calls, a classic queue retries and dead-letters; n2 runs the audit
//     logger. Each follows the other's heartbeats (a server-named queue it
//     declares, binds and consumes), and neither logs a refusal.
//   - A node's user is refused (403) what is not its own: declaring,
//     consuming or binding another node's queue, serving another node's
//     tool, consuming the mesh's dead letters, publishing another node's
//     events. Another connection's server-named queue is out of its reach
//     too (405: exclusive).
//   - With the operator's user, meshctl emit, tail, call, nodes, audit
//     query, dlq ls and replay, and unrouted ls work; the same user is
//     refused a node's queues.
func TestPrintedPermissionsOnTheBroker(t *testing.T) {
	url := brokertest.VHost(t)
	vhost, err := neturl.PathUnescape(url[strings.LastIndex(url, "/")+1:])
	if err != nil {
		t.Fatal(err)
	}
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	account := func() (user, url string) {
		user, password := brokertest.User(t)
		return user, fmt.Sprintf("amqp://%s:%s@%s/%s", user, password, brokertest.Host(), neturl.PathEscape(vhost))
	}
	n1User, n1URL := account()
	n2User, n2URL := account()
	opUser, opURL := account()
	dir := t.TempDir()
	config := func(name, text string) string {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	n1Config := config("n1", fmt.Sprintf(`node: n1
amqp_url: %s
heartbeat_interval: 100ms
retry_min: 10ms
retry_max: 50ms
modules:
  - name: shop
    path: /bin/true
    tools: ["shop.*"]
    calls: ["shop.*"]
    queue_type: classic
    max_attempts: 2
  - name: mail
    path: /bin/true
    dead_letters: ["#"]
`, n1URL))
	n2Config := config("n2", fmt.Sprintf(`node: n2
amqp_url: %s
heartbeat_interval: 100ms
modules:
  - name: audit-logger
    path: /bin/true
    tools: ["audit.*"]
    dead_letters: ["#"]
`, n2URL))

	// Print, then run what is printed, as an operator would (at once:
	// each rabbitmqctl takes a second or two to start).
	var printed []string
	grant := func(user, password string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = withoutMeshEnv()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("meshctl %v: %v", args, err)
		}
		if strings.Contains(string(out), password) {
			t.Errorf("the permissions printed for %s show its password:\n%s", user, out)
		}
		var set int
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			switch {
			case strings.HasPrefix(line, "# "):
			case strings.HasPrefix(line, "rabbitmqctl add_user "+shellQuoted(user)+" "): // made by brokertest.User
			case strings.HasPrefix(line, "rabbitmqctl set_permissions -p "+shellQuoted(vhost)+" "+shellQuoted(user)+" "),
				strings.HasPrefix(line, "rabbitmqctl set_topic_permissions -p "+shellQuoted(vhost)+" "+shellQuoted(user)+" "):
				printed = append(printed, line)
				set++
			default:
				t.Fatalf("meshctl %v printed %q", args, line)
			}
		}
		if set != 3 {
			t.Fatalf("meshctl %v printed %d set_ commands, want 3:\n%s", args, set, out)
		}
	}
	password := func(url string) string { u, _ := neturl.Parse(url); p, _ := u.User.Password(); return p }
	grant(n1User, password(n1URL), "topology", "permissions", "--config", n1Config)
	grant(n2User, password(n2URL), "topology", "permissions", "--config", n2Config)
	grant(opUser, password(opURL), "--amqp-url", opURL, "topology", "permissions", "--for", "operator")
	failed := make([]error, len(printed))
	var wg sync.WaitGroup
	for i, line := range printed {
		wg.Go(func() {
			if out, err := exec.CommandContext(ctx, "sh", "-c", line).CombinedOutput(); err != nil {
				failed[i] = fmt.Errorf("%s: %w\n%s", line, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(failed...); err != nil {
		t.Fatal(err)
	}

	// The nodes, with their users: n2 first, so that n1 joins a mesh with
	// an audit logger.
	start := func(path string) (*runtime.Node, nodeconfig.File, *warnings) {
		t.Helper()
		f, err := nodeconfig.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg := f.Runtime()
		w := &warnings{}
		cfg.StateDir, cfg.Logger = t.TempDir(), slog.New(w)
		n, err := runtime.New(ctx, cfg)
		if err != nil {
			t.Fatalf("node %s with its printed permissions: %v", f.Node, err)
		}
		t.Cleanup(func() { n.Close(context.Background()) })
		// New follows the other nodes before it returns: a refused
		// membership queue is logged by now.
		if !w.none(t, f.Node) {
			t.FailNow()
		}
		return n, f, w
	}
	audit, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { audit.Close() }) // after n2's Close
	n2, f2, w2 := start(n2Config)
	// Each event the audit logger stores is told on stored.
	stored := make(chan string, 1024)
	logger := audit.Module()
	logger.Setup = func(m sdk.Mesh) error { return audit.Module().Setup(toldMesh{Mesh: m, handled: stored}) }
	if _, err := n2.Load(ctx, logger, f2.Modules[0].ModuleConfig()); err != nil {
		t.Fatalf("load the audit logger on n2: %v", err)
	}
	n1, f1, w1 := start(n1Config)
	sent, replayed := make(chan sdk.Event, 10), make(chan sdk.Event, 10)
	dead := make(chan sdk.Event, 10)
	var refuseBounced atomic.Bool
	refuseBounced.Store(true)
	shop, err := n1.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"order.placed"}, Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("module.mail.sent", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { sent <- ev; return nil })),
			m.On("module.mail.bounced", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				if refuseBounced.Load() {
					return errors.New("no")
				}
				replayed <- ev
				return nil
			})),
			m.Serve("shop.price", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return 42, nil })),
		)
	}}, f1.Modules[0].ModuleConfig())
	if err != nil {
		t.Fatalf("load shop: %v", err)
	}
	mail, err := n1.Load(ctx, sdk.Module{Name: "mail", Emits: []string{"sent", "bounced"},
		DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { dead <- ev; return nil })}, f1.Modules[1].ModuleConfig())
	if err != nil {
		t.Fatalf("load mail: %v", err)
	}
	receive := func(what string, ch <-chan sdk.Event, id string) sdk.Event {
		t.Helper()
		for {
			select {
			case ev := <-ch:
				if ev.ID == id {
					return ev
				}
			case <-ctx.Done():
				t.Fatalf("%s: never came", what)
			}
		}
	}
	id, err := mail.Mesh().Emit(ctx, "sent", map[string]int{"n": 1})
	if err != nil {
		t.Fatalf("mail emits: %v", err)
	}
	receive("shop consumes module.mail.sent", sent, id)
	placed, err := shop.Mesh().Emit(ctx, "order.placed", map[string]int{"order": 7})
	if err != nil {
		t.Fatalf("shop emits: %v", err)
	}
	var price int
	if err := shop.Mesh().Call(ctx, "shop.price", nil, &price); err != nil || price != 42 {
		t.Errorf("shop calls shop.price (which it serves): %d, %v", price, err)
	}
	// A classic queue's retry (the default exchange), then the dead
	// letter (mesh.events.dead), which mail takes.
	bounced, err := mail.Mesh().Emit(ctx, "bounced", 1)
	if err != nil {
		t.Fatal(err)
	}
	if ev := receive("the dead letter of module.mail.bounced", dead, bounced); ev.DeadAttempts != 2 {
		t.Errorf("dead-lettered after %d attempts, want 2", ev.DeadAttempts)
	}

	// Membership: each node hears the other's heartbeats.
	heard := func(n *runtime.Node, peer string) bool {
		for _, p := range n.Peers() {
			if p.Node == peer {
				return true
			}
		}
		return false
	}
	// Each heartbeat on the mesh is what a node hears of its peer: look
	// again at each one.
	beats := make(chan struct{}, 1)
	tailCtx, stopTail := context.WithCancel(ctx)
	tailDone := make(chan error, 1)
	go func() {
		tailDone <- n1.Tail(tailCtx, "node.*.heartbeat", nil, func(runtime.TailedEvent) error {
			select {
			case beats <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	for !heard(n1, "n2") || !heard(n2, "n1") {
		select {
		case <-ctx.Done():
			t.Fatalf("the nodes never heard of each other (n1 heard n2: %v, n2 heard n1: %v)", heard(n1, "n2"), heard(n2, "n1"))
		case err := <-tailDone:
			t.Fatalf("tail of the heartbeats as n1's user: %v", err)
		case <-beats:
		}
	}
	stopTail()
	<-tailDone
	for _, n := range []*runtime.Node{n1, n2} {
		if err := n.Ready(); err != nil {
			t.Errorf("node %s not ready: %v", n.Name(), err)
		}
	}

	// What a node's user may not do, on a raw connection of its own.
	n1Conn := dial(t, n1URL)
	refused := func(conn *amqp.Connection, code int, what string, do func(ch *amqp.Channel) error) {
		t.Helper()
		dl, _ := ctx.Deadline()
		if ae := brokertest.ChannelError(t, conn, time.Until(dl), do); ae == nil || ae.Code != code {
			t.Errorf("%s: %v, want %d", what, ae, code)
		}
	}
	consume := func(queue string) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			_, err := ch.Consume(queue, "", false, false, false, false, nil)
			return err
		}
	}
	publish := func(exchange, key string) func(ch *amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			if err := ch.Confirm(false); err != nil {
				return err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{Body: []byte("{}")})
			if err != nil {
				return err
			}
			_, err = dc.WaitContext(ctx)
			return err
		}
	}
	n2Queue := wire.ModuleQueue("n2", auditlogger.Name)
	refused(n1Conn, amqp.AccessRefused, "n1 declares a queue under n2's name", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(wire.ModuleQueue("n2", "shop"), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	refused(n1Conn, amqp.AccessRefused, "n1 declares n2's lock queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(wire.NodeLockQueue("n2"), false, true, true, false, nil)
		return err
	})
	refused(n1Conn, amqp.AccessRefused, "n1 consumes n2's module queue", consume(n2Queue))
	refused(n1Conn, amqp.AccessRefused, "n1 binds n2's module queue", func(ch *amqp.Channel) error {
		return ch.QueueBind(n2Queue, "module.shop.#", wire.ExchangeEvents, false, nil)
	})
	refused(n1Conn, amqp.AccessRefused, "n1 consumes the serve queue of n2's tool", consume(wire.ServeQueue(auditlogger.ToolQuery)))
	refused(n1Conn, amqp.AccessRefused, "n1 consumes the mesh's dead letters", consume(wire.QueueDead))
	refused(n1Conn, amqp.AccessRefused, "n1 consumes the mesh's unrouted events", consume(wire.QueueUnrouted))
	refused(n1Conn, amqp.AccessRefused, "n1 publishes node.n2.left", publish(wire.ExchangeEvents, "node.n2.left"))
	refused(n1Conn, amqp.AccessRefused, "n1 publishes module.audit-logger.checkpoint", publish(wire.ExchangeEvents, "module.audit-logger.checkpoint"))
	// Server-named queues are the node's to declare, bind and consume;
	// another connection's, even of the same user, are exclusive.
	ch, err := n1Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	mine, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		err = ch.QueueBind(mine.Name, "node.*.heartbeat", wire.ExchangeEvents, false, nil)
	}
	if err != nil {
		t.Fatalf("n1 declares and binds a server-named queue: %v", err)
	}
	other := dial(t, n1URL)
	refused(other, amqp.ResourceLocked, "n1 consumes a server-named queue of another connection", consume(mine.Name))
	refused(other, amqp.ResourceLocked, "n1 binds a server-named queue of another connection", func(ch *amqp.Channel) error {
		return ch.QueueBind(mine.Name, "#", wire.ExchangeEvents, false, nil)
	})

	// The operator's user, through the meshctl binary.
	tail := exec.CommandContext(ctx, bin, "--amqp-url", opURL, "tail", "--json", "#")
	tail.Env = withoutMeshEnv()
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
	t.Cleanup(func() {
		_ = tail.Process.Signal(syscall.SIGTERM)
		_ = tail.Wait()
	})
	following := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case following <- sc.Text():
			default:
			}
		}
		close(following)
	}()
	select {
	case line, ok := <-following:
		if !ok || !strings.HasPrefix(line, "tail: following") {
			t.Fatalf("tail as the operator: %q", line)
		}
	case <-ctx.Done():
		t.Fatal("tail as the operator never started following")
	}
	tailed := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var line struct{ ID string }
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				select {
				case tailed <- line.ID:
				default: // heartbeats nobody waits for
				}
			}
		}
	}()
	emitted, _ := want(t, bin, opURL, 0, []string{"--node", "ops", "emit", "mesh.ops.checked", `{"ok":true}`})
	emitted = strings.TrimSpace(emitted)
	for seen := false; !seen; {
		select {
		case id := <-tailed:
			seen = id == emitted
		case <-ctx.Done():
			t.Fatalf("tail as the operator never printed %s", emitted)
		}
	}
	want(t, bin, opURL, 0, []string{"call", "shop.price", "{}"}, "42")
	out, _ := want(t, bin, opURL, 0, []string{"nodes", "--json", "--wait", "1s"})
	if !strings.Contains(out, `"node":"n1"`) || !strings.Contains(out, `"node":"n2"`) {
		t.Errorf("nodes as the operator:\n%s", out)
	}
	for _, id := range []string{emitted, placed} {
		for done := false; !done; {
			if _, err := audit.Store().Get(ctx, id); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the audit logger never stored %s", id)
			case got := <-stored:
				done = got == id
			}
		}
	}
	want(t, bin, opURL, 0, []string{"audit", "query", "--json", "--type", "mesh.ops.#"}, emitted)
	want(t, bin, opURL, 0, []string{"audit", "query", "--json", "--source", "shop"}, placed)
	want(t, bin, opURL, 0, []string{"dlq", "ls", "--json"}, bounced)
	want(t, bin, opURL, 0, []string{"unrouted", "ls"})
	// dlq replay sends the dead letter to shop's queue by name (the
	// default exchange), and shop takes it this time.
	refuseBounced.Store(false)
	want(t, bin, opURL, 0, []string{"dlq", "replay", "--id", bounced}, "replayed 1 dead letter to 1 queue")
	receive("shop takes the replayed dead letter", replayed, bounced)

	opConn := dial(t, opURL)
	refused(opConn, amqp.AccessRefused, "the operator declares a module queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(wire.ModuleQueue("n1", "billing"), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	refused(opConn, amqp.AccessRefused, "the operator consumes a module queue", consume(wire.ModuleQueue("n1", "shop")))
	refused(opConn, amqp.AccessRefused, "the operator consumes a serve queue", consume(wire.ServeQueue("shop.price")))

	w1.none(t, "n1")
	w2.none(t, "n2")
}

// TestTopologyPermissionsFor: --for node (the default) prints a node's
// permissions, with write on its server-named queues and no read on the
// keepers; --for operator prints the operator's, for the user of
// --amqp-url or --user, on the virtual host of --amqp-url or of the
// config (never with the config's user, the node's).
func TestTopologyPermissionsFor(t *testing.T) {
	for _, v := range []string{"MESH_CONFIG", "MESH_AMQP_URL", "MESH_AMQP_URLS"} { // only the flags given
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	cfg := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte("node: n1\namqp_url: amqp://mesh-n1:secret@127.0.0.1:5672/prod\ndelays: false\nmodules:\n  - name: shop\n    path: /bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		a := app()
		var out strings.Builder
		a.Writer, a.ErrWriter = &out, io.Discard
		err := a.Run(interspersed(a, append([]string{"meshctl"}, args...)))
		return out.String(), err
	}
	setPermissions := func(out string) (configure, write, read string) {
		t.Helper()
		for _, line := range strings.Split(out, "\n") {
			if words, err := shellWords(line); err == nil && len(words) == 8 && words[1] == "set_permissions" {
				return words[5], words[6], words[7]
			}
		}
		t.Fatalf("no set_permissions in\n%s", out)
		return
	}
	out, err := run("topology", "permissions", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "# node n1: broker user mesh-n1 on virtual host prod\n") {
		t.Errorf("node permissions:\n%s", out)
	}
	_, write, read := setPermissions(out)
	if !strings.Contains(write, `amq\.gen-.*`) || strings.Contains(read, `mesh\.dead-letters`) || strings.Contains(read, `mesh\.unrouted`) ||
		strings.Contains(read, `mesh\.rpc`) {
		t.Errorf("node write %s, read %s", write, read)
	}

	for _, args := range [][]string{
		{"--amqp-url", "amqp://ops:pw@127.0.0.1:5672/prod", "topology", "permissions", "--for", "operator"},
		{"topology", "permissions", "--for", "operator", "--config", cfg, "--user", "ops"},
	} {
		out, err := run(args...)
		if err != nil {
			t.Fatalf("meshctl %v: %v", args, err)
		}
		if !strings.HasPrefix(out, "# operator (meshctl): broker user ops on virtual host prod\n") || strings.Contains(out, "mesh-n1") ||
			strings.Contains(out, "pw") || strings.Contains(out, "secret") {
			t.Errorf("meshctl %v printed\n%s", args, out)
		}
		configure, _, read := setPermissions(out)
		if strings.Contains(configure, "n1") || !strings.Contains(read, `mesh\.dead-letters`) {
			t.Errorf("operator configure %s, read %s", configure, read)
		}
		if !strings.Contains(out, "rabbitmqctl set_topic_permissions -p 'prod' 'ops' 'mesh.rpc' '.*' '^$'") {
			t.Errorf("meshctl %v printed\n%s", args, out)
		}
	}
	js, err := run("topology", "permissions", "--for", "operator", "--user", "ops", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		For, User, VHost, Configure string
		Topics                      []struct{ Exchange, Write, Read string }
		Commands                    []string
	}
	if err := json.Unmarshal([]byte(js), &p); err != nil || p.For != "operator" || p.User != "ops" || p.VHost != "/" || len(p.Topics) != 2 ||
		len(p.Commands) != 4 {
		t.Errorf("--for operator --json: %+v, %v\n%s", p, err, js)
	}
	for _, args := range [][]string{
		{"topology", "permissions", "--for", "operator", "--config", cfg}, // the config's user is the node's
		{"topology", "permissions", "--for", "operator"},
		{"topology", "permissions", "--for", "operator", "--user", "ops", "--node", "n1"},
		{"topology", "permissions", "--for", "operator", "--user", "ops", "--consumes", "q"},
		{"topology", "permissions", "--for", "admin", "--config", cfg},
		{"topology", "permissions"}, // a node's need its config
	} {
		if out, err := run(args...); err == nil {
			t.Errorf("meshctl %v succeeded:\n%s", args, out)
		}
	}
}

// dial opens a connection, closed when t ends.
func dial(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// shellQuoted is s as the printed commands quote it.
func shellQuoted(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// withoutMeshEnv is this process's environment without MESH_ variables,
// so that a meshctl run by a test takes only the flags it is given.
func withoutMeshEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESH_") {
			env = append(env, kv)
		}
	}
	return env
}

// warnings is a slog handler that keeps a node's warnings and errors.
type warnings struct {
	mu    sync.Mutex
	lines []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, b.String())
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// none reports whether the node logged no refusal of the broker, and
// fails t with each it logged.
func (w *warnings) none(t *testing.T, node string) bool {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	ok := true
	for _, l := range w.lines {
		if strings.Contains(l, "ACCESS_REFUSED") || strings.Contains(l, "403") {
			t.Errorf("node %s: %s", node, l)
			ok = false
		}
	}
	return ok
}

// toldMesh subscribes each handler so that every event it handles well is
// told on handled, after the handler returned. Its options pass through as
// they are: they are the host's, not a mark on the handler.
type toldMesh struct {
	sdk.Mesh
	handled chan<- string
}

func (m toldMesh) On(pattern string, h sdk.Handler, opts ...sdk.HandlerOption) error {
	return m.Mesh.On(pattern, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		err := h.HandleEvent(ctx, ev)
		if err == nil {
			select {
			case m.handled <- ev.ID:
			default: // nobody waits for this many
			}
		}
		return err
	}), opts...)
}
