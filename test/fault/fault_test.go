//go:build fault

package fault

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// streamThrough runs a stream of emits and handles on one node while
// fault runs, then checks that every confirmed emit was handled once.
func streamThrough(t *testing.T, url string, minReconnects uint64, fault func()) {
	n := newNode(t, url, "fault", nil)
	handled := newIDSet()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := n.Load(ctx, sinkModule(handled), runtime.ModuleConfig{Prefetch: 64, Concurrency: 4, MaxAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	s := startStream(t, m.Mesh(), 4)
	time.Sleep(time.Second)
	fault()
	time.Sleep(2 * time.Second) // the stream goes on after the fault
	s.end()
	awaitHandledOnce(t, s, handled)
	st := n.Stats()
	if st.Reconnects < minReconnects {
		t.Errorf("the node reconnected %d times, want at least %d", st.Reconnects, minReconnects)
	}
	summary{
		emitted: int(s.attempts.Load()), confirmed: s.confirmed.len(), handled: handled.len(),
		duplicates: int(st.Duplicates), deadLettered: int(st.DeadLettered), lost: s.confirmed.missingFrom(handled),
		extra: fmt.Sprintf("confirmed directly=%d spooled=%d resent=%d reconnects=%d", st.Emitted, st.Spooled, st.Resent, st.Reconnects),
	}.report(t)
}

// TestBrokerAppRestart: the broker application stops for 3 s and starts
// again in the middle of a stream of emits and handles.
func TestBrokerAppRestart(t *testing.T) {
	url := brokertest.VHost(t)
	ensureBrokerRuns(t)
	streamThrough(t, url, 1, func() {
		rabbitmqctl(t, "stop_app")
		time.Sleep(3 * time.Second)
		rabbitmqctl(t, "start_app")
		waitBroker(t)
	})
}

// TestDelayedEventsThroughBrokerAppRestart: the broker application stops,
// until the node sees it gone, and starts again while 400 delayed events wait in the delay
// cascade (quorum queues, at-least-once dead-lettering): every one is
// delivered, none before its delay. RabbitMQ 3.10's at-least-once
// dead-lettering can hold what a level dead-lettered across the restart
// until its worker's publisher confirm timeout
// (dead_letter_worker_publisher_confirm_timeout, 3 min by default; seen
// once as one event 3m6s late, past the test's 3 min), as after a leader
// move (ADR 32): the test lowers it to 5 s, as an operator would, and
// puts it back after.
func TestDelayedEventsThroughBrokerAppRestart(t *testing.T) {
	url := brokertest.VHost(t)
	ensureBrokerRuns(t)
	out, err := brokertest.CtlOutput("eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).")
	if err != nil {
		t.Fatalf("read dead_letter_worker_publisher_confirm_timeout: %v", err)
	}
	before := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		restore := "application:unset_env(rabbit, dead_letter_worker_publisher_confirm_timeout)."
		if v, ok := strings.CutPrefix(before, "{ok,"); ok {
			restore = "application:set_env(rabbit, dead_letter_worker_publisher_confirm_timeout, " + strings.TrimSuffix(v, "}") + ")."
		}
		rabbitmqctl(t, "eval", restore)
	})
	rabbitmqctl(t, "eval", "application:set_env(rabbit, dead_letter_worker_publisher_confirm_timeout, 5000).")
	delayedThrough(t, url, nil, 400, func(n *runtime.Node) func() {
		rabbitmqctl(t, "stop_app")
		// The outage lasts until the node has seen it.
		if !waitFor(time.Minute, func() bool { return !n.Connected() }) {
			t.Error("the node never saw the broker stop")
		}
		rabbitmqctl(t, "start_app")
		waitBroker(t)
		return nil
	})
}

// TestDelayedBurst: 10,000 delayed events across delays of 1 to 8 s,
// scheduled from 8 goroutines at once: every one delivered, none before
// its delay; the summary gives the lateness.
func TestDelayedBurst(t *testing.T) {
	delayedThrough(t, brokertest.VHost(t), nil, 10_000, func(*runtime.Node) func() { return nil })
}

