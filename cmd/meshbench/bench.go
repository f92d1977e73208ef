package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

type options struct {
	events, publishers, rate, rounds int
	// meshPublishers are the concurrent emitters of the mesh side at its
	// best; window the confirms raw at its best keeps in flight.
	meshPublishers, window  int
	latencyFor              time.Duration
	queueTypes, only        string
	rpcSequential, rpcCalls int
	rpcCallers              int
}

// payload is the 256-byte JSON body both sides send: the send time lets
// the consumer measure latency.
type payload struct {
	SentNanos int64  `json:"sent_ns"`
	Seq       int    `json:"seq"`
	Pad       string `json:"pad"`
}

func body(seq int) []byte {
	p := payload{SentNanos: time.Now().UnixNano(), Seq: seq}
	b, _ := json.Marshal(p)
	p.Pad = strings.Repeat("x", 256-len(b))
	b, _ = json.Marshal(p)
	return b
}

// side is one implementation under test: it publishes and, through its
// consumer, reports each handled event's latency.
type side interface {
	publish(ctx context.Context, seq int) error
	close() error
}

type sink struct {
	mu        sync.Mutex
	latencies []time.Duration
	handled   atomic.Int64
	want      int64
	done      chan struct{}
}

func newSink(want int) *sink {
	return &sink{want: int64(want), done: make(chan struct{}), latencies: make([]time.Duration, 0, want)}
}

func (s *sink) handle(b []byte) error {
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	lat := time.Since(time.Unix(0, p.SentNanos))
	s.mu.Lock()
	s.latencies = append(s.latencies, lat)
	s.mu.Unlock()
	if s.handled.Add(1) == s.want {
		close(s.done)
	}
	return nil
}

func (s *sink) wait(timeout time.Duration) error {
	select {
	case <-s.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("only %d of %d events handled after %v", s.handled.Load(), s.want, timeout)
	}
}

