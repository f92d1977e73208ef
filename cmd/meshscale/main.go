// Command meshscale measures what a mesh of many nodes costs a broker or
// cluster: it runs N nodes (runtime.Node, in one process) with M in-process
// modules each, plus audit loggers on the first nodes (one by default), in
// a virtual host of its own; streams events between the modules; and
// reports the broker's queues, bindings, connections, channels and memory,
// the event path's throughput, and each audit logger's ingest. Run it for 1
// node and for 20, against one broker or the local cluster
// (scripts/cluster.sh), with the audit copy on queues or on the history's
// stream, to put the figures side by side (docs/scaling.md):
//
//	go run ./cmd/meshscale -nodes 1
//	go run ./cmd/meshscale -nodes 20 -loggers 3
//	go run ./cmd/meshscale -nodes 20 -loggers 3 -history
//	go run ./cmd/meshscale -nodes 20 -amqp-urls "$(scripts/cluster.sh urls)" -management-url http://127.0.0.1:15701
//
// Module k of node i is "n<i>m<k>"; it handles the ticks its neighbour
// n<i>m<k+1> emits, so each event is delivered once to a module and once to
// each audit logger. Without -history each logger has a queue of its own
// bound to "#" (N loggers: N copies of every event on the broker); with
// -history every node declares the stream mesh.history bound to "#" (ADR
// 35) and the loggers read it by offset (one copy, N readers).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

type options struct {
	nodes, modules, events, emitters int
	urls                             []string
	management                       string
	audit                            bool
	loggers                          int
	history                          bool
	verbose                          bool
	consumerCheck                    time.Duration
}

// historySegment is the size of one segment file of the history's stream:
// small, as the run's stream is (the broker's default is 500 MB).
const historySegment = 16 << 20

// tickTypes selects the events the modules emit, in an audit store.
var tickTypes = []string{"module.*.tick"}