// TestConnectionsClosedRepeatedly: the broker closes every connection of
// the test's virtual host five times, 700 ms apart, during a stream.
func TestConnectionsClosedRepeatedly(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	streamThrough(t, url, 5, func() {
		for range 5 {
			rabbitmqctl(t, "close_all_connections", "-p", vhost, "mesh fault test")
			time.Sleep(700 * time.Millisecond)
		}
	})
}

// TestMeshdKilledWithSpooledEvents: a module process streams emits through
// meshd; the broker becomes unreachable, so they are spooled; meshd is
// SIGKILLed; started again with the broker back, it resends the spool and
// every emit the module saw succeed arrives.
func TestMeshdKilledWithSpooledEvents(t *testing.T) {
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	meshd, module := filepath.Join(dir, "meshd"), filepath.Join(dir, "echomodule")
	for _, b := range []struct{ out, pkg string }{{meshd, "../../cmd/meshd"}, {module, "../../runtime/testdata/echomodule"}} {
		if out, err := exec.Command("go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	proxy := brokertest.NewProxy(t)
	config := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`node: faultk
amqp_url: %s
state_dir: %s
reconnect_max: 500ms
modules:
  - name: echo
    path: %s
    tools: [echo.upper]
`, strings.Replace(url, brokertest.Host(), proxy.Addr(), 1), filepath.Join(dir, "state"), module)), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(logName string) *exec.Cmd {
		logFile, err := os.Create(filepath.Join(dir, logName))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { logFile.Close() })
		cmd := exec.Command(meshd, "run", "--config", config)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
			}
		})
		return cmd
	}
	// The module writes its ids here: where meshd runs as root, as a user
	// of its own; and, dir being on the way to the state dir, Landlock
	// grants the module only the entries dir has when it starts.
	idLog := filepath.Join(dir, "emitted.ids")
	if err := os.WriteFile(idLog, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(idLog, 0o666); err != nil {
		t.Fatal(err)
	}
	first := start("meshd-1.log")

	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ch, err := raw.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(30*time.Second, func() bool {
		probe, err := raw.Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		q, err := probe.QueueDeclarePassive(wire.ModuleQueue("faultk", "echo"), true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	}) {
		out, _ := os.ReadFile(filepath.Join(dir, "meshd-1.log"))
		t.Fatalf("meshd never started consuming for its module; its log:\n%s", out)
	}
	if _, err := ch.QueueDeclare("fault.sink", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("fault.sink", "module.echo.tick", wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	delivered := newIDSet()
	deliveries, err := ch.Consume("fault.sink", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			delivered.add(d.MessageId)
		}
	}()

	driver := newNode(t, url, "driver", func(c *runtime.Config) { c.Ephemeral = true })
	const total = 1500
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := driver.Emit(ctx, "test", "mesh.test.stream", map[string]any{"do": "stream", "n": total, "log": idLog}); err != nil {
		t.Fatal(err)
	}
	lines := func() int { ids, _ := readIDs(idLog); return len(ids) }
	if !waitFor(30*time.Second, func() bool { return lines() >= 200 }) {
		out, _ := os.ReadFile(filepath.Join(dir, "meshd-1.log"))
		t.Fatalf("the module emitted %d events in 30 s; meshd's log:\n%s", lines(), out)
	}
	proxy.Down() // the broker is unreachable from meshd: emits go to its spool
	atDown := lines()
	if !waitFor(30*time.Second, func() bool { return lines() >= atDown+300 }) {
		t.Fatalf("only %d emits succeeded while the broker was unreachable", lines()-atDown)
	}
	if err := first.Process.Kill(); err != nil { // SIGKILL, spool full of events
		t.Fatal(err)
	}
	_ = first.Wait()
	emittedIDs, err := readIDs(idLog)
	if err != nil {
		t.Fatal(err)
	}
	emitted := newIDSet()
	for _, id := range emittedIDs {
		emitted.add(id)
	}
	arrivedBefore := delivered.len()
	proxy.Up()
	start("meshd-2.log")
	if !waitFor(90*time.Second, func() bool { return emitted.missingFrom(delivered) == 0 }) {
		t.Errorf("after the restart, %d of %d emitted events never arrived", emitted.missingFrom(delivered), emitted.len())
	}
	summary{
		emitted: emitted.len(), confirmed: emitted.len(), handled: delivered.len(),
		lost: emitted.missingFrom(delivered),
		extra: fmt.Sprintf("emits confirmed or spooled before the kill=%d, arrived before the restart=%d, arrived twice=%d",
			emitted.len(), arrivedBefore, delivered.overOnce()),
	}.report(t)
}

func readIDs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); len(line) == 26 {
			ids = append(ids, line)
		}
	}
	return ids, sc.Err()
}

