package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

// What the mesh costs the broker (issue 30, item 2): raw amqp091-go at
// its best, with the mesh's properties added one at a time, each a
// variant measured in the same alternating rounds, so that the broker's
// CPU per event of each is read against the bare message's in the same
// round. The last variants put all of them together (the mesh's message
// and topology with raw's publishing), then change only the publishing
// pattern to the mesh's (many emitters, each waiting for its confirm),
// then run the mesh itself. docs/adr/0036-what-the-mesh-costs-the-broker.md
// holds the table and what was cut.

// rawVariant is what a raw variant sends and declares.
type rawVariant struct {
	name, adds string
	// headers: the contract's four headers (x-event-id, x-source, x-node,
	// x-time); ids: the message-id and timestamp properties; userID: the
	// user-id property (the broker checks it against the connection's
	// user); mandatory: published mandatory (the broker tracks whether
	// the message was routed, to return it if not).
	headers, ids, userID, mandatory bool
	// alternate: the exchange has an alternate exchange (fanout, bound to
	// a quorum queue), as mesh.events has mesh.events.unrouted; dlx: the
	// queue has a dead-letter exchange (and, on quorum, a delivery
	// limit), as a module's queue has; bindings: the exchange carries the
	// node's own bindings beside the module's (membership's three
	// patterns, to a queue of their own).
	alternate, dlx, bindings bool
	// multiAck: the consumer acks eight deliveries at once with multiple
	// (the mesh's acker), not each on its own.
	multiAck bool
	// slow: the consumer spends this long (on the CPU) on each event
	// before it acks it, as the mesh's handling path does beyond raw's.
	slow time.Duration
	// waiters: 0 publishes from one goroutine keeping the window of
	// confirms in flight; n publishes from n goroutines, each waiting for
	// its own confirm, on one channel (the mesh's emitters).
	waiters int
}

// rawVariants are the variants in the order measured. The first is the
// bare message every ratio is read against.
func rawVariants(meshPublishers int) []rawVariant {
	all := rawVariant{headers: true, ids: true, userID: true, mandatory: true, alternate: true, dlx: true, bindings: true, multiAck: true}
	named := func(v rawVariant, name, adds string) rawVariant {
		v.name, v.adds = name, adds
		return v
	}
	waiting := func(n int) rawVariant {
		v := named(all, fmt.Sprintf("as-mesh-w%d", n), fmt.Sprintf("as-mesh, published by %d goroutines each waiting for its confirm", n))
		v.waiters = n
		return v
	}
	slowed := func(v rawVariant, d time.Duration) rawVariant {
		v.slow = d
		return v
	}
	return []rawVariant{
		{name: "bare", adds: "persistent, content-type; no headers, not mandatory, no queue arguments"},
		{name: "headers", adds: "+ x-event-id, x-source, x-node, x-time", headers: true},
		{name: "ids", adds: "+ message-id, timestamp properties", ids: true},
		{name: "user-id", adds: "+ user-id property (checked by the broker)", userID: true},
		{name: "mandatory", adds: "+ mandatory", mandatory: true},
		{name: "alternate", adds: "+ alternate exchange on the exchange (with mandatory)", mandatory: true, alternate: true},
		{name: "dlx", adds: "+ dead-letter exchange (and delivery limit on quorum) on the queue", dlx: true},
		{name: "bindings", adds: "+ the node's membership bindings on the exchange", bindings: true},
		{name: "multi-ack", adds: "+ acks coalesced, 8 at once with multiple", multiAck: true},
		named(all, "as-mesh", "all of the above: the mesh's message and topology, raw's publishing"),
		waiting(meshPublishers),
		waiting(32),
		slowed(named(all, "as-mesh-slow", "as-mesh, its consumer spending 40 µs more on each event"), 40*time.Microsecond),
	}
}

// rawVariantSide is raw amqp091-go sending and consuming as v says.
type rawVariantSide struct {
	*rawSide
	v        rawVariant
	exchange string
	window   int
}