func run(o options) error {
	if o.latencyFor == 0 {
		o.latencyFor = 5 * time.Second
	}
	url, remove, err := brokertest.Create("mesh-bench")
	if err != nil {
		return fmt.Errorf("make a benchmark vhost: %w", err)
	}
	defer func() {
		if err := remove(); err != nil {
			fmt.Fprintln(os.Stderr, "meshbench:", err)
		}
	}()
	fmt.Printf("meshbench: %d events/round, 256-byte JSON bodies, persistent, confirms on, prefetch 32, %d rounds (median)\n"+
		"raw-best: 1 publisher, %d confirms in flight; raw-wait: %d publishers each waiting for its confirm; mesh: %d concurrent emitters\n",
		o.events, o.rounds, o.window, o.publishers, o.meshPublishers)
	defer printSummary()
	if o.only == "" || o.only == "events" {
		for _, qt := range strings.Split(o.queueTypes, ",") {
			if err := benchQueueType(url, qt, o); err != nil {
				return fmt.Errorf("%s queues: %w", qt, err)
			}
		}
	}
	if o.only == "" || o.only == "groups" {
		if err := benchGroups(url, o); err != nil {
			return fmt.Errorf("groups: %w", err)
		}
	}
	if o.only == "" || o.only == "goals" {
		if err := benchGoals(url, o); err != nil {
			return fmt.Errorf("goals: %w", err)
		}
	}
	if o.only == "" || o.only == "broker" {
		if err := benchBrokerCost(url, o); err != nil {
			return fmt.Errorf("broker cost: %w", err)
		}
	}
	if o.only == "" || o.only == "rpc" {
		if err := benchRPC(url, o); err != nil {
			return fmt.Errorf("rpc: %w", err)
		}
	}
	if o.only == "" || o.only == "plugin" {
		if err := benchPlugin(url, o); err != nil {
			return fmt.Errorf("module process: %w", err)
		}
	}
	if o.only == "" || o.only == "tracing" {
		if err := benchTracing(url, o); err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
	}
	if o.only == "" || o.only == "rss" {
		if err := benchRSS(url, o); err != nil {
			return fmt.Errorf("rss: %w", err)
		}
	}
	if o.only == "" || o.only == "audit" {
		if err := benchAudit(url, o); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	if o.only == "" || o.only == "history" {
		if err := benchHistory(url, o); err != nil {
			return fmt.Errorf("history: %w", err)
		}
	}
	if o.only == "" || o.only == "schemas" {
		if err := benchSchemas(url, o); err != nil {
			return fmt.Errorf("schemas: %w", err)
		}
	}
	if o.only == "" || o.only == "outbox" {
		if err := benchOutbox(url, o); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
	}
	if o.only == "" || o.only == "delays" {
		if err := benchDelays(url, o); err != nil {
			return fmt.Errorf("delays: %w", err)
		}
	}
	return nil
}

// benchQueueType measures, in alternating rounds: raw at its best (one
// publisher keeping o.window confirms in flight, one consumer), the older
// raw baseline (o.publishers publishers each waiting for its confirm),
// the mesh with o.meshPublishers concurrent emitters, each waiting for
// its emit, and the module handling one event at a time (its default) or
// 32 at once (mesh-c32: the independent harness of issue 30).
func benchQueueType(url, qt string, o options) error {
	fmt.Printf("\n== %s queues ==\n", qt)
	type series struct{ tp, cpu, broker, p50, p99 []float64 }
	names := []string{"raw-best", "raw-wait", "mesh", "mesh-c32", "mesh-1"}
	got := map[string]*series{}
	mk := map[string]func(*sink) (side, error){
		"raw-best": func(s *sink) (side, error) { return newRawBest(url, qt, s, o.window) },
		"raw-wait": func(s *sink) (side, error) { return newRaw(url, qt, s) },
		"mesh":     func(s *sink) (side, error) { return newMesh(url, qt, s) },
		"mesh-c32": func(s *sink) (side, error) {
			return newMeshOf(url, qt, s, nil, nil, runtime.ModuleConfig{Concurrency: 32})
		},
		"mesh-1": func(s *sink) (side, error) {
			sd, err := newMesh(url, qt, s)
			if err != nil {
				return nil, err
			}
			return &meshStreamSide{sd.(*meshSide)}, nil
		},
	}
	publishers := map[string]int{"raw-best": 1, "raw-wait": o.publishers, "mesh": o.meshPublishers, "mesh-c32": o.meshPublishers, "mesh-1": 1}
	for r := 0; r < o.rounds; r++ {
		for _, name := range names {
			ro := o
			ro.publishers = publishers[name]
			tp, cpu, bcpu, err := throughputCPU(mk[name], ro)
			if err != nil {
				return fmt.Errorf("%s throughput: %w", name, err)
			}
			p50, p99, err := latency(mk[name], o)
			if err != nil {
				return fmt.Errorf("%s latency: %w", name, err)
			}
			us, bus := float64(cpu)/float64(time.Microsecond), float64(bcpu)/float64(time.Microsecond)
			fmt.Printf("round %d %-8s  %8.0f events/s  client CPU %5.1f µs/event  broker CPU %5.1f µs/event   p50 %6.2f ms   p99 %6.2f ms\n",
				r+1, name, tp, us, bus, p50, p99)
			if got[name] == nil {
				got[name] = &series{}
			}
			sr := got[name]
			sr.tp, sr.cpu, sr.broker, sr.p50, sr.p99 = append(sr.tp, tp), append(sr.cpu, us), append(sr.broker, bus), append(sr.p50, p50), append(sr.p99, p99)
		}
	}
	best, wait, mesh, c32, one := got["raw-best"], got["raw-wait"], got["mesh"], got["mesh-c32"], got["mesh-1"]
	fmt.Printf("one producer (EmitAsync)  %8.0f events/s   %5.1f µs/event   mesh-1/raw-best %.2f\n",
		median(one.tp), median(one.cpu), median(one.tp)/median(best.tp))
	record(qt+": one producer with EmitAsync / raw at its best", pairedRatio(one.tp, best.tp), 0.90, true, "")
	fmt.Printf("throughput  raw-best %8.0f  raw-wait %8.0f  mesh %8.0f events/s   mesh/raw-best %.2f  mesh/raw-wait %.2f\n",
		median(best.tp), median(wait.tp), median(mesh.tp), median(mesh.tp)/median(best.tp), median(mesh.tp)/median(wait.tp))
	fmt.Printf("client CPU  raw-best %5.1f  raw-wait %5.1f  mesh %5.1f µs/event   mesh/raw-best %.2f\n",
		median(best.cpu), median(wait.cpu), median(mesh.cpu), median(mesh.cpu)/median(best.cpu))
	fmt.Printf("concurrency 32  %8.0f events/s  client CPU %5.1f  broker CPU %5.1f µs/event   mesh-c32/raw-best %.2f\n",
		median(c32.tp), median(c32.cpu), median(c32.broker), median(c32.tp)/median(best.tp))
	if brokerPID != 0 {
		fmt.Printf("broker CPU  raw-best %5.1f  raw-wait %5.1f  mesh %5.1f µs/event   mesh/raw-best %.2f (beam.smp, pid %d)\n",
			median(best.broker), median(wait.broker), median(mesh.broker), median(mesh.broker)/median(best.broker), brokerPID)
	} else {
		fmt.Println("broker CPU  not measured: rabbitmqctl did not name the broker's process")
	}
	fmt.Printf("latency at %d events/s: p50 raw %.2f ms  mesh %.2f ms;  p99 raw %.2f ms  mesh %.2f ms   p99 mesh/raw %.2f\n",
		o.rate, median(best.p50), median(mesh.p50), median(best.p99), median(mesh.p99), median(mesh.p99)/median(best.p99))
	record(qt+": in-process throughput / raw at its best", pairedRatio(mesh.tp, best.tp), 0.90, true, "")
	record(qt+": client CPU per event / raw at its best", pairedRatio(mesh.cpu, best.cpu), 1.2, false, "")
	record(qt+": throughput at concurrency 32 / raw at its best", pairedRatio(c32.tp, best.tp), 0.90, true, "")
	record(qt+": client CPU at concurrency 32 / raw at its best", pairedRatio(c32.cpu, best.cpu), 1.2, false, "")
	if brokerPID != 0 {
		record(qt+": broker CPU per event / raw at its best", pairedRatio(mesh.broker, best.broker), 1.1, false, "")
		record(qt+": broker CPU at concurrency 32 / raw at its best", pairedRatio(c32.broker, best.broker), 1.1, false, "")
	}
	record(qt+": p99 latency at "+fmt.Sprint(o.rate)+"/s / raw", pairedRatio(mesh.p99, best.p99), 1.5, false, "")
	return nil
}

// median is the middle of xs, or the mean of the two middles when their
// number is even.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// throughput publishes o.events from o.publishers goroutines and returns
// events handled per second, from the first publish to the last handling,
// and the client's CPU time per event (publisher and consumer together).
func throughput(mk func(*sink) (side, error), o options) (float64, time.Duration, error) {
	tp, client, _, err := throughputCPU(mk, o)
	return tp, client, err
}

// throughputCPU is throughput that also returns the broker's CPU time per
// event over the same span (0 when the broker's process is not known).
func throughputCPU(mk func(*sink) (side, error), o options) (float64, time.Duration, time.Duration, error) {
	var tp float64
	var client time.Duration
	var err error
	var broker0 time.Duration
	tp, client, err = throughputWith(mk, o, func() { broker0 = brokerCPU() })
	if err != nil || brokerPID == 0 {
		return tp, client, 0, err
	}
	return tp, client, (brokerCPU() - broker0) / time.Duration(o.events), nil
}

// throughputWith is throughput, calling started just before the first
// publish.
func throughputWith(mk func(*sink) (side, error), o options, started func()) (float64, time.Duration, error) {
	s := newSink(o.events)
	sd, err := mk(s)
	if err != nil {
		return 0, 0, err
	}
	defer sd.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	started()
	cpu0 := cpuTime()
	start := time.Now()
	if st, ok := sd.(streamer); ok {
		if err := st.stream(ctx, o.events); err != nil {
			return 0, 0, err
		}
		if err := s.wait(2 * time.Minute); err != nil {
			return 0, 0, err
		}
		return float64(o.events) / time.Since(start).Seconds(), (cpuTime() - cpu0) / time.Duration(o.events), nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, o.publishers)
	for range o.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > o.events {
					return
				}
				if err := sd.publish(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	if err := s.wait(2 * time.Minute); err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start)
	return float64(o.events) / elapsed.Seconds(), (cpuTime() - cpu0) / time.Duration(o.events), nil
}

// latency offers o.rate events per second for o.latencyFor, each publish on
// its own goroutine so a slow confirm never lowers the offered rate, and
// returns the p50 and p99 of publish-to-handler latency in milliseconds.
func latency(mk func(*sink) (side, error), o options) (p50, p99 float64, err error) {
	n := int(o.latencyFor.Seconds() * float64(o.rate))
	s := newSink(n)
	sd, err := mk(s)
	if err != nil {
		return 0, 0, err
	}
	defer sd.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	interval := time.Second / time.Duration(o.rate)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sd.publish(ctx, i); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		}()
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return 0, 0, *e
	}
	if err := s.wait(2 * time.Minute); err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slices.Sort(s.latencies)
	q := func(f float64) float64 {
		return float64(s.latencies[int(f*float64(len(s.latencies)-1))]) / float64(time.Millisecond)
	}
	return q(0.50), q(0.99), nil
}