// TestQueueAtLengthLimit: a classic queue at x-max-length with
// reject-publish, bound beside a module's queue. Emits are refused (negative
// confirms), retried with back-off and slowed down, visible in the
// node's counters; once the queue is drained every event is in it, and
// the module, which got the retries' duplicates, handled each event once.
func TestQueueAtLengthLimit(t *testing.T) {
	url := brokertest.VHost(t)
	n := newNode(t, url, "faultq", nil)
	handled := newIDSet()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n.Load(ctx, sinkModule(handled), runtime.ModuleConfig{Prefetch: 64, Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	ch := brokertest.Channel(t, url)
	if _, err := ch.QueueDeclare("fault.capped", true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-max-length": int64(10), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("fault.capped", "module.sink.#", wire.ExchangeEvents, false, nil); err != nil {
		t.Fatal(err)
	}
	const total = 60
	emitted := newIDSet()
	var wg sync.WaitGroup
	var emitErrs atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range total / 4 {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				id, err := n.Emit(ctx, "sink", "module.sink.tick", map[string]int{"w": w, "i": i})
				cancel()
				if err != nil {
					emitErrs.Add(1)
					t.Errorf("emit: %v", err)
					continue
				}
				emitted.add(id)
			}
		}()
	}
	// The queue fills; emits are refused and wait.
	if !waitFor(30*time.Second, func() bool { return n.Stats().Refused > 0 }) {
		t.Fatal("no negative confirm from the full queue")
	}
	// Its deadline is short beside the others' 90 s, and long enough for
	// the broker's negative confirm to come first on a loaded machine (at
	// 300 ms, a slow nack made it DeadlineExceeded once).
	short, cancelShort := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := n.Emit(short, "sink", "module.sink.tick", 1)
	cancelShort()
	if !errors.Is(err, wire.ErrRefused) {
		t.Errorf("an emit with a short deadline into the full queue: %v, want ErrRefused", err)
	}
	refusedWhileFull := n.Stats().Refused
	// Drain slowly: every event ends up in the capped queue once the
	// refused ones are retried.
	drained := newIDSet()
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume("fault.capped", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range deliveries {
			drained.add(d.MessageId)
			time.Sleep(20 * time.Millisecond)
			_ = d.Ack(false)
		}
	}()
	wg.Wait()
	if !waitFor(60*time.Second, func() bool {
		return emitted.missingFrom(drained) == 0 && emitted.missingFrom(handled) == 0
	}) {
		t.Errorf("capped queue got %d, module handled %d, of %d emitted", drained.len(), handled.len(), emitted.len())
	}
	st := n.Stats()
	if handled.overOnce() > 0 {
		t.Errorf("%d events reached the module's handler twice", handled.overOnce())
	}
	summary{
		emitted: total, confirmed: emitted.len(), handled: handled.len(), duplicates: int(st.Duplicates),
		deadLettered: int(st.DeadLettered), lost: emitted.missingFrom(drained) + emitted.missingFrom(handled),
		extra: fmt.Sprintf("negative confirms=%d (%d while full), in the capped queue=%d, emits that failed=%d",
			st.Refused, refusedWhileFull, drained.len(), emitErrs.Load()),
	}.report(t)
}

