package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// groupNodes and groupKeys are the groups section's shape: a module in a
// group of three nodes on one broker, and for order, 1,000 keys over 16
// partitions (issue 61's figures).
const (
	groupNodes      = 3
	groupKeys       = 1000
	groupPartitions = 16
)

// benchGroups measures, in alternating rounds on quorum queues: raw
// amqp091-go at its best (the baseline of every figure of make bench), the
// module
// unordered on one node at concurrency 32 (the reference), the same module
// as a group of three nodes, and the group keeping order by key (1,000
// keys, 16 partitions), each with concurrency 32 a node, emitted by
// o.meshPublishers concurrent emitters from the first node; throughput,
// client and broker CPU per event, and p99 latency.
func benchGroups(url string, o options) error {
	fmt.Printf("\n== groups (quorum; %d nodes; ordered: %d keys over %d partitions) ==\n", groupNodes, groupKeys, groupPartitions)
	type series struct{ tp, cpu, broker, p99 []float64 }
	names := []string{"raw-best", "unordered", "group", "ordered", "by-rule"}
	mk := map[string]func(*sink) (side, error){
		"raw-best":  func(s *sink) (side, error) { return newRawBest(url, runtime.QueueQuorum, s, o.window) },
		"unordered": func(s *sink) (side, error) { return newGroupSide(url, s, 1, 0, "") },
		"group":     func(s *sink) (side, error) { return newGroupSide(url, s, groupNodes, 0, "") },
		"ordered":   func(s *sink) (side, error) { return newGroupSide(url, s, groupNodes, groupPartitions, "") },
		// Keyed by order_key: every event through the group's intake.
		"by-rule": func(s *sink) (side, error) { return newGroupSide(url, s, groupNodes, groupPartitions, "body.seq") },
	}
	got := map[string]*series{}
	for r := 0; r < o.rounds; r++ {
		for _, name := range names {
			ro := o
			ro.publishers = o.meshPublishers
			if name == "raw-best" {
				ro.publishers = 1 // its one publisher keeps o.window confirms in flight
			}
			tp, cpu, bcpu, err := throughputCPU(mk[name], ro)
			if err != nil {
				return fmt.Errorf("%s throughput: %w", name, err)
			}
			_, p99, err := latency(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s latency: %w", name, err)
			}
			us, bus := float64(cpu)/float64(time.Microsecond), float64(bcpu)/float64(time.Microsecond)
			fmt.Printf("round %d %-9s  %8.0f events/s  client CPU %5.1f µs/event  broker CPU %5.1f µs/event   p99 %6.2f ms\n", r+1, name, tp, us, bus, p99)
			if got[name] == nil {
				got[name] = &series{}
			}
			sr := got[name]
			sr.tp, sr.cpu, sr.broker, sr.p99 = append(sr.tp, tp), append(sr.cpu, us), append(sr.broker, bus), append(sr.p99, p99)
		}
	}
	raw, ref, group, ordered := got["raw-best"], got["unordered"], got["group"], got["ordered"]
	fmt.Printf("throughput  unordered %8.0f  group %8.0f  ordered %8.0f events/s   group/unordered %.2f  ordered/unordered %.2f\n",
		median(ref.tp), median(group.tp), median(ordered.tp), pairedRatio(group.tp, ref.tp), pairedRatio(ordered.tp, ref.tp))
	fmt.Printf("client CPU  unordered %5.1f  group %5.1f  ordered %5.1f µs/event;  broker CPU  unordered %5.1f  group %5.1f  ordered %5.1f µs/event\n",
		median(ref.cpu), median(group.cpu), median(ordered.cpu), median(ref.broker), median(group.broker), median(ordered.broker))
	fmt.Printf("p99 latency at %d events/s  unordered %.2f ms  group %.2f ms  ordered %.2f ms\n", o.rate, median(ref.p99), median(group.p99), median(ordered.p99))
	fmt.Printf("beside raw at its best (%8.0f events/s, client CPU %5.1f, broker CPU %5.1f µs/event, p99 %.2f ms):  unordered %.2f  group %.2f  ordered %.2f\n",
		median(raw.tp), median(raw.cpu), median(raw.broker), median(raw.p99), pairedRatio(ref.tp, raw.tp), pairedRatio(group.tp, raw.tp), pairedRatio(ordered.tp, raw.tp))
	record("groups: a group of 3 nodes / the module unordered on one", pairedRatio(group.tp, ref.tp), 0.90, true, "")
	record("groups: ordered by 1,000 keys over 16 partitions / unordered", pairedRatio(ordered.tp, ref.tp), 0.80, true, "")
	byRule := got["by-rule"]
	fmt.Printf("ordered by order_key body.seq (every event through the intake, 64 keys at once)  %8.0f events/s  /unordered %.2f  broker CPU %5.1f µs/event  p99 %.2f ms (no goal: ADR 48)\n",
		median(byRule.tp), pairedRatio(byRule.tp, ref.tp), median(byRule.broker), median(byRule.p99))
	return nil
}

