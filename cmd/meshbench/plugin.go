package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshkit/mesh/cmd/meshbench/countmodule"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// benchPlugin measures the round trip of a lone event through the same
// module run as a module process and in-process (their throughput and CPU
// are in benchGoals).
func benchPlugin(url string, o options) error {
	bin, remove, err := buildBinary("./cmd/meshbench/countplugin")
	if err != nil {
		return err
	}
	defer remove()
	// At a low rate a batch has nothing to wait for: what a lone event
	// costs is the boundary's latency, both ways (the delivery in, the
	// handler's emit out).
	fmt.Printf("\n== module process: round trip of %d sequential events (emit, handle, emit back, handled), in-process and as a module process ==\n", echoEvents)
	var inP50, plP50 []float64
	for r := 0; r < o.rounds; r++ {
		ip50, ip99, err := echoLatency(url, "")
		if err != nil {
			return fmt.Errorf("in-process round trip: %w", err)
		}
		pp50, pp99, err := echoLatency(url, bin)
		if err != nil {
			return fmt.Errorf("module process round trip: %w", err)
		}
		fmt.Printf("round %d  in-process p50 %6.2f ms  p99 %6.2f ms   module process p50 %6.2f ms  p99 %6.2f ms\n", r+1, ip50, ip99, pp50, pp99)
		inP50, plP50 = append(inP50, ip50), append(plP50, pp50)
	}
	fmt.Printf("round trip p50: in-process %.2f ms, module process %.2f ms (+%.2f ms for the boundary, both ways)\n",
		median(inP50), median(plP50), median(plP50)-median(inP50))
	return nil
}

// echoEvents is how many sequential events a round trip round sends.
const echoEvents = 500