// TestRetryLongerThanConsumerTimeout: on a broker whose consumer_timeout
// is 2 s, a delivery held past it closes its channel (checked first with
// raw amqp091-go, so the test can fail: RabbitMQ 3.10 checks once a
// minute), while a module whose retry back-off of 70 s, past a check,
// waits in the delay cascade gets its second attempt as a fresh delivery,
// handled, its channel never closed by the broker.
func TestRetryLongerThanConsumerTimeout(t *testing.T) {
	url := brokertest.VHost(t)
	out, err := brokertest.CtlOutput("eval", "application:get_env(rabbit, consumer_timeout).")
	if err != nil {
		t.Fatalf("read consumer_timeout: %v", err)
	}
	before := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		restore := "application:unset_env(rabbit, consumer_timeout)."
		if v, ok := strings.CutPrefix(before, "{ok,"); ok {
			restore = "application:set_env(rabbit, consumer_timeout, " + strings.TrimSuffix(v, "}") + ")."
		}
		rabbitmqctl(t, "eval", restore)
	})
	rabbitmqctl(t, "eval", "application:set_env(rabbit, consumer_timeout, 2000).")

	// The control: a delivery held past 2 s closes its channel with 406.
	// It runs beside the module's part, each waiting for a check of the
	// broker's (a minute apart), so the test waits for one, not two.
	ch := brokertest.Channel(t, url)
	if _, err := ch.QueueDeclare("held", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", "held", false, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := ch.Consume("held", "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// What the control saw, logged by the test itself (never from the
	// goroutine, which may outlive a test that failed first).
	type control struct {
		after time.Duration
		err   error
	}
	controlled := make(chan control, 1)
	go func() {
		select {
		case e := <-closed:
			if e == nil || e.Code != amqp.PreconditionFailed {
				controlled <- control{err: fmt.Errorf("the held delivery's channel closed with %v, want 406 (delivery acknowledgement timed out)", e)}
				return
			}
			controlled <- control{after: time.Since(start)}
		case <-time.After(3 * time.Minute):
			controlled <- control{err: errors.New("the broker never enforced its consumer_timeout of 2 s: this test proves nothing")}
		}
	}()

	short := runtime.ModuleConfig{HandlerTimeout: 500 * time.Millisecond, Prefetch: 1}
	n := newNode(t, url, "patient", func(c *runtime.Config) {
		c.Delays, c.RetryScheduleFrom, c.ConsumerTimeout, c.Module = true, time.Second, 2*time.Second, short
	})
	type try struct {
		attempt     int
		redelivered bool
		at          time.Time
	}
	tries := make(chan try, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := n.Load(ctx, sdk.Module{Name: "pay", Emits: []string{"charge"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.pay.charge", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			tries <- try{ev.Attempt, ev.Redelivered, time.Now()}
			if ev.Attempt == 1 {
				return errors.New("the bank is closed")
			}
			return nil
		}))
	}}, runtime.ModuleConfig{Retry: []time.Duration{70 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Mesh().Emit(ctx, "charge", 1); err != nil {
		t.Fatal(err)
	}
	var got []try
	for len(got) < 2 {
		select {
		case tr := <-tries:
			got = append(got, tr)
		case <-time.After(3 * time.Minute):
			t.Fatalf("attempts %+v", got)
		}
	}
	c := <-controlled
	if c.err != nil {
		t.Fatal(c.err)
	}
	t.Logf("the broker closed the channel holding a delivery after %v", c.after.Round(100*time.Millisecond))
	if got[1].attempt != 2 || got[1].redelivered || got[1].at.Sub(got[0].at) < 70*time.Second {
		t.Errorf("the retry: %+v after %+v; want attempt 2, a fresh delivery, 70 s or more later", got[1], got[0])
	}
	st := n.Stats()
	if st.RetriesScheduled != 1 || st.ConsumersLost != 0 || st.Disconnects != 0 {
		t.Errorf("stats: retries scheduled %d, consumers lost %d, disconnects %d; want 1, 0, 0", st.RetriesScheduled, st.ConsumersLost, st.Disconnects)
	}
	fmt.Printf("summary %s: emitted=1 confirmed=1 handled=1 duplicates_suppressed=%d dead_lettered=%d lost=0 (a retry of 70 s past a consumer_timeout of 2 s, through the delay cascade)\n",
		t.Name(), st.Duplicates, st.DeadLettered)
}