// groupSide is a module on nodes nodes, one group (when nodes > 1) keeping
// order over partitions partitions (when above 0), emitted from the first
// node; each event keyed by its sequence number modulo groupKeys.
type groupSide struct {
	url      string
	nodes    []*runtime.Node
	mod      *runtime.Module // the first node's, which emits
	queues   []string        // to delete after the round
	exchange []string
	keyed    bool
}

func newGroupSide(url string, s *sink, nodes, partitions int, orderKey string) (side, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("bench%d", meshRuns.Add(1))
	g := &groupSide{url: url, keyed: partitions > 0 && orderKey == ""}
	mc := runtime.ModuleConfig{QueueType: runtime.QueueQuorum, Concurrency: 32, OrderKey: orderKey}
	if nodes > 1 {
		mc.Group = "bench"
		g.queues = append(g.queues, wire.GroupQueue("bench", name))
	}
	if partitions > 0 {
		mc.Partitions = partitions
		g.queues = []string{wire.GroupIntake("bench", name)}
		for i := range partitions {
			g.queues = append(g.queues, wire.PartitionQueue("bench", name, i))
		}
		g.exchange = []string{wire.GroupExchange("bench", name), wire.GroupIntake("bench", name)}
	}
	for i := range nodes {
		state, err := os.MkdirTemp("", "meshbench-")
		if err != nil {
			return nil, errors.Join(err, g.close())
		}
		defer os.RemoveAll(state)
		node, err := runtime.New(ctx, runtime.Config{Node: fmt.Sprintf("bench%d", i), AMQPURL: url, StateDir: state,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatInterval: 250 * time.Millisecond})
		if err != nil {
			return nil, errors.Join(err, g.close())
		}
		g.nodes = append(g.nodes, node)
		g.queues = append(g.queues, wire.ModuleQueue(node.Name(), name))
		mod, err := node.Load(ctx, sdk.Module{Name: name, Emits: []string{"measured", "warmup"}, Setup: func(m sdk.Mesh) error {
			return m.On("module."+name+".#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				if ev.Type == "module."+name+".warmup" {
					return nil
				}
				return s.handle(ev.Body)
			}))
		}}, mc)
		if err != nil {
			return nil, errors.Join(err, g.close())
		}
		if i == 0 {
			g.mod = mod
		}
	}
	if partitions > 0 && nodes > 1 {
		if err := g.spread(ctx, name, partitions); err != nil {
			return nil, errors.Join(err, g.close())
		}
	}
	return g, nil
}

// spread feeds every partition warm-up events (which the handler does not
// count) until the members own their shares (their heartbeats say: max -
// min <= 1), so that the round measures the group at rest, not its first
// moves.
func (g *groupSide) spread(ctx context.Context, name string, partitions int) error {
	for ctx.Err() == nil {
		for k := range wire.Slots * 4 {
			// Keyed by the emitter, or by the rule's field (body.seq).
			if _, err := g.mod.Mesh().Emit(ctx, "warmup", map[string]int{"seq": k}, sdk.WithKey("k"+strconv.Itoa(k))); err != nil {
				return err
			}
		}
		owns := map[string]int{}
		for i, n := range g.nodes {
			for _, p := range g.nodes[(i+1)%len(g.nodes)].Peers() {
				if p.Node != n.Name() {
					continue
				}
				for _, m := range p.Modules {
					if m.Name == name {
						owns[n.Name()] = len(m.Owns)
					}
				}
			}
		}
		lo, hi, total := partitions, 0, 0
		for _, n := range g.nodes {
			lo, hi, total = min(lo, owns[n.Name()]), max(hi, owns[n.Name()]), total+owns[n.Name()]
		}
		if total == partitions && hi-lo <= 1 {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("the group's partitions were not spread over its members within a minute")
}

func (g *groupSide) publish(ctx context.Context, seq int) error {
	var opts []sdk.EmitOption
	if g.keyed {
		opts = append(opts, sdk.WithKey("k"+strconv.Itoa(seq%groupKeys)))
	}
	_, err := g.mod.Mesh().Emit(ctx, "measured", json.RawMessage(body(seq)), opts...)
	return err
}

// close stops the nodes and deletes the round's queues and exchanges.
func (g *groupSide) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, n := range g.nodes {
		errs = append(errs, n.Close(ctx))
	}
	for _, q := range g.queues {
		errs = append(errs, deleteQueue(g.url, q))
	}
	for _, x := range g.exchange {
		errs = append(errs, deleteExchange(g.url, x))
	}
	return errors.Join(errs...)
}
