package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/cloudevents"
	"github.com/meshkit/mesh/internal/wire"
)

// A group that keeps order by key (ModuleConfig.Partitions; ADR 48):
//
//   - its headers exchange group.<group>.<module> is bound to mesh.events
//     with the module's patterns, and each partition queue
//     group.<group>.<module>.pNNN to it once, on any of its slots (the
//     slots s with s mod Partitions == NNN, each a header mesh-slot-S,
//     which every node stamps from the event's key: wire.SlotHeader);
//   - an event without a slot header (a foreign publisher's that did not stamp
//     it) matches no binding and goes to the exchange's alternate,
//     group.<group>.<module>.intake, a fanout exchange and its queue, which
//     one member at a time (single active consumer) slots and sends on
//     to the group's exchange, confirmed, before it acknowledges it, a
//     key's events one at a time: in order (sendOnward);
//   - under an order_key (ModuleConfig.OrderKey) the intake, not the
//     headers exchange, is bound to mesh.events: every event comes in
//     through it and is keyed by the rule;
//   - every member consumes every partition, each on a channel of its own;
//     the broker feeds one consumer of each at a time (single active
//     consumer), and hands the partition over to the next when its
//     channel closes: what the closed one held comes first, in order
//     (TestSingleActiveConsumerHandover). A member lets a partition go only
//     by closing its channel, never by cancelling its consumer, which would
//     hand over at once and reorder (same test); and it closes it only once
//     the handlers it started have settled (drain, then close);
//   - the deliveries of a partition go to lanes by key: one lane runs one
//     event at a time, in delivery order, the lanes of other keys in
//     parallel, at most Concurrency handler calls for the module; a failed
//     event is tried again in its lane (source.lane), holding its key's
//     later events, until it succeeds or is dead-lettered.

// partitionMoves is how many moves of its partition an event outlasts
// before the broker's delivery limit counts them as attempts.
const partitionMoves = 16

// partitionQueueArgs are the arguments of an ordered group's partitions
// and intake: the module's, with a single active consumer, and room in the
// delivery limit for partitionMoves moves. A partition let go returns what
// its consumer held and had not started, which the broker counts as a
// delivery of each; a lane counts and bounds its attempts itself (the
// broker's limit is for a node that dies handling an event, again and
// again).
func partitionQueueArgs(mc ModuleConfig) amqp.Table {
	args := moduleQueueArgs(mc)
	args["x-single-active-consumer"] = true
	if limit, ok := args[limitArg].(int64); ok {
		args[limitArg] = limit + partitionMoves
	}
	return args
}

