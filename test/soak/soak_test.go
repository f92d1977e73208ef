//go:build soak

// Package soak is the nemesis soak (make soak; issue 24). On a three-node
// cluster of its own (scripts/cluster.sh), a mesh of three nodes: edge, a
// node in this process that emits orders and runs the sink of their done
// events; beta and gamma, two meshd processes each running the worker
// module process (it calls tax.rate inside its handler and emits done),
// with tax on gamma, the audit logger on beta, and on gamma a consumed
// outside queue that a raw amqp091-go publisher feeds; the same publisher
// feeds a second outside queue that the dispatcher's trigger on beta takes,
// handing each message to stamp.job, which the agent on gamma serves by
// running a shell script. Every node reaches
// every broker node through a proxy of its own. A nemesis applies random,
// overlapping faults from a seeded schedule: connection cuts, partitions
// of a node from the brokers, a full spool, broker node SIGKILL and
// restart, the quorum leader's node killed, a broker node cut off from the
// other two, memory alarms, SIGKILL and
// SIGSTOP of module processes, SIGKILL and restart of meshd, the consumed
// queue deleted and declared again. Then the faults stop, the mesh
// settles, and a checker reads the whole history.
//
// SOAK (default 10m) is how long each seed's faults go on; SOAK_SEEDS
// (comma-separated numbers or "random"; default SOAK_SEED, else random)
// are the seeds; SOAK_PACE (default 40ms) is each of the four emitters'
// pause between emits.
package soak

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite" // the ledger's database, read by the checker

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/clustertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

type order struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

const (
	legacyQueue = "soak.legacy"
	// jobsQueue is the outside queue the dispatcher's trigger takes, each
	// message handed to stamp.job, which the agent serves by running
	// stampScript.
	jobsQueue = "soak.jobs"
)

// stampScript is the agent's command for stamp.job: it writes the run to
// the history (the job's message id and the call's request id, and the
// agent's pid: the command's parent is the agent's supervisor, whose
// parent is the agent; 0 when the agent is gone already, its supervisor
// adopted) and answers. HISTORY is replaced by the history file's path.
const stampScript = `#!/bin/sh
agent=$(cut -d' ' -f4 /proc/$PPID/stat)
case "$(tr '\0' ' ' < /proc/$agent/cmdline 2>/dev/null)" in
*/agent*) ;;
*) agent=0 ;;
esac
req=$(cat)
job=$(printf '%s' "$req" | sed -n 's/.*"message_id":"\([^"]*\)".*/\1/p')
call=$(printf '%s' "$req" | sed -n 's/^{"tool":"[^"]*","id":"\([^"]*\)".*/\1/p')
printf 'stamped gamma %s/%s %s %s\n' "$job" "$call" "$agent" "$(date +%s%N)" >> HISTORY
printf '{"stamped":"%s"}\n' "$job"
`

// keptDir is a directory for a soak's history, configs and logs, readable
// by the module processes' users; removed when t passes, kept (and what
// says where) when it fails.
func keptDir(t *testing.T, what, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		soakFatal(t, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		soakFatal(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			fmt.Printf("%s: history, configs and meshd logs kept in %s\n", what, dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

func soakLength(t *testing.T) time.Duration {
	s := os.Getenv("SOAK")
	if s == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		soakFatalf(t, "SOAK=%q: %v", s, err)
	}
	return d
}

func soakSeeds(t *testing.T) []uint64 {
	list := os.Getenv("SOAK_SEEDS")
	if list == "" {
		list = os.Getenv("SOAK_SEED")
	}
	if list == "" {
		list = "random"
	}
	var seeds []uint64
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "random" {
			seeds = append(seeds, rand.Uint64()>>1)
			continue
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			soakFatalf(t, "SOAK_SEEDS=%q: %q is neither a number nor random", list, s)
		}
		seeds = append(seeds, n)
	}
	return seeds
}

func quietLogger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// binaries are what the soak runs: meshd and the module binaries.
type binaries struct{ meshd, module, audit, dispatcher, agent string }

func build(t *testing.T) binaries {
	dir := testdir.Reachable(t)
	b := binaries{meshd: filepath.Join(dir, "meshd"), module: filepath.Join(dir, "soakmodule"), audit: filepath.Join(dir, "audit-logger"),
		dispatcher: filepath.Join(dir, "dispatcher"), agent: filepath.Join(dir, "agent")}
	for out, pkg := range map[string]string{b.meshd: "../../cmd/meshd", b.module: "./soakmodule", b.audit: "../../auditlogger/cmd/audit-logger",
		b.dispatcher: "../../modules/dispatcher/cmd/dispatcher", b.agent: "../../modules/agent/cmd/agent"} {
		if o, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			soakFatalf(t, "build %s: %v\n%s", pkg, err, o)
		}
	}
	return b
}

func TestSoak(t *testing.T) {
	length, seeds := soakLength(t), soakSeeds(t)
	pace := 40 * time.Millisecond // 100 orders/s: what two workers on this machine's cluster keep up with between faults
	if v := os.Getenv("SOAK_PACE"); v != "" {
		var err error
		if pace, err = time.ParseDuration(v); err != nil {
			soakFatalf(t, "SOAK_PACE=%q: %v", v, err)
		}
	}
	bins := build(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { soak(t, bins, length, pace, seed) })
	}
}