// meshSide runs a node with one module that consumes what it emits.
type meshSide struct {
	name  string // the module's
	node  *runtime.Node
	mod   *runtime.Module
	url   string
	queue string
}

var meshRuns atomic.Int64

func newMesh(url, qt string, s *sink) (side, error) { return newMeshWith(url, qt, s, nil) }

func newMeshWith(url, qt string, s *sink, tp trace.TracerProvider) (side, error) {
	return newMeshOf(url, qt, s, tp, nil, runtime.ModuleConfig{})
}

// newMeshOf is the mesh side with a tracer provider, the module's
// declared schemas and its config (its queue type is qt).
func newMeshOf(url, qt string, s *sink, tp trace.TracerProvider, schemas []sdk.Schema, mc runtime.ModuleConfig) (side, error) {
	return newMeshHandling(url, qt, s, tp, schemas, mc, nil)
}

// newMeshHandling is newMeshOf whose module's handler wrap makes (given
// the module's name and the plain handler), when wrap is not nil.
func newMeshHandling(url, qt string, s *sink, tp trace.TracerProvider, schemas []sdk.Schema, mc runtime.ModuleConfig, wrap func(module string, h sdk.Handler) (sdk.Handler, error)) (side, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state, err := os.MkdirTemp("", "meshbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(state) // the binding record is only needed while the node runs
	node, err := runtime.New(ctx, runtime.Config{
		Node:           "bench",
		AMQPURL:        url,
		StateDir:       state,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		TracerProvider: tp,
	})
	if err != nil {
		return nil, err
	}
	// A fresh module (and queue) per round, so no round sees another's
	// events.
	name := fmt.Sprintf("bench%d", meshRuns.Add(1))
	for i := range schemas {
		schemas[i].Event = "measured"
	}
	mc.QueueType = qt
	var h sdk.Handler = sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		return s.handle(ev.Body)
	})
	if wrap != nil {
		if h, err = wrap(name, h); err != nil {
			node.Close(ctx)
			return nil, err
		}
	}
	mod, err := node.Load(ctx, sdk.Module{Name: name, Emits: []string{"measured"}, Schemas: schemas, Setup: func(m sdk.Mesh) error {
		return m.On("module."+name+".#", h)
	}}, mc)
	if err != nil {
		node.Close(ctx)
		return nil, err
	}
	return &meshSide{name: name, node: node, mod: mod, url: url, queue: "bench." + name + ".events"}, nil
}