// consumePartitions consumes the ordered partitions of m's group on s
// (and its intake): it declares what the group needs, binds and consumes.
func (m *Module) consumePartitions(ctx context.Context, s *session, patterns []string) error {
	g, name, n := m.cfg.Group, m.def.Name, m.cfg.Partitions
	exchange, intake := wire.GroupExchange(g, name), wire.GroupIntake(g, name)
	ch, err := m.openTracked(s)()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.ExchangeDeclare(intake, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", intake, err)
	}
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeHeaders, true, false, false, false, amqp.Table{"alternate-exchange": intake}); err != nil {
		return fmt.Errorf("declare exchange %s of group %s: %w", exchange, g, err)
	}
	// The slots' bindings are n's, and the way in the rule's: a node that
	// bound them for another count would leave slots bound to two
	// partitions, one that changed the rule would key a key's later events
	// apart from its earlier ones.
	rule, err := parseOrderKey(m.cfg.OrderKey)
	if err != nil {
		return err
	}
	record := exchange + ".partitions"
	had, err := m.node.bindings.load(record)
	if err != nil {
		return err
	}
	e, err := m.loadEpoch()
	if err != nil {
		return err
	}
	if e.Number == 0 && len(had) >= 1 && had[0] != strconv.Itoa(n) {
		return fmt.Errorf("partitions: this node bound group %s's slots over %s partitions, and its entry now says %d: a group's count changes by meshctl groups repartition, not by its entries; give it %s again", g, had[0], n, had[0])
	}
	if len(had) >= 1 {
		if was := strings.Join(had[1:], ""); was != rule.rule {
			return fmt.Errorf("order_key: this node keyed group %s's events by %q, and its entry now says %q: a group's key does not change (its keys' order would break across the change); give it %q again", g, was, rule.rule, was)
		}
	}
	// The way in: the group's exchange, by the slot every node stamps from
	// the emitter's key; under a rule, the intake, which keys each event by
	// it. The new way is bound before the other is unbound.
	in, other := exchange, intake
	if rule.rule != "" {
		in, other = intake, exchange
	}
	if err := m.reconcileExchangeBindings(ch, in, patterns); err != nil {
		return err
	}
	if err := m.reconcileExchangeBindings(ch, other, nil); err != nil {
		return err
	}
	// The group's count is its latest epoch's, which the broker's queues
	// say (repartition.go): the entry's only until a change.
	if e, err = m.discoverEpoch(s, e); err != nil {
		return err
	}
	if err := m.setEpoch(e); err != nil {
		return err
	}
	if e.Number > 0 && e.Count != n {
		m.log.Warn("the group's partition count was changed by meshctl groups repartition; the group's count stands, not the entry's: give the entry the group's", "group", g, "partitions", e.Count, "entry_partitions", n, "epoch", e.Number)
	}
	n = e.Count
	args := partitionQueueArgs(m.cfg)
	queues := append([]string{intake}, make([]string, n)...)
	for i := range n {
		queues[i+1] = wire.PartitionQueueOf(g, name, e.Number, i)
	}
	for _, q := range queues {
		if ch, err = m.node.declareQueue(ctx, s, m.reusing(s, ch), m.untrack, q, args); err != nil {
			return fmt.Errorf("declare queue %s of group %s (the group's members declare it alike: their max_attempts and partitions must agree): %w", q, g, err)
		}
	}
	if err := ch.QueueBind(intake, "", intake, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", intake, err)
	}
	// While a change is under way its intake member binds (repartition.go):
	// a member bound the new partitions before it unbound the old ones
	// would copy events into both.
	for i := range n {
		if !e.Settled {
			break
		}
		q := wire.PartitionQueueOf(g, name, e.Number, i)
		if err := ch.QueueBind(q, "", exchange, false, slotMatch(i, n)); err != nil {
			return fmt.Errorf("bind %s to its slots: %w", q, err)
		}
	}
	stored := []string{strconv.Itoa(m.cfg.Partitions)}
	if e.Number == 0 {
		stored[0] = strconv.Itoa(n)
	}
	if rule.rule != "" {
		stored = append(stored, rule.rule)
	}
	if err := m.node.bindings.store(record, stored); err != nil {
		return err
	}
	m.untrack(ch) // declared; each queue is consumed on a channel of its own
	if err := m.consumeIntake(s, intake, exchange, rule); err != nil {
		return err
	}
	return m.consumeEpoch(s, e)
}

// reconcileExchangeBindings binds exchange (the group's or its intake) to
// mesh.events with every pattern in want and unbinds those recorded for it
// that want no longer has.
func (m *Module) reconcileExchangeBindings(ch *amqp.Channel, exchange string, want []string) error {
	return m.reconcile(exchange, want,
		func(p string) error { return ch.ExchangeBind(exchange, p, wire.ExchangeEvents, false, nil) },
		func(p string) error { return ch.ExchangeUnbind(exchange, p, wire.ExchangeEvents, false, nil) })
}

// consumeOrdered opens a tracked channel with prefetch and consumes queue
// on it with tag; the channel is an ordered one, which Stop closes without
// cancelling its consumer (see above).
func (m *Module) consumeOrdered(s *session, queue, tag string, prefetch int, watch bool) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := m.openTracked(s)()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		m.untrack(ch)
		return nil, nil, fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		m.untrack(ch)
		return nil, nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	m.addTag(ch, tag, queue)
	m.mu.Lock()
	for i := range m.consumers {
		if m.consumers[i].ch == ch {
			m.consumers[i].ordered = true
		}
	}
	m.mu.Unlock()
	if watch {
		go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	}
	return ch, deliveries, nil
}