// failures are the soak's failures, by test, said again at its end
// (TestMain): the output's end is what a CI report shows.
var failures struct {
	mu   sync.Mutex
	list []string
}

// soakErrorf is t.Errorf, recorded in failures.
func soakErrorf(t testing.TB, format string, args ...any) {
	t.Helper()
	failed(t, fmt.Sprintf(format, args...))
	t.Errorf(format, args...)
}

// soakFatalf is t.Fatalf, recorded in failures.
func soakFatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	failed(t, fmt.Sprintf(format, args...))
	t.Fatalf(format, args...)
}

// soakFatal is t.Fatal, recorded in failures.
func soakFatal(t testing.TB, args ...any) {
	t.Helper()
	failed(t, fmt.Sprint(args...))
	t.Fatal(args...)
}

func failed(t testing.TB, msg string) {
	failures.mu.Lock()
	defer failures.mu.Unlock()
	failures.list = append(failures.list, t.Name()+": "+msg)
}

// nodes are the mesh's nodes; each reaches broker node i through
// proxies[node][i-1].
var nodes = []string{"edge", "beta", "gamma"}

func soak(t *testing.T, bins binaries, length, pace time.Duration, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	fmt.Printf("soak seed=%d length=%v (SOAK_SEEDS=%d repeats its schedule)\n", seed, length, seed)

	dir := keptDir(t, fmt.Sprintf("soak seed=%d", seed), fmt.Sprintf("mesh-soak-%d-", seed))

	vhost := fmt.Sprintf("mesh-soak-%d-%d", seed, time.Now().UnixNano())
	if _, err := cluster.CtlAny("add_vhost", vhost); err != nil {
		soakFatal(t, err)
	}
	t.Cleanup(func() {
		if _, err := cluster.CtlAny("delete_vhost", vhost); err != nil {
			soakErrorf(t, "delete the soak's virtual host: %v", err)
		}
	})
	if _, err := cluster.CtlAny("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"); err != nil {
		soakFatal(t, err)
	}
	proxies := map[string][]*brokertest.Proxy{}
	urls := map[string][]string{}
	for _, n := range nodes {
		for i := 1; i <= clustertest.Size; i++ {
			p := brokertest.NewProxyTo(t, cluster.AMQPAddr(i))
			proxies[n] = append(proxies[n], p)
			urls[n] = append(urls[n], fmt.Sprintf("amqp://guest:guest@%s/%s", p.Addr(), vhost))
		}
	}

	h := newHistory()
	histPath := filepath.Join(dir, "history")
	if err := os.WriteFile(histPath, nil, 0o666); err != nil {
		soakFatal(t, err)
	}
	if err := os.Chmod(histPath, 0o666); err != nil { // module processes of their own users write it
		soakFatal(t, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stamp.sh"), []byte(strings.ReplaceAll(stampScript, "HISTORY", histPath)), 0o755); err != nil {
		soakFatal(t, err)
	}

	// The raw side: the consumed queue, declared and fed from outside.
	rc := &rawClient{vhost: vhost}
	t.Cleanup(rc.close)
	declareLegacy := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(legacyQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}
	if err := rc.do(declareLegacy); err != nil {
		soakFatal(t, err)
	}
	if err := rc.do(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(jobsQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}); err != nil {
		soakFatal(t, err)
	}

	// meshd beta and gamma, with their module processes.
	mds := map[string]*meshd{}
	for _, n := range []string{"beta", "gamma"} {
		m := &meshd{name: n, bin: bins.meshd, dir: dir, http: freeAddr(t), config: filepath.Join(dir, n+".yaml")}
		if err := os.WriteFile(m.config, []byte(meshdConfig(n, urls[n], filepath.Join(dir, n), m.http, bins, histPath)), 0o600); err != nil {
			soakFatal(t, err)
		}
		if err := m.start(); err != nil {
			soakFatal(t, err)
		}
		t.Cleanup(m.stop)
		mds[n] = m
	}
	for _, m := range mds {
		if err := m.awaitReady(); err != nil {
			soakFatal(t, err)
		}
	}

	// edge: the emitters and the sink, in this process.
	edge := newEdge(t, urls["edge"], filepath.Join(dir, "edge"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := edge.Load(ctx, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error {
		booked := m.On("module.ledger.booked", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			h.mu.Lock()
			if h.booked[o.ID] == nil {
				h.booked[o.ID] = map[string]bool{}
			}
			h.booked[o.ID][ev.ID] = true
			h.mu.Unlock()
			return nil
		}))
		if booked != nil {
			return booked
		}
		return m.On("module.worker.done", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			h.mu.Lock()
			h.done[o.ID]++
			h.doneIDs[ev.ID] = true
			h.mu.Unlock()
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 50, HandlerTimeout: 20 * time.Second})
	cancel()
	if err != nil {
		soakFatal(t, err)
	}

	// The workload: four emitters of orders on edge; a raw publisher into
	// the consumed queue.
	stop := make(chan struct{})
	var workload sync.WaitGroup
	var seq atomic.Int64
	for w := range 4 {
		workload.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				o := order{ID: fmt.Sprintf("o-%d-%d", w, i), N: int(i)}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id, err := edge.Emit(ctx, "shop", "module.shop.order", o)
				cancel()
				h.mu.Lock()
				switch {
				case err == nil:
					h.confirmed[o.ID] = id
				case errors.Is(err, wire.ErrBackPressure):
					h.refused["spool_full"]++
				case errors.Is(err, context.DeadlineExceeded):
					h.refused["timeout"]++
				default:
					h.refused["other"]++
				}
				h.mu.Unlock()
				pause(pace)
			}
		})
	}
	// Publishing and the queue's deletion, one at a time; each confirmed
	// message logged with its time.
	var legacyMu sync.Mutex
	published, err := os.Create(filepath.Join(dir, "legacy.log"))
	if err != nil {
		soakFatal(t, err)
	}
	defer published.Close()
	workload.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("l-%d", i)
			legacyMu.Lock()
			err := rc.publish(legacyQueue, amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
			if err == nil {
				h.mu.Lock()
				h.legacyIn[id] = true
				h.mu.Unlock()
				fmt.Fprintf(published, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), id)
			}
			legacyMu.Unlock()
			pause(20 * time.Millisecond)
		}
	})

	// Jobs for the dispatcher, with ULID ids (so that its calls' request
	// ids derive from them, and a redelivery's call is the same call).
	workload.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := ulid.Make().String()
			err := rc.publish(jobsQueue, amqp.Publishing{MessageId: id, ContentType: "application/json",
				Body: []byte(`{"job":"` + id + `"}`), DeliveryMode: amqp.Persistent})
			if err == nil {
				h.mu.Lock()
				h.jobsIn[id] = true
				h.mu.Unlock()
			}
			pause(50 * time.Millisecond)
		}
	})

	// A few seconds of the workload without faults, then what meshd and
	// this process use, to hold the end against.
	pause(5 * time.Second)
	startUsage := map[string]usage{}
	for n, m := range mds {
		u, err := m.usage()
		if err != nil {
			soakFatal(t, err)
		}
		startUsage[n] = u
	}
	startGoroutines := goruntime.NumGoroutine()

	timeline, err := os.Create(filepath.Join(dir, "nemesis.log"))
	if err != nil {
		soakFatal(t, err)
	}
	defer timeline.Close()
	faults := nemesis(t, rng, length, &nemesisTargets{h: h, timeline: timeline, proxies: proxies, mds: mds, vhost: vhost, rc: rc, legacyMu: &legacyMu, declareLegacy: declareLegacy})
	close(stop)
	workload.Wait()

	// Settle: until nothing is missing, or nothing more arrives for a
	// minute (10 minutes at most): a backlog left by the faults drains.
	ended := time.Now()
	hr := &historyReader{path: histPath}
	missing := func() int {
		if err := hr.readInto(h); err != nil {
			soakFatal(t, err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		n := 0
		for id := range h.confirmed {
			if len(h.handled["beta/"+id]) == 0 || len(h.handled["gamma/"+id]) == 0 || h.done[id] == 0 || len(h.booked[id]) == 0 {
				n++
			}
		}
		for id := range h.legacyIn {
			if len(h.legacy[id]) == 0 {
				n++
			}
		}
		for id := range h.jobsIn {
			if len(h.stamped[id]) == 0 {
				n++
			}
		}
		h.mu.Unlock()
		// And the audit logger has taken what its queue holds (it is
		// checked against its database once beta stops).
		_ = rc.do(func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclarePassive(wire.ModuleQueue("beta", "audit-logger"), true, false, false, false, nil)
			if err == nil {
				n += q.Messages
			}
			return err
		})
		h.mu.Lock()
		return n
	}
	progressAt, last := time.Now(), -1
	for time.Since(progressAt) < time.Minute && time.Since(ended) < 10*time.Minute {
		n := missing()
		if n == 0 {
			break
		}
		if n != last {
			progressAt, last = time.Now(), n
		}
		pause(time.Second)
	}
	missing()
	settled := time.Since(ended).Round(time.Second)

	// What the broker holds: unacked deliveries (a moment to settle: the
	// heartbeats keep arriving), what is left, the dead letters.
	unacked, left := queueCounts(t, vhost)
	for i := 0; unacked > 0 && i < 10; i++ {
		pause(time.Second)
		unacked, left = queueCounts(t, vhost)
	}
	if unacked > 0 {
		// Who holds them: each channel's consumers and unacknowledged
		// count, to tell a node's worker from a reader.
		if out, err := cluster.CtlAny("list_channels", "-p", vhost, "name", "consumer_count", "messages_unacknowledged", "prefetch_count"); err == nil {
			t.Logf("channels:\n%s", out)
		}
		if out, err := cluster.CtlAny("list_consumers", "-p", vhost, "queue_name", "channel_pid", "consumer_tag", "prefetch_count", "active"); err == nil {
			t.Logf("consumers:\n%s", out)
		}
	}
	dead, err := readDeadLetters(vhost)
	if err != nil {
		soakErrorf(t, "the dead letters: %v", err)
	}
	endUsage := map[string]usage{}
	for n, m := range mds {
		u, err := m.usage()
		if err != nil {
			t.Error(err)
		}
		endUsage[n] = u
	}
	endGoroutines := goruntime.NumGoroutine()

	// The audit log, read once beta's meshd has stopped.
	mds["beta"].stop()
	a, err := readAudit(filepath.Join(dir, "beta", "modules", "audit-logger", "audit.db"), h)
	if err != nil {
		soakErrorf(t, "audit log: %v", err)
	}

	applied, err := readLedger(ledgerDB(histPath))
	if err != nil {
		soakErrorf(t, "the ledger's database: %v", err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	// The ledger (inbox and outbox): each confirmed order's effect applied
	// exactly once, each applied order's event published under one id.
	var effectsLost, effectsDoubled, outboxLost, outboxDoubled int
	for id := range h.confirmed {
		if applied[id] == 0 && !dead.orders[wire.ModuleQueue("gamma", "ledger")+"/"+id] {
			effectsLost++
		}
	}
	for id, times := range applied {
		if times > 1 {
			effectsDoubled++
		}
		switch n := len(h.booked[id]); {
		case n == 0:
			outboxLost++
		case n > 1:
			outboxDoubled++
		}
	}
	var lost, doneLost, doneDup, legacyLost, jobsLost int
	for id := range h.confirmed {
		for _, n := range []string{"beta", "gamma"} {
			if len(h.handled[n+"/"+id]) == 0 && !dead.orders[wire.ModuleQueue(n, "worker")+"/"+id] {
				lost++
			}
		}
		if h.done[id] == 0 {
			doneLost++
		}
	}
	for _, n := range h.done {
		if n > 1 {
			doneDup++
		}
	}
	for id := range h.legacyIn {
		if len(h.legacy[id]) == 0 {
			legacyLost++
		}
	}
	for id := range h.jobsIn {
		if len(h.stamped[id]) == 0 && !dead.jobs[id] {
			jobsLost++
		}
	}
	rerun, dup, dupEx := h.repeats(h.handled)
	// The dispatcher's tool calls: an attempt that failed (the call timed
	// out, say) is tried again as a new call (its request says the
	// attempt), which the agent runs (jobs_retried); one call repeated is
	// answered from the stored answer, and runs again only when the
	// agent's process (or its meshd) was interrupted.
	jobsRerun, jobsDup, jobsEx := h.repeats(h.stampedCalls)
	jobsRetried := 0
	for _, rs := range h.stamped {
		jobsRetried += len(rs) - 1
	}
	jobsRetried -= jobsRerun + jobsDup
	toolRerun, toolDup, toolEx := h.repeats(h.taxed)
	// Consume is at least once (the runtime de-duplicates a module's own
	// queue, not an outside queue's messages, which need not have an id):
	// a repeat there is counted, not a violation.
	legacyRerun, legacyDup, _ := h.repeats(h.legacy)
	legacyRerun += legacyDup
	leaks := 0
	var use []string
	for _, n := range []string{"beta", "gamma"} {
		s, e := startUsage[n], endUsage[n]
		use = append(use, fmt.Sprintf("%s:%v→%v", n, s, e))
		if e.goroutines > 2*s.goroutines+100 {
			leaks++
		}
	}
	use = append(use, fmt.Sprintf("test:%dg→%dg", startGoroutines, endGoroutines))
	total := 0
	for _, n := range faults {
		total += n
	}
	js, _ := json.Marshal(faults)
	refused, _ := json.Marshal(h.refused)
	deadWhy, _ := json.Marshal(dead.why)
	fmt.Printf("soak seed=%d faults=%d %s settled=%v confirmed=%d refused=%s lost=%d dup=%d rerun=%d done_lost=%d done_dup=%d tool_repeated=%d tool_rerun=%d dead=%d jobs_dead=%d expired=%d %s false_dead=%d legacy=%d legacy_lost=%d legacy_rerun=%d jobs=%d jobs_lost=%d jobs_dup=%d jobs_rerun=%d jobs_retried=%d audit_missing=%d audit_doubled=%d effects_lost=%d effects_doubled=%d outbox_lost=%d outbox_doubled=%d unacked=%d left=%d leaks=%d use=%s\n",
		seed, total, js, settled, len(h.confirmed), refused, lost, dup, rerun, doneLost, doneDup, toolDup, toolRerun, len(dead.orders), len(dead.jobs), dead.expired, deadWhy, dead.false,
		len(h.legacyIn), legacyLost, legacyRerun, len(h.jobsIn), jobsLost, jobsDup, jobsRerun, jobsRetried, a.missing, a.doubled, effectsLost, effectsDoubled, outboxLost, outboxDoubled, unacked, left, leaks, strings.Join(use, ","))
	if lost+dup+doneLost+doneDup+toolDup+dead.false+legacyLost+jobsLost+jobsDup+a.missing+a.doubled+effectsLost+effectsDoubled+outboxLost+outboxDoubled+unacked+leaks != 0 {
		soakErrorf(t, "violations (seed %d); repeats not explained by the nemesis: handled %v, tool %v, jobs %v", seed, dupEx, toolEx, jobsEx)
	}
}

// ledgerDB is the ledger module's database, in its module directory of
// gamma's state dir (the soak's dir holds the history file).
func ledgerDB(hist string) string {
	return filepath.Join(filepath.Dir(hist), "gamma", "modules", "ledger", "ledger.db")
}

// readLedger reads how many times the ledger applied each order.
func readLedger(path string) (map[string]int, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query(`SELECT order_id, times FROM applied`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	applied := map[string]int{}
	for rows.Next() {
		var id string
		var times int
		if err := rows.Scan(&id, &times); err != nil {
			return nil, err
		}
		applied[id] = times
	}
	return applied, rows.Err()
}

// meshdHead writes what every soak node's config begins with: its name,
// brokers, state dir and HTTP address, quick reconnects and retries,
// heartbeats every second; then "modules:".
func meshdHead(b *strings.Builder, name string, urls []string, state, httpAddr string) {
	fmt.Fprintf(b, "node: %s\namqp_urls:\n", name)
	for _, u := range urls {
		fmt.Fprintf(b, "  - %s\n", u)
	}
	fmt.Fprintf(b, `state_dir: %s
http_addr: %s
reconnect_min: 50ms
reconnect_max: 1s
retry_min: 20ms
retry_max: 2s
heartbeat_interval: 1s
grace: 5s
modules:
`, state, httpAddr)
}

// meshdConfig is the config of meshd node name.
func meshdConfig(name string, urls []string, state, httpAddr string, bins binaries, hist string) string {
	var b strings.Builder
	meshdHead(&b, name, urls, state, httpAddr)
	worker := fmt.Sprintf(`  - name: worker
    path: %s
    args: [worker, %s, %s%%s]
    concurrency: 4
    max_attempts: 50
    handler_timeout: 5s
    calls: [tax.rate]
`, bins.module, name, hist)
	switch name {
	case "beta":
		fmt.Fprintf(&b, worker, "")
		fmt.Fprintf(&b, `  - name: audit-logger
    path: %s
    prefetch: 256
    concurrency: 64
    tools: ["audit.*"]
    dead_letters: ["#"]
  - name: dispatcher
    kind: dispatcher
    path: %s
    tools: ["dispatcher.*"]
    consumes: [%s]
    calls: [stamp.job]
    max_attempts: 50
    handler_timeout: 10s
    config:
      triggers:
        - {name: jobs, queue: %s, tool: stamp.job, max_concurrent_runs: 4, timeout: 5s}
`, bins.audit, bins.dispatcher, jobsQueue, jobsQueue)
	case "gamma":
		fmt.Fprintf(&b, worker, ", "+legacyQueue)
		fmt.Fprintf(&b, "    consumes: [%s]\n", legacyQueue)
		fmt.Fprintf(&b, `  - name: ledger
    path: %s
    args: [ledger, %s, %s]
    max_attempts: 50
    handler_timeout: 10s
  - name: tax
    path: %s
    args: [tax, %s, %s]
    tools: [tax.*]
  - name: agent
    kind: agent
    path: %s
    tools: [stamp.job]
    config:
      tools:
        - {key: stamp.job, command: /bin/sh, args: [%s], timeout: 5s, max_concurrency: 4}
`, bins.module, name, hist, bins.module, name, hist, bins.agent, filepath.Join(filepath.Dir(hist), "stamp.sh"))
	}
	return b.String()
}

// newEdge starts the in-process node edge.
func newEdge(t *testing.T, urls []string, state string) *runtime.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "edge", AMQPURLs: urls, StateDir: state, Logger: quietLogger(),
		RetryMin: 20 * time.Millisecond, RetryMax: 2 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
		HeartbeatInterval: time.Second,
		// Small, so that a partition of a few seconds fills it: the
		// emits past it are refused with ErrBackPressure, none is lost.
		SpoolMaxBytes: 256 << 10})
	if err != nil {
		soakFatalf(t, "node edge: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

// deadLetters are what mesh.dead-letters holds at the end.
type deadLetters struct {
	orders map[string]bool // QUEUE/ORDER of each order a worker's handler failed on until it gave up
	jobs   map[string]bool // jobs whose tool call failed until the dispatcher gave up
	why    map[string]int  // their last errors, cut to the first words
	false  int             // dead letters with no handler failure behind them
	// expired counts events whose TTL ran out in a queue (heartbeats,
	// while a consumer was away): the broker sets them aside, as
	// sdk.WithTTL says.
	expired int
}

// readDeadLetters reads every dead letter and leaves them in the queue
// (fetched unacked; closing the channel returns them). A worker's dead
// letter whose last error is its handler's (a tool call or an emit that
// failed until the attempts ran out, as while the tool's serve queue's
// broker node is down) is a true one, and so is an event whose TTL ran out
// in a queue; any other is false: the sink never fails, and the worker
// fails only that way.
func readDeadLetters(vhost string) (deadLetters, error) {
	dl := deadLetters{orders: map[string]bool{}, jobs: map[string]bool{}, why: map[string]int{}}
	conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/%s", cluster.AMQPAddr(1), vhost))
	if err != nil {
		return dl, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return dl, err
	}
	for {
		d, ok, err := ch.Get(wire.QueueDead, false)
		if err != nil {
			return dl, err
		}
		if !ok {
			return dl, nil
		}
		if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
			if death, ok := deaths[0].(amqp.Table); ok && death["reason"] == "expired" {
				dl.expired++
				continue
			}
		}
		queue, _ := d.Headers[wire.HeaderDeadQueue].(string)
		cause, _ := d.Headers[wire.HeaderDeadError].(string)
		var o order
		_ = json.Unmarshal(d.Body, &o)
		if strings.HasSuffix(queue, ".worker.events") && (strings.HasPrefix(cause, "tax.rate: ") || strings.HasPrefix(cause, "emit done: ")) {
			dl.orders[queue+"/"+o.ID] = true
			words := strings.Fields(cause)
			dl.why[strings.Join(words[:min(len(words), 6)], " ")]++
			continue
		}
		if queue == jobsQueue && (strings.HasPrefix(cause, "tool stamp.job: ") || strings.HasPrefix(cause, "trigger jobs: ")) {
			dl.jobs[d.MessageId] = true
			words := strings.Fields(cause)
			dl.why[strings.Join(words[:min(len(words), 6)], " ")]++
			continue
		}
		dl.false++
		reason, _ := d.Headers[wire.HeaderDeadReason].(string)
		dl.why[fmt.Sprintf("FALSE %s %s from %q: %s", d.RoutingKey, reason, queue, cause)]++
	}
}

// queueCounts is the deliveries unacknowledged and the messages ready, over
// the soak's queues.
func queueCounts(t *testing.T, vhost string) (unacked, ready int) {
	out, err := cluster.CtlAny("list_queues", "-p", vhost, "name", "messages_unacknowledged", "messages_ready", "--formatter", "json")
	if err != nil {
		soakErrorf(t, "list_queues: %v", err)
		return 0, 0
	}
	var qs []struct {
		Name    string
		Unacked int `json:"messages_unacknowledged"`
		Ready   int `json:"messages_ready"`
	}
	if err := json.Unmarshal(out, &qs); err != nil {
		soakErrorf(t, "list_queues: %v: %s", err, out)
	}
	for _, q := range qs {
		if q.Unacked > 0 {
			// Which queue holds it, for the report when it stays.
			t.Logf("queue %s: %d unacknowledged, %d ready", q.Name, q.Unacked, q.Ready)
		}
		unacked += q.Unacked
		if q.Name != wire.QueueDead {
			ready += q.Ready
		}
	}
	return unacked, ready
}

// rawClient is a raw amqp091-go connection to whichever cluster node
// answers, with a confirming channel, dialled again after a failure.
type rawClient struct {
	vhost   string
	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return // what the broker returned on ch as unroutable
	next    int
}

// returned reports whether the broker returned message id on the current
// channel (it does so before confirming it). r.mu is held (inside do).
func (r *rawClient) returned(id string) bool {
	for {
		select {
		case ret := <-r.returns:
			if ret.MessageId == id {
				return true
			}
		default:
			return false
		}
	}
}

func (r *rawClient) do(f func(ch *amqp.Channel) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil || r.ch.IsClosed() {
		r.closeLocked()
		var errs []error
		for range clustertest.Size {
			r.next = r.next%clustertest.Size + 1
			conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/%s", cluster.AMQPAddr(r.next), r.vhost))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				conn.Close()
				errs = append(errs, err)
				continue
			}
			r.conn, r.ch = conn, ch
			r.returns = ch.NotifyReturn(make(chan amqp.Return, 64))
			break
		}
		if r.ch == nil {
			return errors.Join(errs...)
		}
	}
	err := f(r.ch)
	if err != nil {
		r.closeLocked()
	}
	return err
}

func (r *rawClient) closeLocked() {
	if r.conn != nil {
		r.conn.Close()
	}
	r.conn, r.ch = nil, nil
}

func (r *rawClient) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeLocked()
}

// historyReader reads the module processes' history file as it grows.
type historyReader struct {
	path   string
	offset int64
}

func (hr *historyReader) readInto(h *history) error {
	f, err := os.Open(hr.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(hr.offset, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	end := strings.LastIndexByte(string(b), '\n') + 1 // whole lines only
	hr.offset += int64(end)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parse(string(b[:end]))
}

// pause waits d: the workload's pace and the nemesis's schedule, not a
// wait for the system.
func pause(d time.Duration) { <-time.After(d) }

// publish sends p to queue, mandatory, and waits up to 10 s for its
// confirm: nil only if the broker confirmed it and did not return it.
func (rc *rawClient) publish(queue string, p amqp.Publishing) error {
	return rc.do(func(ch *amqp.Channel) error {
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, p)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("not confirmed: %v", err)
		}
		if rc.returned(p.MessageId) {
			return errors.New("returned: the queue is not there")
		}
		return nil
	})
}