// newRawVariant declares v's exchange (one per variant: an exchange's
// arguments are fixed at its first declare), its queue and its bindings,
// and starts its consumer.
func newRawVariant(url, qt string, s *sink, v rawVariant, window int) (side, error) {
	pubConn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	subConn, err := amqp.Dial(url)
	if err != nil {
		pubConn.Close()
		return nil, err
	}
	r := &rawVariantSide{
		rawSide:  &rawSide{pubConn: pubConn, subConn: subConn, url: url, queue: fmt.Sprintf("raw.bench%d.events", meshRuns.Add(1))},
		v:        v,
		exchange: "raw.cost." + v.name,
		window:   window,
	}
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
	var exArgs amqp.Table
	if v.alternate {
		if err := r.pub.ExchangeDeclare("raw.cost.unrouted", "fanout", true, false, false, false, nil); err != nil {
			return fail(err)
		}
		if _, err := r.pub.QueueDeclare("raw.cost.unrouted", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return fail(err)
		}
		if err := r.pub.QueueBind("raw.cost.unrouted", "", "raw.cost.unrouted", false, nil); err != nil {
			return fail(err)
		}
		exArgs = amqp.Table{"alternate-exchange": "raw.cost.unrouted"}
	}
	if err := r.pub.ExchangeDeclare(r.exchange, "topic", true, false, false, false, exArgs); err != nil {
		return fail(err)
	}
	sub, err := subConn.Channel()
	if err != nil {
		return fail(err)
	}
	args := amqp.Table{"x-queue-type": qt}
	if v.dlx {
		args["x-dead-letter-exchange"] = "raw.cost.dead"
		if qt == "quorum" {
			args["x-delivery-limit"] = int64(4)
		}
	}
	if _, err := sub.QueueDeclare(r.queue, true, false, false, false, args); err != nil {
		return fail(err)
	}
	if err := sub.QueueBind(r.queue, "module.raw.#", r.exchange, false, nil); err != nil {
		return fail(err)
	}
	if v.bindings {
		// The membership watcher's queue: exclusive, it goes with the
		// connection.
		q, err := sub.QueueDeclare("", false, true, true, false, amqp.Table{"x-queue-type": "classic", "x-max-length": int64(10_000)})
		if err != nil {
			return fail(err)
		}
		for _, key := range []string{"node.*.heartbeat", "node.*.left", "node.*.schemas"} {
			if err := sub.QueueBind(q.Name, key, r.exchange, false, nil); err != nil {
				return fail(err)
			}
		}
	}
	if err := sub.Qos(32, 0, false); err != nil {
		return fail(err)
	}
	deliveries, err := sub.Consume(r.queue, "", false, false, false, false, nil)
	if err != nil {
		return fail(err)
	}
	go consumeRaw(deliveries, s, v.multiAck, v.slow)
	if v.waiters == 0 {
		return &rawVariantStream{r}, nil
	}
	return r, nil
}

// consumeRaw handles deliveries into s, acking each, or, with multiAck,
// every eighth with multiple, after spending slow on each (what is left
// under eight when the round ends stays unacked: the queue is deleted after it).
func consumeRaw(deliveries <-chan amqp.Delivery, s *sink, multiAck bool, slow time.Duration) {
	held := 0
	for d := range deliveries {
		for start := time.Now(); time.Since(start) < slow; {
		}
		if err := s.handle(d.Body); err != nil {
			_ = d.Reject(true)
			continue
		}
		if !multiAck {
			_ = d.Ack(false)
			continue
		}
		if held++; held == 8 {
			_ = d.Ack(true)
			held = 0
		}
	}
}

// send publishes event seq as the variant says.
func (r *rawVariantSide) send(ctx context.Context, seq int) (*amqp.DeferredConfirmation, error) {
	now := time.Now().UTC()
	msg := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body(seq)}
	id := ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	if r.v.headers {
		msg.Headers = amqp.Table{"x-event-id": id, "x-source": "raw", "x-node": "bench", "x-time": now.Format(time.RFC3339Nano)}
	}
	if r.v.ids {
		msg.MessageId, msg.Timestamp = id, now
	}
	if r.v.userID {
		msg.UserId = "guest" // brokertest's vhost is the guest user's
	}
	return r.pub.PublishWithDeferredConfirmWithContext(ctx, r.exchange, "module.raw.measured", r.v.mandatory, false, msg)
}

func (r *rawVariantSide) publish(ctx context.Context, seq int) error {
	dc, err := r.send(ctx, seq)
	if err != nil {
		return err
	}
	return confirmed(ctx, dc)
}

// rawVariantStream is a variant publishing from one goroutine with a
// window of confirms in flight, as raw at its best does.
type rawVariantStream struct{ *rawVariantSide }

func (r *rawVariantStream) stream(ctx context.Context, n int) error {
	return streamWindow(ctx, n, r.window, r.send)
}