// consumePartition consumes queue, partition i of epoch (or its catch-up
// queue), dispatching its deliveries to lanes by key once every queue in
// after is gone (repartition.go).
func (m *Module) consumePartition(s *session, epoch, i int, queue string, after []string) error {
	ch, deliveries, err := m.consumeOrdered(s, queue, m.consumerTag(queue[strings.LastIndexByte(queue, '.'):]), m.cfg.Prefetch, false)
	if err != nil {
		return err
	}
	catchUp := queue == wire.CatchUpQueue(m.cfg.Group, m.def.Name, epoch, i)
	p := &partition{m: m, s: s, ch: ch, epoch: epoch, index: i, queue: queue, catchUp: catchUp, after: after,
		lanes: map[string]*lane{}, acks: newAcker(ch, m.cfg.Prefetch), kick: make(chan struct{}, 1), closed: make(chan struct{})}
	if m.dedup != nil {
		p.acks.records = m.writeRecords // no ack before the handled ids are written down
	}
	go p.flusher()
	m.mu.Lock()
	if m.partitions == nil {
		m.partitions = map[string]*partition{}
	}
	m.partitions[queue] = p
	m.mu.Unlock()
	go p.watch(ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	go p.dispatch(deliveries)
	return nil
}

// watch follows p's channel: once it closes, what waits for a gate stops
// waiting (and the module resumes if the broker closed it); a cancel
// says the queue was deleted (Module.partitionCancelled).
func (p *partition) watch(closed <-chan *amqp.Error, cancelled <-chan string) {
	for {
		select {
		case err, ok := <-closed:
			close(p.closed)
			if ok && err != nil {
				p.m.resumeLater(p.s, p.ch, "its channel closed", err)
			}
			return
		case _, ok := <-cancelled:
			if ok {
				p.m.partitionCancelled(p)
			}
			cancelled = nil
		}
	}
}

// partition is one ordered partition's consumer on this node, on one
// channel: a partition let go (yield) is consumed again by a new one.
type partition struct {
	m     *Module
	s     *session
	ch    *amqp.Channel
	epoch int
	index int
	queue string
	// catchUp says the queue is a change's catch-up queue; after are the
	// queues that must be gone before its events run (repartition.go), and
	// closed closes with the channel.
	catchUp bool
	after   []string
	closed  chan struct{}
	// fed says the broker delivered to this consumer: it is the
	// partition's active one (single active consumer), or was.
	fed atomic.Bool
	// acks coalesces the lanes' acknowledgements (ADR 23), sent within
	// ackLinger of the first held (flusher), and all of them before the
	// channel closes (yield, Module.Stop).
	acks *acker
	kick chan struct{}

	mu       sync.Mutex
	lanes    map[string]*lane // by key: the keys with an event in hand or waiting
	draining bool             // letting go: no event is started any more
	retiring bool             // its retire marker came: deleted once no lane holds an event
	retired  bool             // deleted, or being deleted
	running  sync.WaitGroup   // lanes' handler calls under way
}

// owned reports whether this node's consumer is the partition's active
// one, as far as it can tell: it was fed, and is not letting go.
func (p *partition) owned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fed.Load() && !p.draining
}

