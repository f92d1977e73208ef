package runtime_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// consumersOf is the number of consumers on queue, from a passive declare
// on its own channel (a 404 would close the channel).
func consumersOf(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Consumers
}

// lateModule subscribes mesh.late.# with rec and serves late.echo.
func lateModule(name string, rec *recorder, setup func()) sdk.Module {
	return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
		if err := m.On("mesh.late."+name+".#", rec); err != nil {
			return err
		}
		if err := m.Serve("late."+name, sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) { return r.Body, nil })); err != nil {
			return err
		}
		if setup != nil {
			setup()
		}
		return nil
	}}
}

// TestNodeStartsBeforeTheBroker: with StartWithoutBroker, a node whose
// broker does not answer starts anyway, disconnected; it loads a module,
// spools emits, and once the broker answers it connects, attaches the
// module once and delivers what was emitted, in order. Without the option
// New fails; with it, a broker that answers "wrong credentials" still
// fails New.
func TestNodeStartsBeforeTheBroker(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	proxy.Down()
	viaProxy := strings.Replace(url, brokertest.Host(), proxy.Addr(), 1)
	cfg := func(url string, later bool) runtime.Config {
		return runtime.Config{Node: "early", AMQPURL: url, StateDir: t.TempDir(), Logger: testLogger(),
			ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, StartWithoutBroker: later}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n, err := runtime.New(ctx, cfg(viaProxy, false)); err == nil {
		n.Close(ctx)
		t.Fatal("New without StartWithoutBroker succeeded with no broker")
	}
	if n, err := runtime.New(ctx, cfg(strings.Replace(url, "guest:guest", "guest:wrong", 1), true)); err == nil {
		n.Close(ctx)
		t.Fatal("New with wrong credentials succeeded: a broker that says no is not a broker away")
	}

	n, err := runtime.New(ctx, cfg(viaProxy, true))
	if err != nil {
		t.Fatalf("New with the broker away: %v", err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	resumed := make(chan struct{}, 1)
	n.SetTestHooks(runtime.TestHooks{Resumed: func() { resumed <- struct{}{} }})
	if n.Connected() {
		t.Fatal("connected through a proxy that is down")
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("Ready with the broker away: %v", err)
	}
	rec := newRecorder(nil)
	load(t, n, lateModule("a", rec, nil), runtime.ModuleConfig{})
	var ids []string
	for i := range 3 {
		id, err := n.Emit(emitCtx(t), "test", "mesh.late.a.tick", map[string]int{"i": i})
		if err != nil {
			t.Fatalf("emit before the broker answers: %v", err)
		}
		ids = append(ids, id)
	}
	if st := n.Stats(); st.SpoolEvents != 3 {
		t.Fatalf("spool holds %d, want 3", st.SpoolEvents)
	}

	proxy.Up()
	select {
	case <-resumed:
	case <-ctx.Done():
		t.Fatal("the node never connected once the broker answered")
	}
	if err := n.Ready(); err != nil { // its module attached before the supervisor said it resumed
		t.Errorf("Ready once connected: %v", err)
	}
	for i, id := range ids {
		if ev := rec.next(t); ev.ID != id {
			t.Fatalf("event %d: %s, want %s (in emit order)", i, ev.ID, id)
		}
	}
	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if c := consumersOf(t, raw, wire.ModuleQueue("early", "a")); c != 1 {
		t.Errorf("%d consumers on the module's queue, want 1", c)
	}
	var got string
	if err := n.Call(ctx, "test", "late.a", "hi", &got); err != nil || got != "hi" {
		t.Errorf("call after the late start: %q, %v", got, err)
	}
	if st := n.Stats(); st.Reconnects != 0 || !st.Connected {
		t.Errorf("stats %+v: a first connect is not a reconnect", st)
	}
}

// TestModuleLoadedDuringOutageAttachesOnce: modules loaded while the broker
// is away attach exactly once when it returns, whichever comes first. The
// orderings are forced: one module's Setup returns while the node is
// away and the session comes after; the other's Setup returns, then the
// session comes and the supervisor resumes every module, then the module
// becomes attachable (the window where it could be attached twice, or
// before its record of handled ids is open).
func TestModuleLoadedDuringOutageAttachesOnce(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	n := testNode(t, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), "outage", func(c *runtime.Config) {
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 100*time.Millisecond
	})
	resumed := make(chan struct{}, 4)
	inWindow, proceed := make(chan struct{}), make(chan struct{})
	n.SetTestHooks(runtime.TestHooks{Resumed: func() { resumed <- struct{}{} }, SetUp: func(module string) {
		if module == "b" {
			close(inWindow)
			<-proceed
		}
	}})
	proxy.Down()
	waitFor(t, 10*time.Second, func() bool { return !n.Connected() })

	recA, recB := newRecorder(nil), newRecorder(nil)
	load(t, n, lateModule("a", recA, nil), runtime.ModuleConfig{}) // returns while the node is away
	loaded := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := n.Load(ctx, lateModule("b", recB, nil), runtime.ModuleConfig{})
		loaded <- err
	}()
	<-inWindow // b's Setup returned; b is not attachable yet
	proxy.Up()
	select {
	case <-resumed: // the supervisor has attached a and passed over b
	case <-time.After(time.Minute):
		t.Fatal("the node never reconnected")
	}
	close(proceed)
	if err := <-loaded; err != nil {
		t.Fatalf("load b across the reconnect: %v", err)
	}

	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, name := range []string{"a", "b"} {
		if c := consumersOf(t, raw, wire.ModuleQueue("outage", name)); c != 1 {
			t.Errorf("module %s: %d consumers on its queue, want 1", name, c)
		}
		if c := consumersOf(t, raw, wire.ServeQueue("late."+name)); c != 1 {
			t.Errorf("module %s: %d consumers on its tool's queue, want 1", name, c)
		}
	}
	for name, rec := range map[string]*recorder{"a": recA, "b": recB} {
		id, err := n.Emit(emitCtx(t), "test", "mesh.late."+name+".tick", 1)
		if err != nil {
			t.Fatal(err)
		}
		if ev := rec.next(t); ev.ID != id {
			t.Errorf("module %s handled %s, want %s", name, ev.ID, id)
		}
		var got string
		if err := n.Call(emitCtx(t), "test", "late."+name, "x", &got); err != nil || got != "x" {
			t.Errorf("call late.%s: %q, %v", name, got, err)
		}
	}
	if err := n.Close(context.Background()); err != nil && !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("close: %v", err)
	}
}