// benchBrokerCost measures each raw variant and the mesh, in alternating
// rounds, on each queue type, and prints per variant its throughput, the
// broker's and the client's CPU per event, and the broker's figure as a
// ratio to the bare message's in the same round (the median of the
// rounds' ratios). It then measures what an idle node costs the broker
// per second (heartbeats, membership, the consumer checks).
func benchBrokerCost(url string, o options) error {
	if brokerPID == 0 {
		fmt.Println("\n== what the mesh costs the broker: not measured, rabbitmqctl did not name the broker's process ==")
		return nil
	}
	variants := rawVariants(o.meshPublishers)
	for _, qt := range strings.Split(o.queueTypes, ",") {
		fmt.Printf("\n== what the mesh costs the broker: %s queues, one property at a time (issue 30, item 2) ==\n", qt)
		type series struct{ tp, cpu, broker, backlog []float64 }
		got := map[string]*series{}
		names := make([]string, 0, len(variants)+1)
		mk := map[string]func(*sink) (side, error){}
		publishers := map[string]int{}
		adds := map[string]string{}
		for _, v := range variants {
			names = append(names, v.name)
			mk[v.name] = func(s *sink) (side, error) { return newRawVariant(url, qt, s, v, o.window) }
			publishers[v.name], adds[v.name] = max(v.waiters, 1), v.adds
		}
		names = append(names, "mesh")
		mk["mesh"] = func(s *sink) (side, error) { return newMesh(url, qt, s) }
		publishers["mesh"], adds["mesh"] = o.meshPublishers, fmt.Sprintf("the mesh: %d emitters, each waiting for its emit", o.meshPublishers)
		for r := 0; r < o.rounds; r++ {
			for _, name := range names {
				ro := o
				ro.publishers = publishers[name]
				var sampler *backlogSampler
				sampled := func(s *sink) (side, error) {
					sd, err := mk[name](s)
					if err == nil {
						sampler = sampleBacklog(url, queueOf(sd))
					}
					return sd, err
				}
				tp, cpu, bcpu, err := throughputCPU(sampled, ro)
				backlog := sampler.stop()
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				us, bus := float64(cpu)/float64(time.Microsecond), float64(bcpu)/float64(time.Microsecond)
				fmt.Printf("round %d %-14s %8.0f events/s  client CPU %5.1f µs/event  broker CPU %6.1f µs/event  backlog %6.0f\n", r+1, name, tp, us, bus, backlog)
				if got[name] == nil {
					got[name] = &series{}
				}
				sr := got[name]
				sr.tp, sr.cpu, sr.broker, sr.backlog = append(sr.tp, tp), append(sr.cpu, us), append(sr.broker, bus), append(sr.backlog, backlog)
			}
		}
		bare := got["bare"]
		fmt.Printf("%-14s %9s %11s %11s %12s %8s  %s\n", "VARIANT", "EVENTS/S", "CLIENT µs", "BROKER µs", "BROKER/BARE", "BACKLOG", "WHAT IT ADDS")
		for _, name := range names {
			sr := got[name]
			fmt.Printf("%-14s %9.0f %11.1f %11.1f %12.2f %8.0f  %s\n", name, median(sr.tp), median(sr.cpu), median(sr.broker),
				pairedRatio(sr.broker, bare.broker), median(sr.backlog), adds[name])
		}
		mesh, asMesh := got["mesh"], got["as-mesh"]
		fmt.Printf("the mesh / as-mesh (what the runtime adds beyond its messages and topology): broker %.2f, client %.2f, throughput %.2f\n",
			pairedRatio(mesh.broker, asMesh.broker), pairedRatio(mesh.cpu, asMesh.cpu), pairedRatio(mesh.tp, asMesh.tp))
	}
	return benchIdleNode(url)
}

// queueOf is the queue side sd consumes from.
func queueOf(sd side) string {
	switch sd := sd.(type) {
	case *rawVariantStream:
		return sd.queue
	case *rawVariantSide:
		return sd.queue
	case *meshSide:
		return sd.queue
	}
	return ""
}

// backlogSampler reads a queue's ready messages (those waiting beyond
// what the consumer holds) every backlogEvery while a round runs.
type backlogSampler struct {
	quit    chan struct{}
	done    chan struct{}
	samples []int
}

const backlogEvery = 10 * time.Millisecond

// sampleBacklog starts sampling queue on a connection of its own; it ends
// at stop, or when the queue is gone.
func sampleBacklog(url, queue string) *backlogSampler {
	b := &backlogSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		t := time.NewTicker(backlogEvery)
		defer t.Stop()
		for {
			select {
			case <-b.quit:
				return
			case <-t.C:
			}
			q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
			if err != nil {
				return // deleted at the round's end
			}
			b.samples = append(b.samples, q.Messages)
		}
	}()
	return b
}

// stop ends the sampling and returns the mean of the samples (0 for
// none, or for a nil sampler: the side was not made).
func (b *backlogSampler) stop() float64 {
	if b == nil {
		return 0
	}
	close(b.quit)
	<-b.done
	if len(b.samples) == 0 {
		return 0
	}
	sum := 0
	for _, n := range b.samples {
		sum += n
	}
	return float64(sum) / float64(len(b.samples))
}

// idleFor is how long the idle figures are taken over.
const idleFor = 10 * time.Second

// benchIdleNode prints the broker's CPU per second with no client, and
// with one node and one module loaded and idle: what heartbeats,
// membership and the node's periodic checks cost it.
func benchIdleNode(url string) error {
	quiet := brokerCPUOver(idleFor)
	s := newSink(1)
	sd, err := newMesh(url, "classic", s)
	if err != nil {
		return err
	}
	// Past the node's first heartbeat and announcements: those are a
	// start's, not an idle node's.
	time.Sleep(2 * time.Second)
	idle := brokerCPUOver(idleFor)
	if err := sd.close(); err != nil {
		return err
	}
	perSec := func(d time.Duration) float64 {
		return float64(d) / float64(time.Millisecond) / idleFor.Seconds()
	}
	fmt.Printf("\nidle broker: %.1f ms CPU/s with no node; %.1f ms CPU/s with one idle node and module (%+.1f ms/s: heartbeats, membership, checks)\n",
		perSec(quiet), perSec(idle), perSec(idle)-perSec(quiet))
	return nil
}

// brokerCPUOver is the broker's CPU time over the next d.
func brokerCPUOver(d time.Duration) time.Duration {
	b0 := brokerCPU()
	time.Sleep(d)
	return brokerCPU() - b0
}
