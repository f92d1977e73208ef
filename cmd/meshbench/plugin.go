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

// benchPlugin measures emit→handle throughput of the same module run as a
// module process and in-process, beside the raw baseline, in one run.
func benchPlugin(url string, o options) error {
	bin, remove, err := buildBinary("./cmd/meshbench/countplugin")
	if err != nil {
		return err
	}
	defer remove()
	fmt.Printf("\n== module process: %d events a round through the plugin boundary, the same module in-process, and raw ==\n", o.events)
	var raw, inproc, plugin, rawCPU, plCPU, rawBroker, plBroker []float64
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for r := 0; r < o.rounds; r++ {
		rt, rc, rb, err := throughputCPU(func(s *sink) (side, error) { return newRawBest(url, runtime.QueueQuorum, s, o.window) }, o)
		if err != nil {
			return fmt.Errorf("raw: %w", err)
		}
		in, err := countThroughput(url, o, "")
		if err != nil {
			return fmt.Errorf("in-process: %w", err)
		}
		pl, err := countThroughput(url, o, bin)
		if err != nil {
			return fmt.Errorf("module process: %w", err)
		}
		fmt.Printf("round %d  raw %6.0f events/s (client %5.1f µs, broker %5.1f µs)   in-process %6.0f (%5.1f, %5.1f)   module process %6.0f (%5.1f, %5.1f)\n",
			r+1, rt, us(rc), us(rb), in.rate, us(in.client), us(in.broker), pl.rate, us(pl.client), us(pl.broker))
		raw, inproc, plugin = append(raw, rt), append(inproc, in.rate), append(plugin, pl.rate)
		rawCPU, plCPU = append(rawCPU, us(rc)), append(plCPU, us(pl.client))
		rawBroker, plBroker = append(rawBroker, us(rb)), append(plBroker, us(pl.broker))
	}
	fmt.Printf("module process %.0f events/s, in-process %.0f, raw at its best %.0f: module process / in-process %.2f, module process / raw %.2f, in-process / raw %.2f\n",
		median(plugin), median(inproc), median(raw), median(plugin)/median(inproc), median(plugin)/median(raw), median(inproc)/median(raw))
	fmt.Printf("CPU per event, client (meshbench and the module process) %.1f µs against raw's %.1f µs; broker %.1f µs against %.1f µs\n",
		median(plCPU), median(rawCPU), median(plBroker), median(rawBroker))
	record("module process throughput / raw at its best", pairedRatio(plugin, raw), 0.85, true, "")

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

// counted is what countThroughput measured: events handled per second, and
// the client's CPU per event (this process's and the module process's) and
// the broker's (0 when it is not known).
type counted struct {
	rate           float64
	client, broker time.Duration
}

// countThroughput runs countmodule in-process (bin == "") or as the module
// process bin, publishes o.events to it from o.publishers goroutines, and
// measures, until the module says it is done, events handled per second
// and the CPU each took.
func countThroughput(url string, o options, bin string) (counted, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, _, closeNode, err := benchNode(ctx, url)
	if err != nil {
		return counted{}, err
	}
	defer closeNode()
	done := make(chan struct{})
	var once sync.Once
	if _, err := node.Load(ctx, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error {
		return m.On("module.count.done", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
			once.Do(func() { close(done) })
			return nil
		}))
	}}, runtime.ModuleConfig{}); err != nil {
		return counted{}, err
	}
	mc := runtime.ModuleConfig{Concurrency: runtime.DefaultPrefetch} // the same on both sides: the whole window at once
	if path := os.Getenv("MESHBENCH_PLUGIN_CPUPROFILE"); path != "" && bin != "" {
		// The node passes a module process none of its environment: the
		// profile's path goes through a launcher.
		mc.Launcher = []string{"/usr/bin/env", "MESHBENCH_PLUGIN_CPUPROFILE=" + path}
	}
	var pm *runtime.PluginModule
	if bin == "" {
		_, err = node.Load(ctx, countmodule.Module(int64(o.events)), mc)
	} else {
		pm, err = node.LoadPlugin(ctx, bin, []string{strconv.Itoa(o.events)}, mc)
		if err == nil {
			defer pm.Stop(context.Background())
		}
	}
	if err != nil {
		return counted{}, err
	}
	defer func() { _ = deleteQueue(url, "bench.count.events"); _ = deleteQueue(url, "bench.watch.events") }()
	// The module process's CPU, read from /proc while it runs (it is not
	// this process's, nor reaped before the round ends).
	moduleCPU := func() time.Duration { return 0 }
	if pm != nil {
		pid := pm.PID()
		moduleCPU = func() time.Duration { return max(processCPU(pid), 0) }
	}
	cpu0, module0, broker0 := cpuTime(), moduleCPU(), brokerCPU()
	start := time.Now()
	if err := emitAll(ctx, node, o, "mesh.bench.measured"); err != nil {
		return counted{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return counted{}, fmt.Errorf("the module did not handle %d events in time", o.events)
	}
	c := counted{rate: float64(o.events) / time.Since(start).Seconds()}
	c.client = (cpuTime() - cpu0 + moduleCPU() - module0) / time.Duration(o.events)
	if brokerPID != 0 {
		c.broker = (brokerCPU() - broker0) / time.Duration(o.events)
	}
	return c, nil
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