// yield lets the partition go to the next member in the broker's line:
// it starts no event any more, waits for the handler calls under way to
// return (at most the handler timeout and a grace), closes the channel,
// so that what it held and had not settled comes back first, in order,
// to the next consumer (TestSingleActiveConsumerHandover), and consumes
// the partition again, at the back of the line.
func (p *partition) yield() {
	m := p.m
	p.mu.Lock()
	if p.draining {
		p.mu.Unlock()
		return
	}
	p.draining = true
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(m.cfg.HandlerTimeout + 5*time.Second):
		m.log.Warn("a partition is let go with a handler still running past its timeout", "queue", p.queue)
	}
	p.flush()
	m.untrack(p.ch)
	m.log.Info("partition let go to another member of the group", "queue", p.queue)
	if m.node.session() != p.s || p.s.isLost() {
		return // the next session consumes it again
	}
	m.mu.Lock()
	stopped := m.stopped
	m.mu.Unlock()
	if stopped {
		return
	}
	err := m.consumePartition(p.s, p.epoch, p.index, p.queue, p.after)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound && (p.catchUp || p.epoch < m.currentEpoch().Number) {
		m.markGone(p.queue) // retired meanwhile by the member it went to
		return
	}
	if err != nil {
		m.log.Warn("consuming a partition again after letting it go failed; it is consumed again when the module resumes", "queue", p.queue, "err", err)
	}
}

// balance spreads the group's partitions over its members, while the
// module runs: at each heartbeat, a partition this node's consumer is fed
// that the spread (spread) gives another live member is let go (yield),
// so that the broker feeds the next in line; in the end each member owns
// its share (max - min <= 1). Without membership (HeartbeatInterval) it
// does nothing: the broker's first consumer keeps every partition.
func (m *Module) balance(ctx context.Context) {
	if !m.node.membership() {
		return
	}
	t := time.NewTicker(m.node.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		members := m.groupMembers()
		m.mu.Lock()
		var give []*partition
		for _, p := range m.partitions {
			if p.catchUp || p.epoch < m.epoch.Number {
				// A change's queue, deleted once handled: consuming it again
				// while its owner deletes it can crash the broker's channel
				// and with it the connection (RabbitMQ 3.10: a consume_ok
				// for a consumer the delete removed, badkey in
				// rabbit_channel:consumer_monitor); it is not moved.
				continue
			}
			if owner := spread(members, p.index); owner != m.node.cfg.Node && owner != "" && p.owned() {
				give = append(give, p)
			}
		}
		m.mu.Unlock()
		for _, p := range give {
			p.yield()
		}
	}
}

// spread is the member that owns partition i: the members, sorted by
// name, take the partitions in turn. "" when there is none.
func spread(members []string, i int) string {
	if len(members) == 0 {
		return ""
	}
	return members[i%len(members)]
}

// groupMembers are the live members of m's group, sorted: this node, and
// each peer heard within two of its heartbeats that runs the module in the
// group with as many partitions.
func (m *Module) groupMembers() []string {
	members := []string{m.node.cfg.Node}
	e := m.currentEpoch()
	now := time.Now()
	for _, p := range m.node.Peers() {
		if p.Unreachable || now.Sub(p.LastSeen) > 2*max(p.Interval, m.node.cfg.HeartbeatInterval) {
			continue
		}
		for _, s := range p.Modules {
			if s.Name != m.def.Name || s.Group != m.cfg.Group || s.Status != "running" {
				continue
			}
			if s.Epoch != e.Number {
				// A change of the count under way: a peer ahead of this
				// node says it was made (the node follows it), one behind
				// it follows.
				if _, heard := m.mismatched.LoadOrStore(fmt.Sprintf("epoch/%d", s.Epoch), true); !heard && s.Epoch > e.Number {
					go m.follow(m.node.session())
				}
				continue
			}
			if s.Partitions != e.Count || s.OrderKey != m.cfg.OrderKey {
				// Its slots are bound over another count, or its events
				// keyed by another rule: a key may be in two partitions.
				// Said once per peer, count and rule.
				if _, said := m.mismatched.LoadOrStore(fmt.Sprintf("%s/%d/%s", p.Node, s.Partitions, s.OrderKey), true); !said {
					m.log.Error("a member of the group keeps order over another partition count or by another order_key: the events of a key may reach two partitions and lose their order; give every member the same partitions and order_key:",
						"group", m.cfg.Group, "peer", p.Node, "peer_partitions", s.Partitions, "partitions", e.Count, "peer_order_key", s.OrderKey, "order_key", m.cfg.OrderKey)
				}
				continue
			}
			members = append(members, p.Node)
		}
	}
	slices.Sort(members)
	return slices.Compact(members)
}

