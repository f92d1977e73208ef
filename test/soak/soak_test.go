//go:build soak

// Package soak is the nemesis soak (make soak; issue 24), a first
// version: two nodes on the local broker, each through a proxy the nemesis
// cuts and partitions, a workload of chained events with a tool call
// inside a handler and a consumed queue the nemesis deletes and declares
// again, memory alarms, faults from a seeded schedule, and a checker over
// the whole history at the end. SOAK (default 10m) is how long the faults go on;
// SOAK_SEED (default: the time) picks the schedule.
package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// history is what every part of the workload saw, for the checker.
type history struct {
	mu        sync.Mutex
	confirmed map[string]bool // orders whose emit returned nil (confirmed or spooled)
	handled   map[string]int  // orders the worker's handler completed, by order id
	taxed     map[string]int  // tool runs, by request (the order id)
	done      map[string]int  // done events the sink handled, by order id
	failed    map[string]bool // orders whose handler returned an error (a tool call that failed)
	legacyIn  map[string]bool // messages published to the consumed queue and confirmed
	legacy    map[string]int  // those the worker's Consume handler completed
}

func newHistory() *history {
	return &history{confirmed: map[string]bool{}, handled: map[string]int{}, taxed: map[string]int{}, done: map[string]int{},
		failed: map[string]bool{}, legacyIn: map[string]bool{}, legacy: map[string]int{}}
}

func (h *history) add(m map[string]int, id string) {
	h.mu.Lock()
	m[id]++
	h.mu.Unlock()
}

type order struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

func soakLength(t *testing.T) time.Duration {
	s := os.Getenv("SOAK")
	if s == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("SOAK=%q: %v", s, err)
	}
	return d
}

func soakSeed(t *testing.T) uint64 {
	if s := os.Getenv("SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

func quietLogger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newNode(t *testing.T, url, name string) *runtime.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(), Logger: quietLogger(),
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
		HeartbeatInterval: time.Second})
	if err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

