//go:build soak

package soak

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the effects, read by the checker
	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/pgtest"
	"github.com/meshkit/mesh/internal/proctest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
	"github.com/meshkit/mesh/sdk"
)

// orderPartitions is the orderers' partition count.
const orderPartitions = 16

// TestSoakOrder is the order checker under faults (issue 61; ADR 48). On
// the shared broker, the orderer module runs as one group (group: orders,
// partitions: 16) on meshd n1, n2 and n3, each event's effect applied
// through the inbox on one PostgreSQL. ORDER_KEYS keys (default 10,000),
// ORDER_EVENTS events each (default 20), come from three publishers, each
// key from one, its events in order: edge, a node in this process
// (sdk.WithKey); the feeder, a module process under n1 (its emits keyed by
// the module protocol), fed ranges of keys by edge; and a raw amqp091-go
// client stamping x-partition-key itself (half of its keys with the slot
// header too, half through the group's intake). While they publish, and
// for SOAK (default 10m) at least, a seeded nemesis SIGKILLs orderer
// processes and meshd (started again); n4 joins at a third of it, n2
// leaves for good at two thirds, and the operator changes the group's
// partition count live (runtime.StartRepartition, as meshctl groups
// repartition) to 32 at half of it and back to 16 at five sixths, the
// faults going on meanwhile. Then the mesh settles, and the checker
// reads the effects and what each handler saw: per key, inversions,
// lost and duplicated effects (all zero), the time each slot had no
// owner, and how long slots of a killed meshd waited for another member. Last, with a trickle of events on every partition, each live
// node's mesh_group_partitions_owned must show the spread (5, 5 and 6).
func TestSoakOrder(t *testing.T) {
	length, seed := soakLength(t), soakSeeds(t)[0]
	keys, events := envInt(t, "ORDER_KEYS", 10000), envInt(t, "ORDER_EVENTS", 20)
	bins := build(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed270b27a9f1c3))
	fmt.Printf("order soak seed=%d length=%v keys=%d events=%d (SOAK_SEEDS=%d repeats its schedule)\n", seed, length, keys, events, seed)

	dir := keptDir(t, fmt.Sprintf("order soak seed=%d", seed), fmt.Sprintf("mesh-order-%d-", seed))
	// The shared broker, in a virtual host of its own: the nemesis here
	// kills the mesh's processes, not the broker's (TestSoak does that,
	// on its cluster), and three broker nodes replicating every event
	// on this machine's two cores would leave the mesh no time of its own.
	urls := []string{brokertest.VHost(t)}

	// The effects' database: commits need not reach the disk (the
	// server is never killed; its clients are).
	dsn := pgtest.Start(t)
	pg, err := url.Parse(dsn)
	if err != nil {
		soakFatal(t, err)
	}
	dsn += "&synchronous_commit=off"
	histPath := filepath.Join(dir, "history")
	if err := os.WriteFile(histPath, nil, 0o666); err != nil {
		soakFatal(t, err)
	}
	if err := os.Chmod(histPath, 0o666); err != nil { // module processes of their own users write it
		soakFatal(t, err)
	}

	mds := map[string]*meshd{}
	startNode := func(name string) {
		t.Helper()
		m := &meshd{name: name, bin: bins.meshd, dir: dir, http: freeAddr(t), config: filepath.Join(dir, name+".yaml")}
		if err := os.WriteFile(m.config, []byte(orderConfig(name, urls, filepath.Join(dir, name), m.http, bins.module, histPath, dsn, pg.Port())), 0o600); err != nil {
			soakFatal(t, err)
		}
		if err := m.start(); err != nil {
			soakFatal(t, err)
		}
		t.Cleanup(m.stop)
		if err := m.awaitReady(); err != nil {
			soakFatal(t, err)
		}
		mds[name] = m
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		startNode(n)
	}
	edge := newEdge(t, urls, filepath.Join(dir, "edge"))

	// Who publishes which key: edge 40%, the feeder 30%, raw 30%.
	var (
		eKeys = keys * 4 / 10
		fKeys = keys * 3 / 10
		rKeys = keys - eKeys - fKeys
		sent  = newSentLog()
	)
	for i := range fKeys {
		sent.expect(fmt.Sprintf("f-%d", i), 0)
	}
	stop := make(chan struct{})
	var publishers sync.WaitGroup
	// edge: eight emitters, each with its share of the keys.
	for w := range 8 {
		publishers.Go(func() {
			for seq := 1; seq <= events; seq++ {
				for i := w; i < eKeys; i += 8 {
					key := fmt.Sprintf("e-%d", i)
					if sent.broken(key) {
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err := edge.Emit(ctx, "shop", "module.shop.keyed", keyedEvent{Key: key, Seq: seq, At: time.Now().UnixNano()}, sdk.WithKey(key))
					cancel()
					sent.record(key, seq, err)
				}
			}
		})
	}
	// The feeder: ranges of 50 keys, each emitted by the feeder on n1.
	publishers.Go(func() {
		for from := 0; from < fKeys; from += 50 {
			f := feedOrder{Prefix: "f-", From: from, To: min(from+50, fKeys), Count: events}
			for attempt := 1; ; attempt++ {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := edge.Emit(ctx, "shop", "module.shop.feed", f)
				cancel()
				if err == nil {
					break
				}
				if attempt == 10 {
					soakErrorf(t, "feed %d-%d not emitted after %d attempts: %v", f.From, f.To, attempt, err)
					return
				}
				t.Logf("feed %d-%d not emitted, again: %v", f.From, f.To, err)
			}
			for i := f.From; i < f.To; i++ {
				sent.expect(fmt.Sprintf("f-%d", i), events)
			}
		}
	})
	// raw: one channel, confirms in flight.
	raw, err := amqp.Dial(urls[0])
	if err != nil {
		soakFatal(t, err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	publishers.Go(func() { rawPublish(t, raw, rKeys, events, sent) })
	published := make(chan struct{})
	go func() { publishers.Wait(); close(published) }()

	// The nemesis: while the publishers publish, and for length at least.
	timeline, err := os.Create(filepath.Join(dir, "nemesis.log"))
	if err != nil {
		soakFatal(t, err)
	}
	defer timeline.Close()
	var kills []meshdKill
	moduleKills := 0
	var nemesisMu sync.Mutex
	say := func(format string, args ...any) {
		nemesisMu.Lock()
		defer nemesisMu.Unlock()
		fmt.Fprintf(timeline, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	began := time.Now()
	joined, left := false, false
	// The operator changes the count live, at half and at five sixths of
	// the faults (16 -> 32 -> 16), while they go on.
	repartitions := []int{2 * orderPartitions, orderPartitions}
	var changing sync.WaitGroup
	var changes []string
	repartition := func(to, epoch int) {
		op, err := amqp.Dial(urls[0])
		if err != nil {
			soakErrorf(t, "repartition to %d: %v", to, err)
			return
		}
		defer op.Close()
		user, _ := nodeconfig.BrokerAccount(urls[0])
		at := time.Now()
		if _, err := runtime.StartRepartition(context.Background(), op, user, "orders", "orderer", to); err != nil {
			soakErrorf(t, "repartition to %d: %v", to, err)
			return
		}
		for deadline := time.Now().Add(5 * time.Minute); ; pause(250 * time.Millisecond) {
			e, err := runtime.ReadGroupEpoch(op, "orders", "orderer", 0, 0)
			if err == nil && e.Number == epoch && len(e.Pending) == 0 {
				break
			}
			if time.Now().After(deadline) {
				soakErrorf(t, "repartition to %d: not over after 5 minutes: %+v, %v", to, e, err)
				return
			}
		}
		say("the change to %d partitions is over after %v", to, time.Since(at).Round(time.Millisecond))
		nemesisMu.Lock()
		changes = append(changes, fmt.Sprintf("to %d in %v", to, time.Since(at).Round(time.Millisecond)))
		nemesisMu.Unlock()
	}
	live := func() []string {
		var out []string
		for n := range mds {
			if n != "n2" || !left {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	for {
		elapsed := time.Since(began)
		if elapsed > length && isClosed(published) {
			break
		}
		if elapsed > 10*length+10*time.Minute {
			soakFatalf(t, "the publishers have not finished after %v", elapsed)
		}
		switch {
		case len(repartitions) == 2 && elapsed > length/2, len(repartitions) == 1 && elapsed > 5*length/6:
			to, epoch := repartitions[0], 3-len(repartitions)
			repartitions = repartitions[1:]
			changing.Wait() // one change at a time
			say("the operator changes the count to %d", to)
			changing.Go(func() { repartition(to, epoch) })
		case !joined && elapsed > length/3:
			joined = true
			say("n4 joins")
			startNode("n4")
		case joined && !left && elapsed > 2*length/3:
			left = true
			say("n2 leaves (SIGTERM)")
			mds["n2"].stop()
			say("n2 left")
		default:
			nodes := live()
			n := nodes[rng.IntN(len(nodes))]
			switch r := rng.IntN(10); {
			case r < 4:
				pids := orderersOf(mds[n].pid())
				if len(pids) == 0 {
					say("%s runs no orderer now", n)
				}
				for _, pid := range pids {
					say("SIGKILL %s's orderer (pid %d)", n, pid)
					if syscall.Kill(pid, syscall.SIGKILL) == nil {
						moduleKills++
					}
				}
			case r < 7:
				say("SIGKILL meshd %s", n)
				at := time.Now()
				mds[n].kill()
				kills = append(kills, meshdKill{node: n, at: at})
				pause(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
				say("meshd %s starts again", n)
				if err := mds[n].start(); err != nil {
					soakFatal(t, err)
				}
				if err := mds[n].awaitReady(); err != nil {
					soakFatal(t, err)
				}
			}
		}
		pause(time.Duration(2000+rng.IntN(3000)) * time.Millisecond)
	}
	changing.Wait()
	close(stop)
	say("faults end")
	if len(changes) != 2 {
		soakErrorf(t, "the count changed %d times (%v), want twice (16 -> 32 -> 16)", len(changes), changes)
	}
	fmt.Printf("order soak: partition count changed live, under the faults: %s\n", strings.Join(changes, ", "))
	fmt.Printf("order soak: faults end after %v; %d orderer processes and %d meshd killed\n", time.Since(began).Round(time.Second), moduleKills, len(kills))
	if moduleKills == 0 || len(kills) == 0 {
		soakErrorf(t, "the nemesis killed %d orderer processes and %d meshd: the soak proves nothing of faults it did not make (a longer SOAK, or another seed)", moduleKills, len(kills))
	}

	// Settle: until every expected effect is there, or none comes for a
	// minute (10 minutes at most).
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		soakFatal(t, err)
	}
	defer db.Close()
	want := sent.total()
	var have, last int
	quiet := time.Now()
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline) && time.Since(quiet) < time.Minute; pause(time.Second) {
		if err := db.QueryRow(`SELECT count(DISTINCT (key, seq)) FROM effects`).Scan(&have); err != nil {
			soakFatal(t, err)
		}
		if have >= want {
			break
		}
		if have != last {
			last, quiet = have, time.Now()
		}
	}
	fmt.Printf("order soak: settled %v after the faults began: %d of %d effects\n", time.Since(began).Round(time.Second), have, want)

	// The spread, with a trickle on every partition (a consumer knows it
	// owns a partition once it is fed).
	ticks := tickKeys()
	tickStop := make(chan struct{})
	var trickle sync.WaitGroup
	trickle.Go(func() {
		for seq := 1; ; seq++ {
			select {
			case <-tickStop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for _, key := range ticks {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := edge.Emit(ctx, "shop", "module.shop.keyed", keyedEvent{Key: key, Seq: seq, At: time.Now().UnixNano()}, sdk.WithKey(key))
				cancel()
				sent.record(key, seq, err)
			}
		}
	})
	spreadFrom := time.Now()
	var owned map[string]int
	for deadline := time.Now().Add(time.Minute); ; pause(500 * time.Millisecond) {
		owned = map[string]int{}
		for _, n := range live() {
			owned[n] = ownedOf(mds[n])
		}
		if spreadEven(owned) || time.Now().After(deadline) {
			break
		}
	}
	spreadTook := time.Since(spreadFrom)
	close(tickStop)
	trickle.Wait()
	if !spreadEven(owned) {
		soakErrorf(t, "partitions owned by the live members a minute after the faults: %v, want %d spread with max - min <= 1", owned, orderPartitions)
	}
	fmt.Printf("order soak: spread %v, %v after the trickle began (heartbeat 1s)\n", owned, spreadTook.Round(100*time.Millisecond))
	// The ticks' last effects.
	want = sent.total()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); pause(500 * time.Millisecond) {
		if err := db.QueryRow(`SELECT count(DISTINCT (key, seq)) FROM effects`).Scan(&have); err != nil {
			soakFatal(t, err)
		}
		if have >= want {
			break
		}
	}

	r := checkOrder(t, db, histPath, sent, kills)
	fmt.Printf("order soak: %s\n", r)
	if r.inversions != 0 || r.lost != 0 || r.duplicated != 0 || r.seenInversions != 0 || r.unexpected != 0 {
		soakErrorf(t, "order soak: %d inversions, %d lost, %d duplicated, %d inversions seen by handlers, %d unexpected effects; want none (e.g. %s)",
			r.inversions, r.lost, r.duplicated, r.seenInversions, r.unexpected, strings.Join(r.examples, "; "))
	}
}

// orderConfig is meshd NAME's configuration in TestSoakOrder: the
// orderer, in its group, granted the PostgreSQL's port; on n1 the feeder.
func orderConfig(name string, urls []string, state, httpAddr, module, hist, dsn, pgPort string) string {
	var b strings.Builder
	meshdHead(&b, name, urls, state, httpAddr)
	fmt.Fprintf(&b, `  - name: orderer
    path: %s
    args: [orderer, %s, %s, %q]
    group: orders
    partitions: %d
    concurrency: 16
    max_attempts: 50
    handler_timeout: 10s
    network:
      connect: ["127.0.0.1:%s"]
`, module, name, hist, dsn, orderPartitions, pgPort)
	if name == "n1" {
		fmt.Fprintf(&b, `  - name: feeder
    path: %s
    args: [feeder, %s, %s]
    concurrency: 4
    max_attempts: 50
    handler_timeout: 60s
`, module, name, hist)
	}
	return b.String()
}

// keyedEvent and feedOrder are soakmodule's keyed and feed.
type keyedEvent struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	At  int64  `json:"at,omitempty"`
}

type feedOrder struct {
	Prefix string `json:"prefix"`
	From   int    `json:"from"`
	To     int    `json:"to"`
	Count  int    `json:"count"`
}

// sentLog is what the publishers had confirmed: per key, its events 1 to
// n. A key one of whose events was not confirmed is broken: its later
// events are not sent (they would have no order to keep), and the checker
// does not count its missing ones as lost.
type sentLog struct {
	mu        sync.Mutex
	confirmed map[string]int
	broke     map[string]bool
}

func newSentLog() *sentLog {
	return &sentLog{confirmed: map[string]int{}, broke: map[string]bool{}}
}

func (s *sentLog) expect(key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.confirmed[key] = n
}

func (s *sentLog) record(key string, seq int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.broke[key] = true
		return
	}
	s.confirmed[key] = seq
}

func (s *sentLog) broken(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broke[key]
}

func (s *sentLog) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.confirmed {
		n += c
	}
	return n
}

// rawPublish sends keys r-0 to r-(keys-1), events each, in order, as a
// publisher outside the mesh: to mesh.events with the event headers and
// x-partition-key; the even keys with their slot header too (as a
// publisher that knows wire.Slot), the odd ones without (the group's
// intake slots them). Up to 256 confirms are in flight.
func rawPublish(t *testing.T, conn *amqp.Connection, keys, events int, sent *sentLog) {
	ch, err := conn.Channel()
	if err != nil {
		soakErrorf(t, "raw publisher: %v", err)
		return
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		soakErrorf(t, "raw publisher: %v", err)
		return
	}
	type pending struct {
		key string
		seq int
		dc  *amqp.DeferredConfirmation
	}
	var window []pending
	settle := func(p pending) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ok, err := p.dc.WaitContext(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("nacked")
		}
		sent.record(p.key, p.seq, err)
	}
	for seq := 1; seq <= events; seq++ {
		for i := range keys {
			key := fmt.Sprintf("r-%d", i)
			if sent.broken(key) {
				continue
			}
			id := ulid.Make().String()
			body, _ := json.Marshal(keyedEvent{Key: key, Seq: seq, At: time.Now().UnixNano()})
			headers := amqp.Table{"x-event-id": id, "x-source": "raw", "x-node": "till", "x-time": time.Now().UTC().Format(time.RFC3339Nano),
				wire.HeaderPartitionKey: key}
			if i%2 == 0 {
				headers[wire.SlotHeader(key)] = wire.SlotMark
			}
			dc, err := ch.PublishWithDeferredConfirm(wire.ExchangeEvents, "module.raw.keyed", false, false, amqp.Publishing{
				Headers: headers, ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: body})
			if err != nil {
				soakErrorf(t, "raw publisher: %v", err)
				return
			}
			window = append(window, pending{key, seq, dc})
			if len(window) >= 256 {
				settle(window[0])
				window = window[1:]
			}
		}
	}
	for _, p := range window {
		settle(p)
	}
}

// meshdKill is a SIGKILL of a meshd by the nemesis.
type meshdKill struct {
	node string
	at   time.Time
}

// orderersOf is the process ids of the orderer processes meshd pid runs.
func orderersOf(pid int) []int {
	var out []int
	for _, p := range proctest.List() {
		argv := strings.Fields(p.Cmdline)
		if p.PPID == pid && len(argv) > 1 && filepath.Base(argv[0]) == "soakmodule" && argv[1] == "orderer" {
			out = append(out, p.PID)
		}
	}
	return out
}

// tickKeys are a key for each partition.
func tickKeys() []string {
	keys := make([]string, orderPartitions)
	found := 0
	for i := 0; found < orderPartitions; i++ {
		key := fmt.Sprintf("tick-%d", i)
		if p := wire.Slot(key) % orderPartitions; keys[p] == "" {
			keys[p] = key
			found++
		}
	}
	return keys
}

// ownedOf is meshd m's mesh_group_partitions_owned of the orderer, -1
// when it does not answer.
func ownedOf(m *meshd) int {
	code, body, err := m.get("/metrics")
	if err != nil || code != http.StatusOK {
		return -1
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "mesh_group_partitions_owned{") || !strings.Contains(line, `module="orderer"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return int(v)
		}
	}
	return 0
}

// spreadEven reports whether owned covers every partition with max - min
// <= 1.
func spreadEven(owned map[string]int) bool {
	sum, lo, hi := 0, orderPartitions, 0
	for _, n := range owned {
		sum += n
		lo, hi = min(lo, n), max(hi, n)
	}
	return sum == orderPartitions && hi-lo <= 1
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		soakFatalf(t, "%s=%q: want a positive number", name, s)
	}
	return n
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// orderReport is the checker's reading.
type orderReport struct {
	keys, effects, seen, redelivered                         int
	inversions, lost, duplicated, unexpected, seenInversions int
	broken                                                   int
	changes                                                  int             // owner changes of a slot seen (a slot moves with its partition, whatever the count)
	gaps                                                     []time.Duration // each change's time without an owner
	perSlot                                                  []time.Duration // each slot's time without an owner, in all
	reowned                                                  []time.Duration // after a meshd's kill, each of its slots' time until another member handled it
	examples                                                 []string
}

func (r orderReport) String() string {
	return fmt.Sprintf("%d keys, %d effects, %d handler calls (%d again), %d keys left by their publisher; inversions %d, lost %d, duplicated %d, unexpected %d, inversions seen by handlers %d; "+
		"no owner: %d owner changes of a slot, %s of them with an event waiting, per slot in all %s; a killed meshd's slots owned again in %s",
		r.keys, r.effects, r.seen, r.redelivered, r.broken, r.inversions, r.lost, r.duplicated, r.unexpected, r.seenInversions,
		r.changes, quantiles(r.gaps), quantiles(r.perSlot), quantiles(r.reowned))
}

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "(none)"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v p90 %v max %v (n=%d)", q(0.5), q(0.9), q(1), len(ds))
}

// sighting is a handler call the history holds.
type sighting struct {
	node, key string
	seq       int
	at        time.Time
	sent      time.Time // when its publisher sent it; zero for the feeder's
}

// checkOrder reads the effects (in the order they were applied) and the
// handlers' calls, against what the publishers had confirmed.
func checkOrder(t *testing.T, db *sql.DB, histPath string, sent *sentLog, kills []meshdKill) orderReport {
	var r orderReport
	example := func(format string, args ...any) {
		if len(r.examples) < 5 {
			r.examples = append(r.examples, fmt.Sprintf(format, args...))
		}
	}
	sent.mu.Lock()
	defer sent.mu.Unlock()
	r.keys, r.broken = len(sent.confirmed), len(sent.broke)

	rows, err := db.Query(`SELECT key, seq FROM effects ORDER BY id`)
	if err != nil {
		soakFatal(t, err)
	}
	applied := map[string][]int{}
	for rows.Next() {
		var key string
		var seq int
		if err := rows.Scan(&key, &seq); err != nil {
			soakFatal(t, err)
		}
		applied[key] = append(applied[key], seq)
		r.effects++
	}
	if err := rows.Err(); err != nil {
		soakFatal(t, err)
	}
	for key, seqs := range applied {
		have, highest := map[int]bool{}, 0
		for _, s := range seqs {
			if have[s] {
				r.duplicated++
				example("%s/%d applied twice", key, s)
				continue
			}
			have[s] = true
			if s < highest {
				r.inversions++
				example("%s/%d applied after %s/%d", key, s, key, highest)
			}
			highest = max(highest, s)
			if n, ok := sent.confirmed[key]; !ok || (s > n && !sent.broke[key]) {
				r.unexpected++
				example("%s/%d applied, never sent", key, s)
			}
		}
	}
	for key, n := range sent.confirmed {
		for s := 1; s <= n; s++ {
			if !slices.Contains(applied[key], s) {
				r.lost++
				example("%s/%d sent, never applied", key, s)
			}
		}
	}

	// What the handlers saw: the first sighting of each of a key's
	// events in order; the owner of each partition over time.
	f, err := os.Open(histPath)
	if err != nil {
		soakFatal(t, err)
	}
	defer f.Close()
	var seen []sighting
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 5 || fields[0] != "seen" {
			continue
		}
		parts := strings.Split(fields[2], "/")
		if len(parts) != 3 {
			soakFatalf(t, "history line %q", sc.Text())
		}
		seq, err1 := strconv.Atoi(parts[1])
		sentAt, err2 := strconv.ParseInt(parts[2], 10, 64)
		nanos, err3 := strconv.ParseInt(fields[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			soakFatalf(t, "history line %q", sc.Text())
		}
		s := sighting{node: fields[1], key: parts[0], seq: seq, at: time.Unix(0, nanos)}
		if sentAt != 0 {
			s.sent = time.Unix(0, sentAt)
		}
		seen = append(seen, s)
	}
	if err := sc.Err(); err != nil {
		soakFatal(t, err)
	}
	slices.SortStableFunc(seen, func(a, b sighting) int { return a.at.Compare(b.at) })
	r.seen = len(seen)
	type keySeq struct {
		key string
		seq int
	}
	first, highest := map[keySeq]bool{}, map[string]int{}
	// By slot, not partition: the partition count changes mid-way.
	owner := make([]sighting, wire.Slots)
	r.perSlot = make([]time.Duration, wire.Slots)
	for _, s := range seen {
		ks := keySeq{s.key, s.seq}
		if first[ks] {
			r.redelivered++
		} else {
			first[ks] = true
			if s.seq < highest[s.key] {
				r.seenInversions++
				example("%s/%d first seen after %s/%d", s.key, s.seq, s.key, highest[s.key])
			}
			highest[s.key] = max(highest[s.key], s.seq)
		}
		// An owner change counts as time without one only where the new
		// owner's first event was waiting all along: sent before the old
		// owner's last call (otherwise the partition was idle).
		p := wire.Slot(s.key)
		if prev := owner[p]; prev.node != "" && prev.node != s.node {
			r.changes++
			if !s.sent.IsZero() && s.sent.Before(prev.at) {
				gap := s.at.Sub(prev.at)
				r.gaps = append(r.gaps, gap)
				r.perSlot[p] += gap
			}
		}
		owner[p] = s
	}
	// A killed meshd's slots: those it handled in the second before
	// its kill, and the time until another member handled each.
	for _, k := range kills {
		for p := range wire.Slots {
			var lastBefore, nextAfter *sighting
			for i := range seen {
				s := &seen[i]
				if wire.Slot(s.key) != p {
					continue
				}
				if s.at.Before(k.at) {
					lastBefore = s
				} else if s.node != k.node {
					nextAfter = s
					break
				}
			}
			if lastBefore == nil || lastBefore.node != k.node || k.at.Sub(lastBefore.at) > time.Second || nextAfter == nil {
				continue
			}
			r.reowned = append(r.reowned, nextAfter.at.Sub(k.at))
		}
	}
	return r
}