// ownedPartitions are the partitions this node's consumers are fed, as far
// as it can tell, sorted.
func (m *Module) ownedPartitions() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var owned []int
	for _, p := range m.partitions {
		if !p.catchUp && p.epoch == m.epoch.Number && p.owned() {
			owned = append(owned, p.index)
		}
	}
	slices.Sort(owned)
	return owned
}

// HotKey is a key of an ordered group with events waiting on this node:
// its partition, and how many of its events the node holds (the one in
// hand and those behind it). A key that holds about Prefetch events holds
// up the other keys of its partition: the broker delivers no more of the
// partition until it has fewer.
type HotKey struct {
	Key       string `json:"key"`
	Partition int    `json:"partition"`
	Waiting   int    `json:"waiting"`
}

// hotKeys are the n keys of m's partitions with the most events held here,
// those with two or more (one in hand and one behind it), the most first.
func (m *Module) hotKeys(n int) []HotKey {
	m.mu.Lock()
	parts := slices.Collect(maps.Values(m.partitions))
	m.mu.Unlock()
	var hot []HotKey
	for _, p := range parts {
		p.mu.Lock()
		for key, l := range p.lanes {
			if len(l.waiting) >= 2 {
				hot = append(hot, HotKey{Key: key, Partition: p.index, Waiting: len(l.waiting)})
			}
		}
		p.mu.Unlock()
	}
	slices.SortFunc(hot, HotterFirst)
	return hot[:min(n, len(hot))]
}

// HotterFirst orders hot keys the most held first, then by key: for
// slices.SortFunc.
func HotterFirst(a, b HotKey) int {
	if a.Waiting != b.Waiting {
		return b.Waiting - a.Waiting
	}
	return strings.Compare(a.Key, b.Key)
}

// lane is the events of one key of a partition in hand: the first is
// being handled (or waits to be tried again), the others wait behind it.
type lane struct {
	p       *partition
	key     string
	waiting []amqp.Delivery // waiting[0] is in hand
	tried   int             // attempts the lane made of waiting[0]
}

// dispatch hands each delivery to the lane of its key, starting the lane
// when it was idle, until the channel closes.
func (p *partition) dispatch(deliveries <-chan amqp.Delivery) {
	gated := len(p.after) > 0
	for d := range deliveries {
		p.fed.Store(true)
		if gated {
			// Held until the queues before it are gone: their events of
			// its slots come first.
			if !p.m.waitGone(p.after, p.closed) {
				return // let go, or stopping: what it held returns in order
			}
			gated = false
		}
		if marker, ok := isMarker(d); ok {
			if marker == wire.PartitionsRetire {
				p.retire(d)
			} else {
				p.m.log.Warn("a marker of a partition count change reached a partition, not the intake; acknowledged and ignored", "queue", p.queue, "marker", marker, "user_id", d.UserId)
				_ = p.acks.ack(d.DeliveryTag)
				p.flushSoon()
			}
			continue
		}
		key, err := keyOf(d)
		if err != nil {
			o, _ := p.m.node.originOf(d)
			p.m.from(d).delivered.Add(1)
			p.m.deadLetter(p.source(nil), d, o.eventType, 1, wire.DeadReasonMalformed, err)
			continue
		}
		p.mu.Lock()
		l := p.lanes[key]
		start := l == nil
		if start {
			l = &lane{p: p, key: key}
			p.lanes[key] = l
		}
		l.waiting = append(l.waiting, d)
		p.mu.Unlock()
		if start {
			l.run()
		}
	}
}

// flushSoon has the flusher send the held acks within ackLinger.
func (p *partition) flushSoon() {
	select {
	case p.kick <- struct{}{}:
	default: // a flush is due already
	}
}

