// Command meshbench measures the event path through the mesh runtime beside
// a raw amqp091-go program doing the same work with the same settings, in
// the same run, and prints the ratios. `make bench` runs it.
//
// Both sides publish persistent 256-byte JSON events with the contract's
// headers to a topic exchange with publisher confirms, and consume them
// from a durable queue of the same type with manual acks and prefetch 32,
// decoding each body. The raw baseline is raw amqp091-go at its best: one
// publisher keeping 256 confirms in flight (-window); the older baseline,
// 64 publishers each waiting for its confirm, is printed beside it. The
// mesh side has 256 concurrent emitters (-mesh-publishers). Figures are the
// median of several alternating rounds; a table at the end puts each ratio
// beside its target.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
)

func main() {
	var o options
	flag.IntVar(&o.events, "events", 20000, "events per throughput round")
	flag.IntVar(&o.publishers, "publishers", 64, "concurrent publishers of the raw-wait baseline (each waits for its confirm)")
	flag.IntVar(&o.meshPublishers, "mesh-publishers", 256, "concurrent emitters of the mesh side")
	flag.IntVar(&o.window, "window", 256, "confirms raw at its best keeps in flight from its one publisher")
	flag.IntVar(&o.rate, "rate", 2000, "offered events per second in the latency rounds")
	flag.DurationVar(&o.latencyFor, "latency-for", 0, "length of a latency round (default 5s)")
	flag.IntVar(&o.rounds, "rounds", 5, "alternating rounds per figure; the median is reported")
	flag.StringVar(&o.queueTypes, "queue-types", "quorum,classic", "queue types to measure, the first is the headline")
	flag.StringVar(&o.only, "only", "", "run only \"events\", \"groups\", \"goals\", \"broker\", \"rpc\", \"plugin\", \"tracing\", \"rss\", \"audit\", \"history\", \"delays\", \"schemas\" or \"outbox\"")
	flag.IntVar(&o.rpcSequential, "rpc-sequential", 2000, "sequential calls per round for the round-trip latency")
	flag.IntVar(&o.rpcCalls, "rpc-calls", 20000, "calls per round for the concurrent throughput")
	flag.IntVar(&o.rpcCallers, "rpc-callers", 32, "concurrent callers")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to `FILE`")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "meshbench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "meshbench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "meshbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