// exited waits up to limit for process pid to end: a pidfd becomes
// readable when its process exits (a process already gone has none to
// open). It reports whether it ended.
func exited(t *testing.T, pid int, limit time.Duration) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(limit.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll the pidfd of %d: %v", pid, err)
		}
		return n > 0
	}
}

// TestPluginStopDuringRestart: Stop comes while a crashed module process
// is being started again, after the new process is up and before it is
// installed (forced with hooks). Stop returns, and the new process is
// ended, not left running unsupervised.
func TestPluginStopDuringRestart(t *testing.T) {
	t.Parallel()
	bin, _ := echoModule(t)
	url := brokertest.VHost(t)
	n := testNode(t, url, "anchor", nil)
	relaunched, release := make(chan int, 1), make(chan struct{})
	var once sync.Once
	n.SetTestHooks(runtime.TestHooks{
		Relaunched: func(module string, pid int) {
			if module == "crashy" {
				relaunched <- pid
				<-release
			}
		},
		StopWaiting: func(module string) {
			if module == "crashy" {
				once.Do(func() { close(release) })
			}
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crashy, err := n.LoadPlugin(ctx, bin, []string{"crashy"}, runtime.ModuleConfig{MaxAttempts: 50, Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := crashy.PID()
	if _, err := n.Emit(emitCtx(t), "test", "mesh.crashy.boom", 1); err != nil { // it exits on it
		t.Fatal(err)
	}
	var pid int
	select {
	case pid = <-relaunched:
	case <-ctx.Done():
		t.Fatal("the crashed module process was never started again")
	}
	if pid == 0 || pid == first {
		t.Fatalf("restarted process pid %d (first %d)", pid, first)
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "crashy (its process is restarting)") {
		t.Errorf("Ready while a module process restarts: %v", err)
	}
	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stopped <- crashy.Stop(sctx)
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("stop: %v", err)
		}
	case <-ctx.Done(): // a hang, not a slow stop: Stop waited on a supervisor that never ends
		once.Do(func() { close(release) })
		t.Fatal("Stop during a restart never returned")
	}
	if !exited(t, pid, 10*time.Second) {
		t.Errorf("the module process %d started during the restart still runs after Stop", pid)
	}
	if crashy.PID() != 0 {
		t.Errorf("a stopped module reports process %d", crashy.PID())
	}
}

// TestCloseWhileHandlersIgnoreTheirContext: Close of a node whose modules'
// handlers never return (they ignore their context) returns anyway once
// the grace is over, while those handlers still run; their events go back
// to their queues, neither acknowledged nor dead-lettered.
func TestCloseWhileHandlersIgnoreTheirContext(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "stubborn", nil)
	entered, release := make(chan string, 3), make(chan struct{})
	defer close(release)
	names := []string{"a", "b", "c"}
	for _, name := range names {
		load(t, n, sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return m.On("mesh.stubborn."+name, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				entered <- name
				<-release // not ctx.Done(): it ignores the grace
				return nil
			}))
		}}, runtime.ModuleConfig{})
		if _, err := n.Emit(emitCtx(t), "test", "mesh.stubborn."+name, 1); err != nil {
			t.Fatal(err)
		}
	}
	for range names {
		<-entered
	}
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		closed <- n.Close(ctx)
	}()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(time.Minute): // a hang: Close waited for the handlers
		t.Fatal("Close waited for handlers that ignore their context")
	}
	raw := rawConn(t, url)
	for _, name := range names {
		if d := nextFrom(t, raw, wire.ModuleQueue("stubborn", name)); d.RoutingKey != "mesh.stubborn."+name || !d.Redelivered {
			t.Errorf("module %s: its queue gave back %s (redelivered %v)", name, d.RoutingKey, d.Redelivered)
		}
	}
	if got := queueDepth(t, raw, wire.QueueDead); got != 0 {
		t.Errorf("%d dead letters, want none", got)
	}
}