// flusher sends the acks the lanes hold, ackLinger after the first, so
// that the acks of events settled together go as one, until the channel
// closes.
func (p *partition) flusher() {
	closed := p.ch.NotifyClose(make(chan *amqp.Error, 1))
	t := time.NewTimer(ackLinger)
	t.Stop()
	for {
		select {
		case <-closed:
			return
		case <-p.kick:
		}
		t.Reset(ackLinger)
		select {
		case <-closed:
			return
		case <-t.C:
		}
		p.flush()
	}
}

// flush sends every ack the lanes hold.
func (p *partition) flush() {
	if err := p.acks.flush(); err != nil && !p.ch.IsClosed() {
		p.m.log.Warn("acks of a partition failed; its events will be delivered again (and recognised as handled)", "queue", p.queue, "err", err)
	}
}

// keyOf is a delivery's key: its x-partition-key, else the CloudEvents
// partitioning extension's partitionkey of a binary-mode CloudEvent
// (cloudEvents_partitionkey, cloudEvents:partitionkey or ce-partitionkey,
// as cloudevents.Prefixes), "" when it has neither.
func keyOf(d amqp.Delivery) (string, error) {
	header := wire.HeaderPartitionKey
	v, ok := d.Headers[header]
	for _, prefix := range cloudevents.Prefixes {
		if ok {
			break
		}
		header = prefix + cloudevents.PartitionKey
		v, ok = d.Headers[header]
	}
	if !ok {
		return "", nil
	}
	key, isText := v.(string)
	if !isText {
		return "", &wire.MalformedError{Reason: fmt.Sprintf("header %s is %T, want a string", header, v)}
	}
	if err := wire.CheckKey(key); err != nil {
		return "", &wire.MalformedError{Reason: fmt.Sprintf("header %s: %v", header, err)}
	}
	return key, nil
}

// source is the partition as the source of a delivery of lane l.
func (p *partition) source(l *lane) source {
	src := source{queue: p.queue, quorum: true, acks: p.acks}
	if l != nil {
		src.lane = l
	}
	return src
}

// run handles the lane's first event in a goroutine of its own (one of
// the module's workers), unless the module is stopping: then it leaves it
// unacknowledged, for the partition's next consumer once the channel
// closes.
func (l *lane) run() {
	m, p := l.p.m, l.p
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining || p.ch.IsClosed() {
		return // left unacknowledged: the next consumer gets it first
	}
	m.workers.Add(1)
	p.running.Add(1)
	d, tried := l.waiting[0], l.tried
	go func() {
		defer m.workers.Done()
		defer p.running.Done()
		select {
		case m.partitionSlots <- struct{}{}:
		case <-m.stopping:
			return
		}
		defer func() { <-m.partitionSlots }()
		m.handleFrom(p.source(l), d, tried, nil)
	}()
}

// settled is the lane's first event settled: the lane goes on to the next,
// or ends.
func (l *lane) settled() {
	l.p.flushSoon()
	if h := l.p.m.node.hook().caughtUp; h != nil && l.p.catchUp {
		h(l.p.queue)
	}
	l.p.mu.Lock()
	l.waiting = l.waiting[1:]
	l.tried = 0
	more := len(l.waiting) > 0
	if !more {
		delete(l.p.lanes, l.key)
	}
	l.p.mu.Unlock()
	if more {
		l.run()
	} else {
		l.p.retireIfDrained()
	}
}

// retry tries the lane's first event again after delay.
func (l *lane) retry(delay time.Duration) {
	l.p.mu.Lock()
	l.tried++
	l.p.mu.Unlock()
	l.p.m.later(delay, l.run)
}

// intakeWindow is how many of the intake's events its member sends on at
// once, of different keys: a key's go one at a time.
const intakeWindow = 64

