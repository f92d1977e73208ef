package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshkit/mesh/runtime"
)

// The goals of the module-process path and of classic queues (issue 48):
// the mesh at concurrency 32 with 256 synchronous emitters, in-process and
// as a module process, beside raw amqp091-go at its best, all in the same
// alternating rounds. Each figure is the median of the rounds' ratios,
// with their spread; a round in which raw's own figure (the ratio's
// denominator) is more than rawMoved from raw's median over the rounds is
// flagged beside its figure, not dropped, since the ratio of such a round
// says more about the machine than about the mesh.

// rawMoved is how far raw's own figure in a round may be from its median
// over the rounds before that round's ratios are flagged.
const rawMoved = 0.20

// goalRound is what one round measured.
type goalRound struct {
	raw, mesh map[string]counted // by queue type; mesh is in-process
	plugin    counted            // the module process, on quorum
}

// goal is one row of the table: a ratio per round, read against raw's
// figure den (flagged when den moved), and its target.
type goal struct {
	name    string
	ratio   func(goalRound) float64
	den     func(goalRound) float64
	target  float64
	atLeast bool
}

// benchGoals measures the table of issue 48 in o.rounds alternating
// rounds (raw on quorum, the mesh in-process on quorum, the module process
// on quorum, raw on classic, the mesh in-process on classic), prints each
// round, then a row per goal with its rounds, median, spread and verdict,
// and the module process's memory at idle, under load and over batches.
func benchGoals(url string, o options) error {
	bin, remove, err := buildBinary("./cmd/meshbench/countplugin")
	if err != nil {
		return err
	}
	defer remove()
	fmt.Printf("\n== goals (issue 48): %d emitters, a module at concurrency %d, %d events, %d alternating rounds; raw at its best beside each ==\n",
		o.meshPublishers, runtime.DefaultPrefetch, o.events, o.rounds)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	var rounds []goalRound
	idleRSS := 0
	for r := range o.rounds {
		gr := goalRound{raw: map[string]counted{}, mesh: map[string]counted{}}
		for _, qt := range []string{runtime.QueueQuorum, runtime.QueueClassic} {
			tp, client, broker, err := throughputCPU(func(s *sink) (side, error) { return newRawBest(url, qt, s, o.window) }, o)
			if err != nil {
				return fmt.Errorf("raw on %s: %w", qt, err)
			}
			gr.raw[qt] = counted{rate: tp, client: client, host: client, broker: broker}
			pprof.Do(context.Background(), pprof.Labels("goal", "in-process"), func(context.Context) {
				gr.mesh[qt], err = countOnce(url, qt, o, "")
			})
			if err != nil {
				return fmt.Errorf("in-process on %s: %w", qt, err)
			}
			if qt != runtime.QueueQuorum {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			pprof.Do(ctx, pprof.Labels("goal", "module-process"), func(ctx context.Context) {
				var c *countRun
				c, err = startCount(ctx, url, qt, o.events, bin)
				if err == nil {
					idleRSS = max(idleRSS, c.rss())
					gr.plugin, err = c.batch(ctx, o)
					c.close()
				}
			})
			cancel()
			if err != nil {
				return fmt.Errorf("module process: %w", err)
			}
		}
		for _, qt := range []string{runtime.QueueQuorum, runtime.QueueClassic} {
			raw, mesh := gr.raw[qt], gr.mesh[qt]
			fmt.Printf("round %d %-7s raw %6.0f events/s (client %5.1f µs, broker %5.1f µs)   in-process %6.0f (%5.1f, %5.1f)",
				r+1, qt, raw.rate, us(raw.client), us(raw.broker), mesh.rate, us(mesh.client), us(mesh.broker))
			if qt == runtime.QueueQuorum {
				pl := gr.plugin
				fmt.Printf("   module process %6.0f (%5.1f = host %5.1f + module %5.1f, %5.1f; peak RSS %.1f MB)",
					pl.rate, us(pl.client), us(pl.host), us(pl.module), us(pl.broker), float64(pl.peakRSS)/1024)
			}
			fmt.Println()
		}
		rounds = append(rounds, gr)
	}
	q, c := runtime.QueueQuorum, runtime.QueueClassic
	rate := func(m counted) float64 { return m.rate }
	client := func(m counted) float64 { return float64(m.client) }
	broker := func(m counted) float64 { return float64(m.broker) }
	row := func(name, qt string, f func(counted) float64, target float64, atLeast bool) goal {
		return goal{name: qt + ": " + name, target: target, atLeast: atLeast,
			ratio: func(g goalRound) float64 { return f(g.mesh[qt]) / f(g.raw[qt]) },
			den:   func(g goalRound) float64 { return f(g.raw[qt]) }}
	}
	goals := []goal{
		row("throughput / raw", q, rate, 0.95, true),
		row("client CPU per event / raw", q, client, 1.15, false),
		row("broker CPU per event / raw", q, broker, 1.0, false),
		row("throughput / raw", c, rate, 0.95, true),
		row("client CPU per event / raw", c, client, 1.15, false),
		row("broker CPU per event / raw", c, broker, 1.10, false),
		{name: "module process / raw (quorum)", target: 0.90, atLeast: true,
			ratio: func(g goalRound) float64 { return g.plugin.rate / g.raw[q].rate },
			den:   func(g goalRound) float64 { return g.raw[q].rate }},
		{name: "module process / in-process", target: 0.95, atLeast: true,
			ratio: func(g goalRound) float64 { return g.plugin.rate / g.mesh[q].rate },
			den:   func(g goalRound) float64 { return g.raw[q].rate }},
	}
	if brokerPID == 0 {
		goals = slices.DeleteFunc(goals, func(g goal) bool { return strings.Contains(g.name, "broker") })
		fmt.Println("broker CPU not measured: rabbitmqctl did not name the broker's process")
	}
	printGoals(goals, rounds)

	// Where the module process's CPU goes, host and process apart.
	var host, module, inproc []float64
	var inRuns, inSwitches, hostRuns, hostSwitches, moduleSwitches []float64
	for _, g := range rounds {
		host, module = append(host, us(g.plugin.host)), append(module, us(g.plugin.module))
		inproc = append(inproc, us(g.mesh[q].client))
		inRuns, inSwitches = append(inRuns, g.mesh[q].hostRuns), append(inSwitches, g.mesh[q].hostSwitches)
		hostRuns, hostSwitches = append(hostRuns, g.plugin.hostRuns), append(hostSwitches, g.plugin.hostSwitches)
		moduleSwitches = append(moduleSwitches, g.plugin.moduleSwitches)
	}
	fmt.Printf("module process, client CPU per event: host (meshbench: emitters and node) %.1f µs + module process %.1f µs, against in-process %.1f µs (medians)\n",
		median(host), median(module), median(inproc))
	fmt.Printf("hand-offs per event on quorum (medians): in-process %.1f goroutine runs, %.1f thread switches; module process: host %.1f goroutine runs, %.1f thread switches, and the process's %.1f thread switches\n",
		median(inRuns), median(inSwitches), median(hostRuns), median(hostSwitches), median(moduleSwitches))
	return moduleMemory(url, o, bin, idleRSS, rounds)
}

// printGoals prints a row per goal: each round's ratio (flagged "!" when
// raw's own figure moved), the median, the spread and the verdict; and
// records each in the summary.
func printGoals(goals []goal, rounds []goalRound) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GOAL\tROUNDS\tMEDIAN\tSPREAD\tTARGET\tVERDICT")
	flagged := false
	for _, g := range goals {
		var ratios, dens []float64
		for _, r := range rounds {
			ratios, dens = append(ratios, g.ratio(r)), append(dens, g.den(r))
		}
		mid := median(dens)
		cells := make([]string, len(ratios))
		for i, x := range ratios {
			cells[i] = fmt.Sprintf("%.2f", x)
			if mid > 0 && (dens[i]/mid > 1+rawMoved || dens[i]/mid < 1-rawMoved) {
				cells[i] += "!"
				flagged = true
			}
		}
		m := median(ratios)
		cmp, met := "<=", m <= g.target
		if g.atLeast {
			cmp, met = ">=", m >= g.target
		}
		verdict := "met"
		if !met {
			verdict = "NOT MET"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f-%.2f\t%s %.2f\t%s\n", g.name, strings.Join(cells, " "), m, slices.Min(ratios), slices.Max(ratios), cmp, g.target, verdict)
		record(g.name, m, g.target, g.atLeast, "")
	}
	tw.Flush()
	if flagged {
		fmt.Printf("!: in that round raw's own figure was more than %.0f%% from its median over the rounds (the machine moved, not only the mesh)\n", rawMoved*100)
	}
}

// memoryBatches is how many batches the memory check sends one module
// process.
const memoryBatches = 5

// moduleMemory prints the module process's resident set: idle (just
// loaded), at its peak under load in the rounds, and after each of
// memoryBatches batches of o.events sent to one process, which must not
// grow with the number of events (at most memoryGrowth from the first
// batch to the last).
func moduleMemory(url string, o options, bin string, idleKB int, rounds []goalRound) error {
	var peaks []float64
	for _, g := range rounds {
		peaks = append(peaks, float64(g.plugin.peakRSS)/1024)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := startCount(ctx, url, runtime.QueueQuorum, o.events, bin)
	if err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	defer c.close()
	var after []float64
	for range memoryBatches {
		if _, err := c.batch(ctx, o); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		after = append(after, float64(c.rss())/1024)
	}
	cells := make([]string, len(after))
	for i, mb := range after {
		cells[i] = fmt.Sprintf("%.1f", mb)
	}
	growth := after[len(after)-1]/after[0] - 1
	fmt.Printf("module process RSS: idle %.1f MB, peak under load %.1f MB (median of the rounds; %.1f-%.1f), after each batch of %d events in one process: %s MB (%+.0f%% from the first to the last)\n",
		float64(idleKB)/1024, median(peaks), slices.Min(peaks), slices.Max(peaks), o.events, strings.Join(cells, ", "), growth*100)
	record("module process RSS growth over "+fmt.Sprint(memoryBatches)+" batches", growth*100, memoryGrowth*100, false, "%")
	return nil
}

// memoryGrowth is how much a module process's resident set may grow from
// its first batch to its last.
const memoryGrowth = 0.10