func main() {
	var o options
	var urls string
	flag.IntVar(&o.nodes, "nodes", 20, "mesh nodes")
	flag.IntVar(&o.modules, "modules", 5, "modules per node")
	flag.IntVar(&o.events, "events", 20000, "events to stream, spread over every module")
	flag.IntVar(&o.emitters, "emitters", 64, "concurrent emitters in all")
	flag.StringVar(&urls, "amqp-urls", runtime.DefaultAMQPURL, "the broker's addresses, comma-separated (a virtual host of the run's own is used)")
	flag.StringVar(&o.management, "management-url", "http://127.0.0.1:15672", "the management API of one broker node")
	flag.BoolVar(&o.audit, "audit", true, "run audit loggers (-audit=false: none, whatever -loggers says)")
	flag.IntVar(&o.loggers, "loggers", 1, "audit loggers, one on each of the first N nodes")
	flag.BoolVar(&o.history, "history", false, "keep the mesh's history on the stream "+runtime.DefaultHistoryStream+" and run the audit loggers on it (ADR 35) instead of a queue each")
	flag.BoolVar(&o.verbose, "verbose", false, "log the nodes' warnings and errors to stderr (they are counted either way)")
	flag.DurationVar(&o.consumerCheck, "consumer-check", 0, "the nodes' ConsumerCheckInterval (0: the default, 10s; negative: no check)")
	flag.Parse()
	o.urls = strings.Split(urls, ",")
	if !o.audit {
		o.loggers = 0
	}
	if o.loggers < 0 || o.loggers > o.nodes {
		fmt.Fprintf(os.Stderr, "meshscale: -loggers %d: want 0 to -nodes (%d)\n", o.loggers, o.nodes)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "meshscale:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	api, err := newAPI(o.management, o.urls[0])
	if err != nil {
		return err
	}
	vhost := fmt.Sprintf("mesh-scale-%d", time.Now().UnixNano())
	if err := api.do(http.MethodPut, "/api/vhosts/"+neturl.PathEscape(vhost), nil, nil); err != nil {
		return fmt.Errorf("make the virtual host: %w", err)
	}
	defer api.do(http.MethodDelete, "/api/vhosts/"+neturl.PathEscape(vhost), nil, nil)
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := api.do(http.MethodPut, "/api/permissions/"+neturl.PathEscape(vhost)+"/"+neturl.PathEscape(api.user), perm, nil); err != nil {
		return fmt.Errorf("grant the virtual host: %w", err)
	}
	var urls []string
	for _, u := range o.urls {
		p, err := neturl.Parse(u)
		if err != nil {
			return fmt.Errorf("-amqp-urls: %v", err)
		}
		p.Path = "/" + vhost
		urls = append(urls, p.String())
	}
	state, err := os.MkdirTemp("", "meshscale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	before, brokers, err := api.memory()
	if err != nil {
		return err
	}
	var history runtime.HistoryConfig
	if o.history {
		// Replicas: every broker node, as a production history would be.
		history = runtime.HistoryConfig{Stream: runtime.DefaultHistoryStream, SegmentBytes: historySegment, Replicas: brokers}
	}

	// An interrupt ends the run as an error does: the virtual host goes.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	logs := &logCounts{}
	counting := countingHandler{counts: logs}
	if o.verbose {
		counting.next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	quiet := slog.New(counting)
	var handled atomic.Int64
	var meshes []sdk.Mesh
	var nodes []*runtime.Node
	var loggers []*auditlogger.Logger
	defer func() {
		// The nodes first: a logger's store closes once its module stopped.
		for _, n := range nodes {
			_ = n.Close(context.Background())
		}
		for _, l := range loggers {
			_ = l.Close()
		}
	}()
	start := time.Now()
	for i := range o.nodes {
		n, err := runtime.New(ctx, runtime.Config{Node: fmt.Sprintf("scale%02d", i), AMQPURLs: urls,
			StateDir: filepath.Join(state, fmt.Sprint(i)), Logger: quiet, HeartbeatInterval: runtime.DefaultHeartbeatInterval,
			ConsumerCheckInterval: o.consumerCheck, History: history})
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		nodes = append(nodes, n)
		for k := range o.modules {
			name := fmt.Sprintf("n%dm%d", i, k)
			next := fmt.Sprintf("n%dm%d", i, (k+1)%o.modules)
			m, err := n.Load(ctx, sdk.Module{Name: name, Emits: []string{"tick"}, Setup: func(m sdk.Mesh) error {
				return m.On("module."+next+".tick", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
					handled.Add(1)
					return nil
				}))
			}}, runtime.ModuleConfig{Concurrency: 4})
			if err != nil {
				return fmt.Errorf("node %d module %s: %w", i, name, err)
			}
			meshes = append(meshes, m.Mesh())
		}
	}
	for i := range o.loggers {
		// Each logger has a store of its own; in history mode it reads the
		// stream from its start (an empty store), granted in-process.
		l, err := auditlogger.Open(filepath.Join(state, fmt.Sprintf("audit%d.db", i)), auditlogger.Options{History: o.history})
		if err != nil {
			return err
		}
		loggers = append(loggers, l)
		if _, err := nodes[i].Load(ctx, l.Module(), runtime.ModuleConfig{Prefetch: 256, Concurrency: 256}); err != nil {
			return fmt.Errorf("audit logger on node %d: %w", i, err)
		}
	}
	fmt.Printf("meshscale: %d nodes × %d modules%s on %d broker address(es), started in %v\n",
		o.nodes, o.modules, loggersPhrase(o), len(urls), time.Since(start).Round(time.Millisecond))

	// The stream: every module emits its share, the emitters spread over
	// the modules. Each logger's store is watched from the first emit.
	start = time.Now()
	ingests := make([]*ingest, len(loggers))
	var watchers sync.WaitGroup
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	for i, l := range loggers {
		ingests[i] = &ingest{node: nodes[i].Name(), store: l.Store()}
		watchers.Go(func() { ingests[i].watch(watchCtx, start, int64(o.events)) })
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.emitters)
	for e := range o.emitters {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(o.events); i = next.Add(1) {
				m := meshes[(int(i)+e)%len(meshes)]
				if _, err := m.Emit(ctx, "tick", map[string]int64{"i": i}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("emit: %w", err)
	}
	for handled.Load() < int64(o.events) {
		if ctx.Err() != nil {
			return fmt.Errorf("only %d of %d events handled", handled.Load(), o.events)
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	fmt.Printf("event path: %d events emitted and handled in %v: %.0f events/s\n", o.events, elapsed.Round(time.Millisecond), float64(o.events)/elapsed.Seconds())

	// The audit loggers: what each held when the event path was done, and
	// when each held every event (up to levelWait more).
	for _, in := range ingests {
		in.atPath, _ = in.store.Count(ctx, store.Filter{Types: tickTypes})
	}
	levelTimer := time.AfterFunc(levelWait, stopWatching)
	watchers.Wait()
	levelTimer.Stop()
	var slowest time.Duration
	level := true
	for i, in := range ingests {
		held, err := in.store.Count(ctx, store.Filter{Types: tickTypes})
		if err != nil {
			return fmt.Errorf("audit logger %d: %w", i+1, err)
		}
		if in.level == 0 {
			level = false
			fmt.Printf("audit logger %d (%s, %s): %d of %d events stored, %d when the event path was done; NOT level %v after the event path\n",
				i+1, in.node, modeName(o), held, o.events, in.atPath, levelWait)
			continue
		}
		slowest = max(slowest, in.level)
		fmt.Printf("audit logger %d (%s, %s): %d of %d events stored, %d when the event path was done; all %v after the first emit (%.0f events/s), %v after the event path\n",
			i+1, in.node, modeName(o), held, o.events, in.atPath, in.level.Round(time.Millisecond), float64(o.events)/in.level.Seconds(),
			max(in.level-elapsed, 0).Round(time.Millisecond))
	}
	if len(ingests) > 0 && level {
		fmt.Printf("audit loggers level: all %d held every event %v after the first emit, %v after the event path\n",
			len(ingests), slowest.Round(time.Millisecond), max(slowest-elapsed, 0).Round(time.Millisecond))
	}

	// The management API refreshes its figures every few seconds: wait
	// until it counts every node's two connections.
	var tot totals
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		if tot, err = api.totals(vhost); err != nil {
			return err
		}
		if tot.Connections >= 2*o.nodes || time.Now().After(deadline) {
			break
		}
	}
	// The message counts are the channels' and come a stats interval (5 s)
	// late: wait until they count what every logger stored, then one
	// interval more for the rest of the virtual host's.
	var queues []queue
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		if queues, err = api.queues(vhost); err != nil {
			return err
		}
		if auditCopy(queues, o).counted(o) || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(statsInterval)
	if queues, err = api.queues(vhost); err != nil {
		return err
	}
	if tot, err = api.totals(vhost); err != nil { // a cluster's other nodes report their channels late
		return err
	}
	after, _, err := api.memory()
	if err != nil {
		return err
	}
	fmt.Printf("broker (virtual host %s): queues %d, bindings %d, connections %d, channels %d, consumers %d\n",
		vhost, tot.Queues, tot.Bindings, tot.Connections, tot.Channels, tot.Consumers)
	fmt.Printf("broker queues by type: %s\n", byType(queues))
	for _, q := range queues {
		if q.Type == "stream" {
			// A member's readers are the consumers attached there and, on
			// the leader, the replicas that copy from it.
			var readers []string
			for _, m := range slices.Sorted(maps.Keys(q.Readers)) {
				readers = append(readers, fmt.Sprintf("%s %d", m, q.Readers[m]))
			}
			fmt.Printf("broker stream %s: %d members (x-initial-cluster-size %d) on %d broker node(s), leader %s, %d consumers, readers by member: %s; %.2f MB of memory\n",
				q.Name, len(q.Members), history.Replicas, brokers, q.Node, q.Consumers, strings.Join(readers, ", "), float64(q.Memory)/1e6)
		}
	}
	if len(loggers) > 0 {
		c := auditCopy(queues, o)
		in, out := c.sums()
		fmt.Printf("audit copy on the broker (%s): %d messages routed in (%.2f per event), %d deliveries (%.2f per event), %.2f MB of queue memory\n",
			c.names(), in, float64(in)/float64(o.events), out, float64(out)/float64(o.events), float64(c.memory())/1e6)
	}
	var all queueSet = queues
	in, out := all.sums()
	fmt.Printf("all queues of the virtual host: %d messages routed in (%.2f per event), %d deliveries (%.2f per event), %.1f MB of queue memory\n",
		in, float64(in)/float64(o.events), out, float64(out)/float64(o.events), float64(all.memory())/1e6)
	fmt.Printf("broker memory (all nodes): %.1f MB before, %.1f MB with the mesh running (+%.1f MB)\n",
		float64(before)/1e6, float64(after)/1e6, float64(after-before)/1e6)
	fmt.Printf("per mesh node: %.1f queues, %.1f bindings, %.1f connections, %.1f channels, %.2f MB of broker memory\n",
		float64(tot.Queues)/float64(o.nodes), float64(tot.Bindings)/float64(o.nodes), float64(tot.Connections)/float64(o.nodes),
		float64(tot.Channels)/float64(o.nodes), float64(after-before)/1e6/float64(o.nodes))
	fmt.Printf("node logs: %d errors, %d warnings%s\n", logs.errors.Load(), logs.warnings.Load(),
		map[bool]string{true: "", false: " (-verbose shows them)"}[o.verbose])
	return nil
}

// statsInterval is the management API's refresh of its figures (the
// broker's collect_statistics_interval, 5 s by default), and a margin.
const statsInterval = 6 * time.Second

// logCounts counts the nodes' warnings and errors: a run that looks clean
// may have recovered from something.
type logCounts struct{ warnings, errors atomic.Int64 }

// countingHandler counts what the nodes log at Warn and above into counts,
// and passes it on to next, if set.
type countingHandler struct {
	counts *logCounts
	next   slog.Handler
}

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.counts.errors.Add(1)
	} else {
		h.counts.warnings.Add(1)
	}
	if h.next == nil {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithAttrs(attrs)
	}
	return h
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithGroup(name)
	}
	return h
}

// levelWait bounds the wait, after the event path, for every audit logger
// to hold every event.
const levelWait = 5 * time.Minute

func loggersPhrase(o options) string {
	switch {
	case o.loggers == 0:
		return ""
	case o.loggers == 1:
		return " + an audit logger (" + modeName(o) + ")"
	default:
		return fmt.Sprintf(" + %d audit loggers (%s)", o.loggers, modeName(o))
	}
}

// modeName says where the audit loggers read.
func modeName(o options) string {
	if o.history {
		return "history stream " + runtime.DefaultHistoryStream
	}
	return "queue of its own"
}

// ingest follows one audit logger's store during a run.
type ingest struct {
	node   string
	store  *store.Store
	atPath int64         // ticks held when the event path was done
	level  time.Duration // from the first emit until it held every tick; 0: not (yet)
}

// watch polls the store until it holds want ticks or ctx ends. The rows
// are counted cheaply first (heartbeats and announcements are rows too),
// the ticks once that count reaches want.
func (in *ingest) watch(ctx context.Context, start time.Time, want int64) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := in.store.Count(ctx, store.Filter{}); err != nil || n < want {
			continue
		}
		if n, err := in.store.Count(ctx, store.Filter{Types: tickTypes}); err == nil && n >= want {
			in.level = time.Since(start)
			return
		}
	}
}