// consumeIntake consumes the group's intake: one member at a time (single
// active consumer) keys each event there (by the group's rule, when it has
// one) and sends it on to the group's exchange (sendOnward).
func (m *Module) consumeIntake(s *session, intake, exchange string, rule orderKey) error {
	_, deliveries, err := m.consumeOrdered(s, intake, m.consumerTag(".intake"), intakeWindow, true)
	if err != nil {
		return err
	}
	go m.sendOnward(s, deliveries, exchange, rule)
	return nil
}

// intakeKey is d's key: by rule, when the group has one (it replaces the
// emitter's), else its x-partition-key.
func intakeKey(d amqp.Delivery, rule orderKey) (string, error) {
	if rule.rule != "" {
		return rule.of(d)
	}
	return keyOf(d)
}

// onward is an event of the intake being sent on: done closes once it is
// settled, sent saying whether it went (written before done closes).
type onward struct {
	done chan struct{}
	sent bool
}

// sendOnward sends the intake's deliveries on, in order by key: up to
// intakeWindow at once, but an event only once its key's previous one was
// sent and acknowledged, so that a key's events reach their partition in
// the intake's order even when one must be tried again; it waits behind
// that one while the intake goes on to other keys' (their order is their
// own), as long as the window has room. An event with a malformed key, or
// none by the rule, is dead-lettered. It stops at an event that could not
// be sent (the module stopping, the session lost): what it has not
// acknowledged waits, in order, for the intake's next consumer.
func (m *Module) sendOnward(s *session, deliveries <-chan amqp.Delivery, exchange string, rule orderKey) {
	window := make(chan struct{}, intakeWindow)
	pending := map[string]*onward{}
	// settle waits until every event sent on is settled; false if one
	// could not be sent.
	settle := func() bool {
		for k, p := range pending {
			<-p.done
			if !p.sent {
				return false
			}
			delete(pending, k)
		}
		return true
	}
	// A change of the partition count under way (repartition.go): its
	// start marker, held until its end marker comes, and where the
	// events between them go.
	var change *wire.PartitionChange
	var started amqp.Delivery
	for d := range deliveries {
		if marker, ok := isMarker(d); ok {
			if !settle() {
				return
			}
			if h := m.node.hook().intakeMarker; h != nil {
				h(marker)
			}
			switch marker {
			case wire.PartitionsStart:
				failed, ok := m.untilDone(s, "change the group's partition count", func() (bool, error) {
					c, permanent, err := m.startChange(context.Background(), s, d)
					if err == nil {
						change, started = &c, d
					}
					return permanent, err
				})
				if !ok {
					return
				}
				if failed {
					m.ackMarker(d)
				}
			case wire.PartitionsEnd:
				if change != nil {
					c := *change
					if _, ok := m.untilDone(s, "retire the catch-up queues of a partition count change", func() (bool, error) {
						return false, m.endChange(context.Background(), s, c)
					}); !ok {
						return
					}
					m.ackMarker(started)
					change = nil
				}
				m.ackMarker(d)
			default:
				m.log.Warn("a retire marker reached the group's intake; acknowledged and ignored", "user_id", d.UserId)
				m.ackMarker(d)
			}
			continue
		}
		key, err := intakeKey(d, rule)
		if err != nil {
			o, _ := m.node.originOf(d)
			m.deadLetter(source{queue: wire.GroupIntake(m.cfg.Group, m.def.Name), quorum: true}, d, o.eventType, 1, wire.DeadReasonMalformed, err)
			continue
		}
		prev := pending[key]
		if len(pending) > 4*intakeWindow {
			for k, p := range pending {
				select {
				case <-p.done:
					delete(pending, k)
				default:
				}
			}
		}
		select {
		case window <- struct{}{}:
		case <-m.stopping:
			return
		}
		if s.isLost() {
			return
		}
		w := &onward{done: make(chan struct{})}
		pending[key] = w
		to := ""
		if change != nil {
			to = wire.CatchUpQueue(m.cfg.Group, m.def.Name, change.Epoch, wire.Slot(key)%change.Partitions)
		}
		go func() {
			defer close(w.done)
			defer func() { <-window }()
			if prev != nil {
				// Behind its key's previous: the loop goes on to other
				// keys meanwhile, however long that one takes.
				<-prev.done
				if !prev.sent {
					return // unacknowledged, in order, for the next consumer
				}
			}
			w.sent = m.slotOnward(s, d, exchange, to, rule, key)
		}()
	}
}