func TestSoak(t *testing.T) {
	length, seed := soakLength(t), soakSeed(t)
	// Each of the four emitters waits this between emits (SOAK_PACE):
	// 20 ms is about 180 events/s, which the workload's handler (a tool
	// call per event) keeps up with on this machine.
	pace := 20 * time.Millisecond
	if v := os.Getenv("SOAK_PACE"); v != "" {
		var err error
		if pace, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SOAK_PACE=%q: %v", v, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.Logf("soak seed=%d length=%v (SOAK_SEED=%d reproduces the schedule)", seed, length, seed)
	url := brokertest.VHost(t)
	proxies := []*brokertest.Proxy{brokertest.NewProxy(t), brokertest.NewProxy(t)}
	via := func(p *brokertest.Proxy) string { return strings.Replace(url, brokertest.Host(), p.Addr(), 1) }
	alpha, beta := newNode(t, via(proxies[0]), "alpha"), newNode(t, via(proxies[1]), "beta")
	raw, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	admin, err := raw.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const legacyQueue = "soak.legacy"
	declareLegacy := func() error {
		_, err := admin.QueueDeclare(legacyQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	}
	if err := declareLegacy(); err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	mc := runtime.ModuleConfig{MaxAttempts: 50, HandlerTimeout: 20 * time.Second}
	load := func(n *runtime.Node, def sdk.Module, mc runtime.ModuleConfig) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := n.Load(ctx, def, mc); err != nil {
			t.Fatalf("load %s: %v", def.Name, err)
		}
	}
	// tax serves a tool on alpha; the worker on beta calls it inside its
	// handler and emits done; the sink on alpha takes done.
	load(alpha, sdk.Module{Name: "tax", Setup: func(m sdk.Mesh) error {
		return m.Serve("tax.rate", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			h.add(h.taxed, req.ID)
			return 0.2, nil
		}))
	}}, runtime.ModuleConfig{ToolGrants: []string{"tax.*"}})
	load(beta, sdk.Module{Name: "worker", Emits: []string{"done"}, Calls: []string{"tax.rate"}, Setup: func(m sdk.Mesh) error {
		on := m.On("module.shop.order", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			var rate float64
			if err := m.Call(ctx, "tax.rate", o, &rate); err != nil {
				h.mu.Lock()
				h.failed[o.ID] = true
				h.mu.Unlock()
				return err
			}
			if _, err := m.Emit(ctx, "done", o); err != nil {
				h.mu.Lock()
				h.failed[o.ID] = true
				h.mu.Unlock()
				return err
			}
			h.add(h.handled, o.ID)
			return nil
		}))
		consume := m.Consume(legacyQueue, 4, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			h.add(h.legacy, ev.ID)
			return nil
		}))
		return errors.Join(on, consume)
	}}, runtime.ModuleConfig{MaxAttempts: mc.MaxAttempts, HandlerTimeout: mc.HandlerTimeout, CallGrants: []string{"tax.*"}, ConsumeGrants: []string{legacyQueue}})
	load(alpha, sdk.Module{Name: "sink", Setup: func(m sdk.Mesh) error {
		return m.On("module.worker.done", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o order
			if err := ev.Decode(&o); err != nil {
				return sdk.Permanent(err)
			}
			h.add(h.done, o.ID)
			return nil
		}))
	}}, mc)

	// The workload: emits from alpha, as module shop; messages into the
	// consumed queue from outside, with raw amqp091-go and confirms.
	stop := make(chan struct{})
	var workers sync.WaitGroup
	var seq atomic.Int64
	for w := range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				o := order{ID: fmt.Sprintf("o-%d-%d", w, i), N: int(i)}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := alpha.Emit(ctx, "shop", "module.shop.order", o)
				cancel()
				if err == nil {
					h.mu.Lock()
					h.confirmed[o.ID] = true
					h.mu.Unlock()
				}
				pause(pace)
			}
		}()
	}
	var legacyMu sync.Mutex // the admin channel: one user at a time
	workers.Add(1)
	go func() {
		defer workers.Done()
		pub, err := raw.Channel()
		if err != nil {
			return
		}
		if err := pub.Confirm(false); err != nil {
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("l-%d", i)
			legacyMu.Lock() // not while the nemesis deletes the queue
			dc, err := pub.PublishWithDeferredConfirm("", legacyQueue, false, false, amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
			if err == nil && dc.Wait() {
				h.mu.Lock()
				h.legacyIn[id] = true
				h.mu.Unlock()
			}
			legacyMu.Unlock()
			pause(20 * time.Millisecond)
		}
	}()

	// The broker's memory watermark, put back after each alarm and at the
	// end (a run killed before its cleanup leaves an absolute one: Debian's
	// default is 0.4).
	watermark := brokertest.MemoryWatermark(t)
	restoreWatermark := func() { _ = exec.Command("rabbitmqctl", "set_vm_memory_high_watermark", watermark).Run() }
	t.Cleanup(restoreWatermark)

	// The nemesis: a fault every 1-4 s from the seeded schedule.
	faults := map[string]int{}
	deadline := time.Now().Add(length)
	for time.Now().Before(deadline) {
		pause(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
		switch f := rng.IntN(5); f {
		case 0:
			p := rng.IntN(2)
			proxies[p].Cut()
			faults[fmt.Sprintf("cut %d", p)]++
		case 1:
			p := rng.IntN(2)
			proxies[p].Down()
			pause(time.Duration(200+rng.IntN(2000)) * time.Millisecond)
			proxies[p].Up()
			faults[fmt.Sprintf("partition %d", p)]++
		case 2:
			proxies[0].Cut()
			proxies[1].Cut()
			faults["cut both"]++
		case 3:
			// The consumed queue is deleted with what it holds (not the
			// mesh's to keep), then declared again.
			legacyMu.Lock()
			_, _ = admin.QueueDelete(legacyQueue, false, false, false)
			h.mu.Lock()
			clear(h.legacyIn) // what was in it is gone with it; count from here
			clear(h.legacy)
			h.mu.Unlock()
			if err := declareLegacy(); err != nil {
				t.Errorf("declare the consumed queue again: %v", err)
			}
			legacyMu.Unlock()
			faults["delete consumed queue"]++
		case 4:
			// A memory alarm: the broker blocks every publisher.
			if out, err := exec.Command("rabbitmqctl", "set_vm_memory_high_watermark", "absolute", "1").CombinedOutput(); err != nil {
				t.Fatalf("memory alarm: %v\n%s", err, out)
			}
			pause(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
			restoreWatermark()
			faults["memory alarm"]++
		}
	}
	close(stop)
	workers.Wait()

	// Settle: every confirmed order handled and its done event taken, or
	// two minutes.
	// Settle: until nothing is missing, or nothing more arrives for a
	// minute (at most 15 minutes): a backlog left by the faults drains.
	progressAt, lastMissing := time.Now(), -1
	for time.Since(progressAt) < time.Minute && time.Since(deadline) < 15*time.Minute {
		h.mu.Lock()
		missing := 0
		for id := range h.confirmed {
			if h.handled[id] == 0 || h.done[id] == 0 {
				missing++
			}
		}
		for id := range h.legacyIn {
			if h.legacy[id] == 0 {
				missing++
			}
		}
		h.mu.Unlock()
		if missing == 0 {
			break
		}
		if missing != lastMissing {
			progressAt, lastMissing = time.Now(), missing
		}
		pause(500 * time.Millisecond)
	}
	backlog := map[string]int{}
	for _, q := range []string{wire.ModuleQueue("beta", "worker"), wire.ModuleQueue("alpha", "sink"), legacyQueue} {
		if info, err := admin.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			backlog[q] = info.Messages
		}
	}
	fmt.Printf("soak settled in %v; left in queues %v, in spools alpha=%d beta=%d\n",
		time.Since(deadline).Round(time.Second), backlog, alpha.Stats().SpoolEvents, beta.Stats().SpoolEvents)
	h.mu.Lock()
	defer h.mu.Unlock()
	var lost, dup, doneLost, dupDone, dupTax, legacyLost int
	for id := range h.legacyIn {
		if h.legacy[id] == 0 {
			legacyLost++
		}
	}
	for id := range h.confirmed {
		if h.handled[id] == 0 {
			lost++
		}
		if h.done[id] == 0 {
			doneLost++
		}
	}
	for _, n := range h.handled {
		if n > 1 {
			dup++
		}
	}
	for _, n := range h.done {
		if n > 1 {
			dupDone++
		}
	}
	for _, n := range h.taxed {
		if n > 1 {
			dupTax++
		}
	}
	dead := 0
	if q, err := admin.QueueDeclarePassive(wire.QueueDead, true, false, false, false, nil); err == nil {
		dead = q.Messages
	}
	total := 0
	for _, n := range faults {
		total += n
	}
	js, _ := json.Marshal(faults)
	fmt.Printf("soak seed=%d faults=%d %s confirmed=%d lost=%d dup=%d done_lost=%d done_dup=%d tool_repeated=%d false_dead=%d legacy=%d legacy_lost=%d retried=%d\n",
		seed, total, js, len(h.confirmed), lost, dup, doneLost, dupDone, dupTax, dead, len(h.legacyIn), legacyLost, len(h.failed))
	if lost != 0 || dup != 0 || doneLost != 0 || dupDone != 0 || dead != 0 || legacyLost != 0 {
		t.Errorf("violations: lost=%d dup=%d done_lost=%d done_dup=%d false_dead=%d legacy_lost=%d (seed %d)", lost, dup, doneLost, dupDone, dead, legacyLost, seed)
	}
}

// pause waits d: the workload's pace and the nemesis's schedule, not a
// wait for the system.
func pause(d time.Duration) { <-time.After(d) }