// echoLatency runs countmodule expecting 0 (it answers every event) in
// process (bin == "") or as the module process bin, sends echoEvents
// events one at a time, each after the answer to the one before, and
// returns the p50 and p99 of emit-to-answer, in milliseconds.
func echoLatency(url, bin string) (p50, p99 float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, _, closeNode, err := benchNode(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer closeNode()
	answers := make(chan int, 1)
	if _, err := node.Load(ctx, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error {
		return m.On("module.count.done", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error {
			var a struct{ Seq int }
			if err := ev.Decode(&a); err != nil {
				return sdk.Permanent(err)
			}
			answers <- a.Seq
			return nil
		}))
	}}, runtime.ModuleConfig{}); err != nil {
		return 0, 0, err
	}
	defer func() { _ = deleteQueue(url, "bench.count.events"); _ = deleteQueue(url, "bench.watch.events") }()
	if bin == "" {
		_, err = node.Load(ctx, countmodule.Module(0), runtime.ModuleConfig{})
	} else {
		var pm *runtime.PluginModule
		pm, err = node.LoadPlugin(ctx, bin, []string{"0"}, runtime.ModuleConfig{})
		if err == nil {
			defer pm.Stop(context.Background())
		}
	}
	if err != nil {
		return 0, 0, err
	}
	const warmUp = 50
	lat := make([]float64, 0, echoEvents)
	for i := range warmUp + echoEvents {
		start := time.Now()
		if _, err := node.Emit(ctx, "bench", "mesh.bench.echo", json.RawMessage(body(i))); err != nil {
			return 0, 0, err
		}
		for seq := -1; seq != i; {
			select {
			case seq = <-answers:
			case <-ctx.Done():
				return 0, 0, fmt.Errorf("no answer to event %d", i)
			}
		}
		if i >= warmUp {
			lat = append(lat, float64(time.Since(start))/float64(time.Millisecond))
		}
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

// counted is what one batch of a countRun measured: events handled per
// second, the client's CPU per event (client, the sum of host, this
// process's, and module, the module process's: 0 in-process) and the
// broker's (0 when it is not known), and the module process's resident
// set at its peak while the batch ran (0 in-process).
type counted struct {
	rate                 float64
	client, host, module time.Duration
	broker               time.Duration
	peakRSS              int // kB
	// Hand-offs per event: this process's goroutines scheduled to run
	// and its threads switched off a CPU; the module process's threads
	// switched (0 in-process). See handoffs.go.
	hostRuns, hostSwitches, moduleSwitches float64
}

// countRun is a node running countmodule on a queue of its own type,
// in-process or as a module process, to which batches of events are
// emitted: the module says done at the end of each batch.
type countRun struct {
	node      *runtime.Node
	pm        *runtime.PluginModule // nil in-process
	done      chan struct{}         // a value for each module.count.done
	closeNode func()
	url       string
}

// startCount starts a node and countmodule expecting batch events a batch,
// in-process (bin == "") or as the module process bin, consuming from a
// queue of type qt.
func startCount(ctx context.Context, url, qt string, batch int, bin string) (*countRun, error) {
	node, _, closeNode, err := benchNode(ctx, url)
	if err != nil {
		return nil, err
	}
	c := &countRun{node: node, done: make(chan struct{}, 16), closeNode: closeNode, url: url}
	if _, err := node.Load(ctx, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error {
		return m.On("module.count.done", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
			c.done <- struct{}{}
			return nil
		}))
	}}, runtime.ModuleConfig{}); err != nil {
		c.close()
		return nil, err
	}
	// The same on both sides: the whole window at once.
	mc := runtime.ModuleConfig{Concurrency: runtime.DefaultPrefetch, QueueType: qt}
	if path := os.Getenv("MESHBENCH_PLUGIN_CPUPROFILE"); path != "" && bin != "" {
		// The node passes a module process none of its environment: the
		// profile's path goes through a launcher.
		mc.Launcher = []string{"/usr/bin/env", "MESHBENCH_PLUGIN_CPUPROFILE=" + path}
	}
	if bin == "" {
		_, err = node.Load(ctx, countmodule.Module(int64(batch)), mc)
	} else {
		c.pm, err = node.LoadPlugin(ctx, bin, []string{strconv.Itoa(batch)}, mc)
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// close stops the module process, closes the node and deletes the queues.
func (c *countRun) close() {
	if c.pm != nil {
		_ = c.pm.Stop(context.Background())
	}
	c.closeNode()
	_ = deleteQueue(c.url, "bench.count.events")
	_ = deleteQueue(c.url, "bench.watch.events")
}

// rss is the module process's resident set now, in kB (0 in-process).
func (c *countRun) rss() int {
	if c.pm == nil {
		return 0
	}
	return rssKB(c.pm.PID())
}

// batch emits o.events from o.meshPublishers goroutines and measures,
// until the module says it handled them, events handled per second, the
// CPU each took and the module process's peak resident set.
func (c *countRun) batch(ctx context.Context, o options) (counted, error) {
	// The module process's CPU, read from /proc while it runs (it is not
	// this process's, nor reaped before the round ends).
	moduleCPU := func() time.Duration { return 0 }
	moduleSwitches := func() int64 { return 0 }
	if c.pm != nil {
		pid := c.pm.PID()
		moduleCPU = func() time.Duration { return max(processCPU(pid), 0) }
		moduleSwitches = func() int64 { return max(threadSwitches(pid), 0) }
	}
	self := os.Getpid()
	peak := make(chan int, 1)
	stop := make(chan struct{})
	go func() {
		top := c.rss()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				peak <- max(top, c.rss())
				return
			case <-t.C:
				top = max(top, c.rss())
			}
		}
	}()
	cpu0, module0, broker0 := cpuTime(), moduleCPU(), brokerCPU()
	runs0, switches0, moduleSwitches0 := goroutineRuns(), threadSwitches(self), moduleSwitches()
	start := time.Now()
	err := emitAll(ctx, c.node, o, "mesh.bench.measured")
	if err == nil {
		select {
		case <-c.done:
		case <-ctx.Done():
			err = fmt.Errorf("the module did not handle %d events in time", o.events)
		}
	}
	elapsed := time.Since(start)
	host, module := cpuTime()-cpu0, moduleCPU()-module0
	broker := brokerCPU() - broker0
	runs, switches, modSwitches := goroutineRuns()-runs0, threadSwitches(self)-switches0, moduleSwitches()-moduleSwitches0
	close(stop)
	rss := <-peak
	if err != nil {
		return counted{}, err
	}
	n := time.Duration(o.events)
	got := counted{rate: float64(o.events) / elapsed.Seconds(), host: host / n, module: module / n, peakRSS: rss}
	got.client = got.host + got.module
	perEvent := func(n int64) float64 { return float64(n) / float64(o.events) }
	got.hostRuns, got.hostSwitches, got.moduleSwitches = perEvent(int64(runs)), perEvent(switches), perEvent(modSwitches)
	if brokerPID != 0 {
		got.broker = broker / n
	}
	return got, nil
}

// countOnce runs countmodule in-process (bin == "") or as the module
// process bin on a queue of type qt for one batch of o.events.
func countOnce(url, qt string, o options, bin string) (counted, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := startCount(ctx, url, qt, o.events, bin)
	if err != nil {
		return counted{}, err
	}
	defer c.close()
	return c.batch(ctx, o)
}

// emitAll emits o.events of eventType through node from o.publishers
// goroutines (o.meshPublishers), each waiting for its confirm.
func emitAll(ctx context.Context, node *runtime.Node, o options, eventType string) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.meshPublishers)
	for range o.meshPublishers {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= o.events; i = int(next.Add(1)) {
				if _, err := node.Emit(ctx, "bench", eventType, json.RawMessage(body(i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// benchNode starts a quiet node "bench" on url with a state dir of its
// own; closeNode closes it and removes the dir.
func benchNode(ctx context.Context, url string) (node *runtime.Node, state string, closeNode func(), err error) {
	state, err = os.MkdirTemp("", "meshbench-node-")
	if err != nil {
		return nil, "", nil, err
	}
	node, err = runtime.New(ctx, runtime.Config{Node: "bench", AMQPURL: url, StateDir: state,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		os.RemoveAll(state)
		return nil, "", nil, err
	}
	return node, state, func() { _ = node.Close(context.Background()); os.RemoveAll(state) }, nil
}

// buildBinary builds the command pkg into a temporary directory and
// returns its path, and remove, which deletes the directory.
func buildBinary(pkg string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "meshbench-bin-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}