// slotOnward sends d on to the group's exchange with key's slot (or
// straight to the queue to, a catch-up queue, when not ""), then
// acknowledges it; under a rule, key replaces the emitter's
// (x-partition-key) and every slot header the event bore. It reports
// whether it sent it: not when the module stops or the session is lost
// first (d then waits, unacknowledged, for the next consumer).
func (m *Module) slotOnward(s *session, d amqp.Delivery, exchange, to string, rule orderKey, key string) bool {
	o, _ := m.node.originOf(d)
	msg := amqpmsg.Republishing(d, amqpmsg.Bookkeeping)
	msg.UserId = m.node.userID
	msg.Headers[wire.HeaderUserID] = o.userID
	delete(msg.Headers, wire.HeaderPartitions) // the node's own marker is never an event's
	if rule.rule != "" {
		for h := range msg.Headers {
			if strings.HasPrefix(h, wire.SlotHeaderPrefix) {
				delete(msg.Headers, h)
			}
		}
	}
	if rule.rule != "" || key != "" {
		msg.Headers[wire.HeaderPartitionKey] = key // the rule's, or a CloudEvent's partitionkey: the handler sees it where a key is
	}
	msg.Headers[wire.SlotHeader(key)] = wire.SlotMark
	routingKey := d.RoutingKey
	if to != "" {
		// Straight to the queue: the event's type rides a header, as a
		// node's own copy's does.
		if _, kept := msg.Headers[wire.HeaderRoutingKey]; !kept || d.Exchange != "" {
			msg.Headers[wire.HeaderRoutingKey] = d.RoutingKey
		}
		exchange, routingKey = "", to
	}
	for attempt := 1; ; attempt++ {
		var err error
		if h := m.node.hook().intakeSend; h != nil {
			err = h(key)
		}
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = m.node.publishConfirmed(ctx, s, exchange, routingKey, msg)
			cancel()
		}
		if err == nil {
			break
		}
		delay := expBackoff(100*time.Millisecond, 10*time.Second, attempt)
		m.log.Warn("an event of the group's intake could not be sent on to its partition; it waits in the intake, and is tried again", "event_id", d.MessageId, "err", err, "retry_in", delay)
		select {
		case <-time.After(delay):
		case <-m.stopping:
			return false // unacknowledged: it waits, in order, for the next member
		}
		if s.isLost() {
			return false
		}
	}
	if err := d.Ack(false); err != nil {
		m.log.Warn("ack of an event sent on from the group's intake failed; it may reach its partition twice", "event_id", d.MessageId, "err", err)
		return false
	}
	return true
}

// untilDone runs step until it succeeds or fails for good (it reports
// permanent), trying again with back-off; false if the module stops or
// the session is lost first. It says whether the step failed for good.
func (m *Module) untilDone(s *session, what string, step func() (permanent bool, err error)) (failed, ok bool) {
	for attempt := 1; ; attempt++ {
		permanent, err := step()
		if err == nil {
			return false, true
		}
		if permanent {
			m.log.Error("the group's intake: could not "+what+"; the marker is set aside", "err", err)
			return true, true
		}
		delay := expBackoff(100*time.Millisecond, 10*time.Second, attempt)
		m.log.Warn("the group's intake: could not "+what+"; trying again", "err", err, "retry_in", delay)
		select {
		case <-time.After(delay):
		case <-m.stopping:
			return false, false
		}
		if s.isLost() {
			return false, false
		}
	}
}

// ackMarker acknowledges a marker of the intake.
func (m *Module) ackMarker(d amqp.Delivery) {
	if err := d.Ack(false); err != nil {
		m.log.Warn("ack of a marker of the group's intake failed; it comes again", "err", err)
	}
}