// api is a client of the RabbitMQ management API.
type api struct {
	base, user, pass string
	http             *http.Client
}

func newAPI(base, amqpURL string) (*api, error) {
	u, err := neturl.Parse(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("-amqp-urls: %v", err)
	}
	a := &api{base: strings.TrimSuffix(base, "/"), user: "guest", pass: "guest", http: &http.Client{Timeout: 30 * time.Second}}
	if u.User != nil {
		a.user = u.User.Username()
		a.pass, _ = u.User.Password()
	}
	return a, nil
}

func (a *api) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		return err
	}
	req.SetBasicAuth(a.user, a.pass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("management API %s %s: %s %s", method, path, resp.Status, msg)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// memory is the memory all broker nodes use, in bytes, and how many
// nodes the broker has.
func (a *api) memory() (int64, int, error) {
	var nodes []struct {
		Name    string `json:"name"`
		MemUsed int64  `json:"mem_used"`
		Running bool   `json:"running"`
	}
	if err := a.do(http.MethodGet, "/api/nodes", nil, &nodes); err != nil {
		return 0, 0, err
	}
	var sum int64
	running := 0
	for _, n := range nodes {
		sum += n.MemUsed
		if n.Running {
			running++
		}
	}
	if running == 0 {
		return 0, 0, errors.New("management API: no broker node running")
	}
	return sum, running, nil
}

type totals struct {
	Queues, Bindings, Connections, Channels, Consumers int
}

// totals counts the broker objects of vhost.
func (a *api) totals(vhost string) (totals, error) {
	var t totals
	v := neturl.PathEscape(vhost)
	var list []json.RawMessage
	for _, c := range []struct {
		path string
		n    *int
	}{{"/api/queues/" + v, &t.Queues}, {"/api/bindings/" + v, &t.Bindings}, {"/api/vhosts/" + v + "/connections", &t.Connections},
		{"/api/vhosts/" + v + "/channels", &t.Channels}, {"/api/consumers/" + v, &t.Consumers}} {
		list = nil
		if err := a.do(http.MethodGet, c.path, nil, &list); err != nil {
			return t, err
		}
		*c.n = len(list)
	}
	return t, nil
}

// queue is one queue (or stream) of the management API's list.
type queue struct {
	Name      string   `json:"name"`
	Type      string   `json:"type"`
	Messages  int64    `json:"messages"`
	Consumers int      `json:"consumers"`
	Memory    int64    `json:"memory"`
	Node      string   `json:"node"` // a quorum queue's leader, a stream's writer
	Members   []string `json:"members"`
	// Readers counts a stream's readers on each member.
	Readers map[string]int `json:"readers"`
	Stats   struct {
		Publish    int64 `json:"publish"`     // messages routed to it
		DeliverGet int64 `json:"deliver_get"` // deliveries and gets from it
	} `json:"message_stats"`
}

// queues lists the queues and streams of vhost.
func (a *api) queues(vhost string) ([]queue, error) {
	var qs []queue
	err := a.do(http.MethodGet, "/api/queues/"+neturl.PathEscape(vhost), nil, &qs)
	return qs, err
}

type queueSet []queue

// sums adds up the messages routed to the queues and delivered from them.
func (s queueSet) sums() (in, out int64) {
	for _, q := range s {
		in, out = in+q.Stats.Publish, out+q.Stats.DeliverGet
	}
	return in, out
}

// reported says whether the management API reports every queue's process
// figures (memory; a stream's members): it does so some seconds after a
// queue's declare.
func (s queueSet) reported() bool {
	for _, q := range s {
		if q.Memory == 0 || len(q.Members) == 0 {
			return false
		}
	}
	return true
}

// counted says whether the management API counts, on the audit copy, what
// every logger stored: each logger's queue every event in and out, or the
// stream every event in and out once to each logger.
func (s queueSet) counted(o options) bool {
	if o.loggers == 0 {
		return true
	}
	if !s.reported() {
		return false
	}
	events := int64(o.events)
	if o.history {
		in, out := s.sums()
		return len(s) == 1 && in >= events && out >= int64(o.loggers)*events
	}
	for _, q := range s {
		if q.Stats.Publish < events || q.Stats.DeliverGet < events {
			return false
		}
	}
	return len(s) == o.loggers
}

func (s queueSet) memory() int64 {
	var m int64
	for _, q := range s {
		m += q.Memory
	}
	return m
}

func (s queueSet) names() string {
	var names []string
	for _, q := range s {
		names = append(names, q.Type+" "+q.Name)
	}
	if len(names) == 0 {
		return "none found"
	}
	return strings.Join(names, ", ")
}

// auditCopy is where the broker keeps the audit loggers' copy of the
// events: the history's stream, or each logger's queue.
func auditCopy(qs []queue, o options) queueSet {
	var s queueSet
	for _, q := range qs {
		if (o.history && q.Name == runtime.DefaultHistoryStream) ||
			(!o.history && strings.HasSuffix(q.Name, "."+auditlogger.Name+".events")) {
			s = append(s, q)
		}
	}
	return s
}

// byType counts the queues of each type: "140 quorum, 9 classic, 1 stream".
func byType(qs []queue) string {
	n := map[string]int{}
	for _, q := range qs {
		n[q.Type]++
	}
	var parts []string
	for _, t := range []string{"quorum", "classic", "stream"} {
		parts = append(parts, fmt.Sprintf("%d %s", n[t], t))
		delete(n, t)
	}
	for t, c := range n {
		parts = append(parts, fmt.Sprintf("%d %s", c, t))
	}
	return strings.Join(parts, ", ")
}