func (m *meshSide) publish(ctx context.Context, seq int) error {
	_, err := m.mod.Mesh().Emit(ctx, "measured", json.RawMessage(body(seq)))
	return err
}

// close stops the node and deletes the round's queue, so that idle queues
// do not pile up in the broker and slow the rounds after this one.
func (m *meshSide) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := m.node.Close(ctx)
	return errors.Join(err, deleteQueue(m.url, m.queue))
}

func deleteExchange(url, exchange string) error {
	return onChannel(url, func(ch *amqp.Channel) error { return ch.ExchangeDelete(exchange, false, false) })
}

func deleteQueue(url, queue string) error {
	return onChannel(url, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(queue, false, false, false)
		return err
	})
}

// onChannel runs do on a channel of a connection of its own to url.
func onChannel(url string, do func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return do(ch)
}

// rawSide is the baseline: plain amqp091-go with the same settings.
type rawSide struct {
	pubConn, subConn *amqp.Connection
	pub              *amqp.Channel
	url, queue       string
}

func newRaw(url, qt string, s *sink) (side, error) {
	pubConn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	subConn, err := amqp.Dial(url)
	if err != nil {
		pubConn.Close()
		return nil, err
	}
	r := &rawSide{pubConn: pubConn, subConn: subConn, url: url, queue: fmt.Sprintf("raw.bench%d.events", meshRuns.Add(1))}
	fail := func(err error) (side, error) {
		r.close()
		return nil, err
	}
	if r.pub, err = pubConn.Channel(); err != nil {
		return fail(err)
	}
	if err := r.pub.Confirm(false); err != nil {
		return fail(err)
	}
	if err := r.pub.ExchangeDeclare("raw.events", "topic", true, false, false, false, nil); err != nil {
		return fail(err)
	}
	sub, err := subConn.Channel()
	if err != nil {
		return fail(err)
	}
	args := amqp.Table{"x-queue-type": qt}
	if _, err := sub.QueueDeclare(r.queue, true, false, false, false, args); err != nil {
		return fail(err)
	}
	if err := sub.QueueBind(r.queue, "module.raw.#", "raw.events", false, nil); err != nil {
		return fail(err)
	}
	if err := sub.Qos(32, 0, false); err != nil {
		return fail(err)
	}
	deliveries, err := sub.Consume(r.queue, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	go consumeRaw(deliveries, s, false, 0)
	return r, nil
}

func (r *rawSide) publish(ctx context.Context, seq int) error {
	dc, err := r.send(ctx, seq)
	if err != nil {
		return err
	}
	return confirmed(ctx, dc)
}

// confirmed waits for dc: nil for an ack, an error for a nack or ctx's end.
func confirmed(ctx context.Context, dc *amqp.DeferredConfirmation) error {
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("nacked")
	}
	return nil
}

// send publishes event seq with the contract's headers, persistent and
// mandatory, and returns its confirmation to wait for.
func (r *rawSide) send(ctx context.Context, seq int) (*amqp.DeferredConfirmation, error) {
	now := time.Now().UTC()
	id := ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	return r.pub.PublishWithDeferredConfirmWithContext(ctx, "raw.events", "module.raw.measured", true, false, amqp.Publishing{
		Headers: amqp.Table{
			"x-event-id": id, "x-source": "raw", "x-node": "bench", "x-time": now.Format(time.RFC3339Nano),
		},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    now,
		Body:         body(seq),
	})
}

func (r *rawSide) close() error {
	r.subConn.Close()
	r.pubConn.Close()
	return deleteQueue(r.url, r.queue)
}

// streamer is a side that publishes a whole round itself, from one
// goroutine, rather than one publish per call.
type streamer interface {
	stream(ctx context.Context, n int) error
}

// rawBestSide is raw amqp091-go at its best: one publisher keeping window
// confirms in flight (it waits for the oldest only when the window is
// full), and the same consumer as rawSide.
type rawBestSide struct {
	*rawSide
	window int
}

func newRawBest(url, qt string, s *sink, window int) (side, error) {
	r, err := newRaw(url, qt, s)
	if err != nil {
		return nil, err
	}
	return &rawBestSide{rawSide: r.(*rawSide), window: window}, nil
}

func (r *rawBestSide) stream(ctx context.Context, n int) error {
	return streamWindow(ctx, n, r.window, r.send)
}

// streamWindow publishes events 1..n with send from one goroutine,
// keeping window confirms in flight: it waits for the oldest only when
// the window is full, then for the rest at the end.
func streamWindow(ctx context.Context, n, window int, send func(context.Context, int) (*amqp.DeferredConfirmation, error)) error {
	inFlight := make([]*amqp.DeferredConfirmation, 0, window)
	for seq := 1; seq <= n; seq++ {
		if len(inFlight) == window {
			if err := confirmed(ctx, inFlight[0]); err != nil {
				return err
			}
			inFlight = inFlight[1:]
		}
		dc, err := send(ctx, seq)
		if err != nil {
			return err
		}
		inFlight = append(inFlight, dc)
	}
	for _, dc := range inFlight {
		if err := confirmed(ctx, dc); err != nil {
			return err
		}
	}
	return nil
}

// meshStreamSide is the mesh with one producer goroutine: EmitAsync keeps
// up to 256 events in flight, as raw at its best keeps confirms (its
// latency rounds publish with Emit, as meshSide does).
type meshStreamSide struct{ *meshSide }

func (m *meshStreamSide) stream(ctx context.Context, n int) error {
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	mesh := m.mod.Mesh()
	for seq := 1; seq <= n; seq++ {
		wg.Add(1)
		err := mesh.EmitAsync(ctx, "measured", json.RawMessage(body(seq)), func(_ string, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
		if err != nil {
			wg.Done()
			return err
		}
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return *e
	}
	return nil
}
