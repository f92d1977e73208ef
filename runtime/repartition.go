package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/exists"
	"github.com/meshkit/mesh/internal/wire"
)

// A group's partition count changes live (meshctl groups repartition; ADR
// 48, "A live partition count"). Each count is an epoch: 0 the entry's,
// one more at each change; its partitions are wire.PartitionQueueOf(epoch,
// i). The broker's queues are the state: the group's epoch is the highest
// whose partition 0 exists, its count how many of its partitions exist,
// and a change is under way while the previous epoch's partitions or the
// new epoch's catch-up queues exist. A slot's events are handled in this
// order across a change, each queue only once those before it are gone:
//
//  1. the old partition that held the slot, until the change's retire
//     marker, which its owner reaches once the slot's earlier events are
//     settled, and then deletes the partition;
//  2. the new epoch's catch-up queue of the slot (wire.CatchUpQueue): what
//     reached the group while the change was under way (between the old
//     partitions' unbinding and the new ones' binding, an event of the slot
//     matches no binding and goes to the intake), sent there by the
//     intake's member, then a retire marker; deleted by its owner likewise;
//  3. the new partition.
//
// The intake's member makes the change when it reaches the operator's
// start marker (startChange): it declares the new epoch's queues, unbinds
// the old partitions, binds the new ones, puts a retire marker at the end
// of each old partition and an end marker at the end of the intake; until
// it reaches that end marker it sends what the intake holds to the catch-up
// queues, and then retires them. Every step may be done again: a member that
// dies in the middle leaves the start marker unacknowledged for the next.
// Members learn of a new epoch when a partition they consume is deleted
// (the broker cancels their consumer), when a retire marker reaches them,
// or from a peer's heartbeat; they find the queues themselves (follow).

// groupEpoch is an ordered group's partition count as the node knows it.
type groupEpoch struct {
	// Number is the epoch: 0 the first count, one more at each change.
	Number int `json:"epoch"`
	// Count is its partition count; Prev the previous epoch's.
	Count int `json:"partitions"`
	Prev  int `json:"previous,omitempty"`
	// Settled says the previous epoch's partitions and this one's catch-up
	// queues are gone: the change is over.
	Settled bool `json:"settled"`
}

// epochRecord is the name of a node's record of module's group's epoch.
func epochRecord(group, module string) string {
	return wire.GroupExchange(group, module) + ".epoch"
}

// loadEpoch is the epoch of module's group as the node's record says, or
// the first (the entry's count, settled) when there is none.
func loadEpoch(record bindingRecord, group, module string, count int) (groupEpoch, error) {
	first := groupEpoch{Count: count, Settled: true}
	had, err := record.load(epochRecord(group, module))
	if err != nil || len(had) != 1 {
		return first, err
	}
	var e groupEpoch
	if err := json.Unmarshal([]byte(had[0]), &e); err != nil || e.Count < 1 || e.Count > wire.Slots {
		return first, fmt.Errorf("read the record of group %s's partition count %q: %v", group, had[0], err)
	}
	return e, nil
}

// loadEpoch is m's group's recorded epoch (loadEpoch).
func (m *Module) loadEpoch() (groupEpoch, error) {
	return loadEpoch(m.node.bindings, m.cfg.Group, m.def.Name, m.cfg.Partitions)
}

// setEpoch makes e m's epoch and records it.
func (m *Module) setEpoch(e groupEpoch) error {
	m.mu.Lock()
	m.epoch = e
	m.mu.Unlock()
	b, _ := json.Marshal(e)
	return m.node.bindings.store(epochRecord(m.cfg.Group, m.def.Name), []string{string(b)})
}

// currentEpoch is m's epoch as it knows it.
func (m *Module) currentEpoch() groupEpoch {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.epoch
}

// laterEpoch says whether the group has an epoch after epoch.
func (m *Module) laterEpoch(s *session, epoch int) (bool, error) {
	return exists.Exchange(s.subConn, wire.EpochExchange(m.cfg.Group, m.def.Name, epoch+1))
}

// GroupEpoch is an ordered group's partition count as the broker's queues
// say (meshctl groups repartition reads it as members do).
type GroupEpoch struct {
	// Number is the latest epoch whose partitions exist, Partitions its
	// count, Previous the previous epoch's (wire.Slots when it is not
	// known: every index is looked at).
	Number, Partitions, Previous int
	// Pending are the queues of the change to Number that are still there
	// (the previous epoch's partitions, this one's catch-up queues): the
	// change is under way until none is.
	Pending []string
}

// ReadGroupEpoch reads the epoch of group's module from the broker,
// from epoch from on (count is from's partition count, when known; 0
// to count it).
func ReadGroupEpoch(conn *amqp.Connection, group, module string, from, count int) (GroupEpoch, error) {
	latest := from
	for {
		ok, err := exists.Exchange(conn, wire.EpochExchange(group, module, latest+1))
		if err != nil {
			return GroupEpoch{}, err
		}
		if !ok {
			break
		}
		latest++
	}
	e := GroupEpoch{Number: latest, Partitions: count, Previous: wire.Slots}
	if latest != from || count == 0 {
		// The latest epoch's partitions are all there: counted up to the
		// first missing.
		e.Partitions = 0
		for e.Partitions < wire.Slots {
			ok, err := exists.Queue(conn, wire.PartitionQueueOf(group, module, latest, e.Partitions))
			if err != nil {
				return e, err
			}
			if !ok {
				break
			}
			e.Partitions++
		}
	}
	if latest == from+1 && count > 0 {
		e.Previous = count
	}
	if latest == 0 {
		e.Previous = 0
		return e, nil
	}
	for _, q := range changeQueues(group, module, e.Number, e.Partitions, e.Previous) {
		ok, err := exists.Queue(conn, q)
		if err != nil {
			return e, err
		}
		if ok {
			e.Pending = append(e.Pending, q)
		}
	}
	return e, nil
}

// StartRepartition asks the members of group's module, an ordered group,
// to change its partition count to partitions (meshctl groups
// repartition): it sends the start marker to the group's intake, whose
// member makes the change (see the top of this file), and returns the
// epoch it asked for. It refuses while a change is under way, and when the
// group has no intake (not an ordered group, or not declared yet).
func StartRepartition(ctx context.Context, conn *amqp.Connection, userID, group, module string, partitions int) (GroupEpoch, error) {
	if partitions < 1 || partitions > wire.Slots {
		return GroupEpoch{}, fmt.Errorf("%w: a group keeps order over 1 to %d partitions, not %d", wire.ErrInvalid, wire.Slots, partitions)
	}
	intake := wire.GroupIntake(group, module)
	if ok, err := exists.Queue(conn, intake); err != nil {
		return GroupEpoch{}, err
	} else if !ok {
		return GroupEpoch{}, fmt.Errorf("%w: no queue %s: %s is no ordered group of module %s on this broker (or no member has started)", ErrNoSuchGroup, intake, group, module)
	}
	e, err := ReadGroupEpoch(conn, group, module, 0, 0)
	if err != nil {
		return e, err
	}
	if len(e.Pending) > 0 {
		return e, fmt.Errorf("%w: the change to %d partitions (epoch %d) is under way: %d of its queues are still there (%s first)", ErrChangeUnderWay, e.Partitions, e.Number, len(e.Pending), e.Pending[0])
	}
	if e.Partitions == partitions {
		return e, fmt.Errorf("%w: group %s keeps order over %d partitions already", ErrNothingToChange, group, partitions)
	}
	change := wire.PartitionChange{Epoch: e.Number + 1, Partitions: partitions, From: e.Partitions}
	body, _ := json.Marshal(change)
	ch, err := conn.Channel()
	if err != nil {
		return e, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return e, fmt.Errorf("confirm mode: %w", err)
	}
	returned := ch.NotifyReturn(make(chan amqp.Return, 1))
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", intake, true, false, amqp.Publishing{
		Headers: amqp.Table{wire.HeaderPartitions: wire.PartitionsStart}, ContentType: "application/json",
		DeliveryMode: amqp.Persistent, UserId: userID, Timestamp: time.Now(), Body: body})
	if err != nil {
		return e, fmt.Errorf("send the start marker: %w", err)
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil || !ok {
		return e, fmt.Errorf("send the start marker: not confirmed (%v)", err)
	}
	select {
	case r := <-returned:
		return e, fmt.Errorf("send the start marker: returned by the broker: %s", r.ReplyText)
	default:
	}
	return GroupEpoch{Number: change.Epoch, Partitions: partitions, Previous: e.Partitions}, nil
}

// Errors of StartRepartition.
var (
	ErrNoSuchGroup     = errors.New("no such ordered group")
	ErrChangeUnderWay  = errors.New("a change of the partition count is under way")
	ErrNothingToChange = errors.New("nothing to change")
)

// changeQueues are the queues a change to epoch (count partitions, from
// prev) retires: the previous epoch's partitions, then its own catch-up
// queues.
func changeQueues(group, module string, epoch, count, prev int) []string {
	var qs []string
	for j := range prev {
		qs = append(qs, wire.PartitionQueueOf(group, module, epoch-1, j))
	}
	for i := range count {
		qs = append(qs, wire.CatchUpQueue(group, module, epoch, i))
	}
	return qs
}

// feeding are the partitions of the previous count (prev) that held slots
// partition i of the new count (count) now holds.
func feeding(i, count, prev int) []int {
	var from []int
	for s := i; s < wire.Slots; s += count {
		from = append(from, s%prev)
	}
	slices.Sort(from)
	return slices.Compact(from)
}

// slotMatch is the binding arguments of partition i of n: any of the slot
// headers of its slots.
func slotMatch(i, n int) amqp.Table {
	match := amqp.Table{"x-match": "any"}
	for slot := i; slot < wire.Slots; slot += n {
		match[wire.SlotHeaderOf(slot)] = wire.SlotMark
	}
	return match
}

// discoverEpoch brings e up to the broker's: a later epoch whose
// partitions exist (ReadGroupEpoch), and whether its change is over.
func (m *Module) discoverEpoch(s *session, e groupEpoch) (groupEpoch, error) {
	got, err := ReadGroupEpoch(s.subConn, m.cfg.Group, m.def.Name, e.Number, e.Count)
	if err != nil {
		return e, err
	}
	if got.Number == e.Number && e.Settled {
		return e, nil
	}
	if got.Number == e.Number && e.Prev > 0 {
		got.Previous = e.Prev // known exactly when the node saw the change begin
	}
	return groupEpoch{Number: got.Number, Count: got.Partitions, Prev: got.Previous, Settled: len(got.Pending) == 0}, nil
}

// consumeEpoch consumes what e's partitions need that m does not consume
// yet: while its change is under way, the previous epoch's partitions
// and e's catch-up queues that still exist (each gated on what comes
// before it), and e's partitions (gated on their catch-up queue).
func (m *Module) consumeEpoch(s *session, e groupEpoch) error {
	g, name := m.cfg.Group, m.def.Name
	if !e.Settled {
		for j := range e.Prev {
			if err := m.consumeIfThere(s, e.Number-1, j, wire.PartitionQueueOf(g, name, e.Number-1, j), nil); err != nil {
				return err
			}
		}
		for i := range e.Count {
			// After the old partitions that held its slots; after every
			// one when the old count is not known.
			from := feeding(i, e.Count, e.Prev)
			if e.Prev == wire.Slots {
				from = from[:0]
				for j := range wire.Slots {
					from = append(from, j)
				}
			}
			var after []string
			for _, j := range from {
				after = append(after, wire.PartitionQueueOf(g, name, e.Number-1, j))
			}
			if err := m.consumeIfThere(s, e.Number, i, wire.CatchUpQueue(g, name, e.Number, i), after); err != nil {
				return err
			}
		}
	}
	for i := range e.Count {
		q := wire.PartitionQueueOf(g, name, e.Number, i)
		var after []string
		if !e.Settled {
			after = []string{wire.CatchUpQueue(g, name, e.Number, i)}
		}
		if m.consuming(s, q) {
			continue
		}
		if err := m.consumePartition(s, e.Number, i, q, after); err != nil {
			return err
		}
	}
	m.checkSettled()
	return nil
}

// consuming says whether m consumes queue (a partition or catch-up queue)
// on session s: a consumer of a lost session, or whose channel closed
// (the module resumes), is none.
func (m *Module) consuming(s *session, queue string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.partitions[queue]
	return ok && p.s == s && !p.ch.IsClosed()
}

// consumeIfThere consumes queue, a queue of a change, if it still exists;
// if not, it is gone (what waits on it goes on).
func (m *Module) consumeIfThere(s *session, epoch, i int, queue string, after []string) error {
	if m.consuming(s, queue) {
		return nil
	}
	ok, err := exists.Queue(s.subConn, queue)
	if err != nil {
		return err
	}
	if !ok {
		m.markGone(queue)
		return nil
	}
	err = m.consumePartition(s, epoch, i, queue, after)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		m.markGone(queue) // retired between the look and the consume
		return nil
	}
	return err
}

// goneCh is closed once queue, a queue of a change, is known gone.
func (m *Module) goneCh(queue string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gone == nil {
		m.gone = map[string]chan struct{}{}
	}
	c := m.gone[queue]
	if c == nil {
		c = make(chan struct{})
		m.gone[queue] = c
	}
	return c
}

// markGone says queue, a queue of a change, is gone: what waits on it goes
// on.
func (m *Module) markGone(queue string) {
	c := m.goneCh(queue)
	m.mu.Lock()
	select {
	case <-c:
	default:
		close(c)
	}
	m.mu.Unlock()
	m.checkSettled()
}

// isGone says whether queue is known gone.
func (m *Module) isGone(queue string) bool {
	select {
	case <-m.goneCh(queue):
		return true
	default:
		return false
	}
}

// checkSettled records the change to m's epoch as over once every queue it
// retires is known gone.
func (m *Module) checkSettled() {
	m.settleMu.Lock()
	defer m.settleMu.Unlock()
	e := m.currentEpoch()
	if e.Settled || e.Number == 0 {
		return
	}
	for _, q := range changeQueues(m.cfg.Group, m.def.Name, e.Number, e.Count, e.Prev) {
		if !m.isGone(q) {
			return
		}
	}
	e.Settled = true
	if err := m.setEpoch(e); err != nil {
		m.log.Warn("record the group's partition count", "err", err)
	}
	m.log.Info("the group's partition count changed: the old partitions and the catch-up queues are handled and gone", "group", m.cfg.Group, "epoch", e.Number, "partitions", e.Count, "previous", e.Prev)
}

// waitGone waits until every queue in after is gone; false if abort
// closes first.
func (m *Module) waitGone(after []string, abort <-chan struct{}) bool {
	for _, q := range after {
		select {
		case <-m.goneCh(q):
		case <-abort:
			return false
		case <-m.stopping:
			return false
		}
	}
	return true
}

// follow brings m up to a later epoch of its group that the broker holds
// (a peer made the change, or the retire of a partition says one was
// made): it records it and consumes its queues. One at a time.
func (m *Module) follow(s *session) {
	m.followMu.Lock()
	defer m.followMu.Unlock()
	if s == nil || m.node.session() != s || s.isLost() {
		return
	}
	e := m.currentEpoch()
	next, err := m.discoverEpoch(s, e)
	if err != nil {
		m.log.Warn("read the group's partition count; trying again in a second", "group", m.cfg.Group, "err", err)
		time.AfterFunc(time.Second, func() { m.follow(s) })
		return
	}
	if next.Number == e.Number {
		return
	}
	if err := m.setEpoch(next); err != nil {
		m.log.Warn("record the group's partition count", "err", err)
	}
	m.log.Info("the group's partition count was changed; following it", "group", m.cfg.Group, "epoch", next.Number, "partitions", next.Count, "previous", next.Prev, "entry_partitions", m.cfg.Partitions)
	if err := m.consumeEpoch(s, next); err != nil {
		m.log.Warn("consume the group's new partitions; trying again in a second", "err", err)
		time.AfterFunc(time.Second, func() { m.followAgain(s) })
	}
}

// followAgain consumes what m's epoch needs on s, as follow does for a
// later one: after a follow that failed part-way.
func (m *Module) followAgain(s *session) {
	m.followMu.Lock()
	defer m.followMu.Unlock()
	if s == nil || m.node.session() != s || s.isLost() {
		return // the next session consumes all
	}
	if err := m.consumeEpoch(s, m.currentEpoch()); err != nil {
		m.log.Warn("consume the group's new partitions; trying again in a second", "err", err)
		time.AfterFunc(time.Second, func() { m.followAgain(s) })
	}
}

// partitionCancelled handles the broker's cancel of p's consumer: the
// queue was deleted. A retired queue (of an old epoch, or a catch-up
// queue) is gone; the current epoch's partition is retired if a later
// epoch exists, else it was deleted by hand and the module resumes (and
// declares it again).
func (m *Module) partitionCancelled(p *partition) {
	m.mu.Lock()
	current := m.partitions[p.queue] == p
	e := m.epoch
	m.mu.Unlock()
	if !current {
		return
	}
	if !p.catchUp && p.epoch >= e.Number {
		later, err := m.laterEpoch(p.s, p.epoch)
		if err != nil || !later {
			m.resumeLater(p.s, p.ch, "the broker cancelled its consumer of a partition (was the queue deleted?)", err)
			return
		}
		go m.follow(p.s)
	}
	m.dropPartition(p)
	m.markGone(p.queue)
}

// dropPartition forgets p and closes its channel.
func (m *Module) dropPartition(p *partition) {
	m.mu.Lock()
	if m.partitions[p.queue] == p {
		delete(m.partitions, p.queue)
	}
	m.mu.Unlock()
	m.untrack(p.ch)
}

// retire is p's retire marker d: once p's earlier events are settled, p's
// owner deletes the queue (and the marker with it). A marker that no
// change stands behind (no later epoch exists) is set aside unheeded.
func (p *partition) retire(d amqp.Delivery) {
	m := p.m
	if !p.catchUp && p.epoch >= m.currentEpoch().Number {
		later, err := m.laterEpoch(p.s, p.epoch)
		if err != nil {
			m.log.Warn("a partition's retire marker could not be checked; the partition is let go and it comes again", "queue", p.queue, "err", err)
			go p.yield()
			return
		}
		if !later {
			m.log.Warn("a retire marker reached a partition that no change of the partition count retires; acknowledged and ignored", "queue", p.queue, "user_id", d.UserId)
			p.acks.ack(d.DeliveryTag)
			p.flushSoon()
			return
		}
		go m.follow(p.s)
	}
	p.mu.Lock()
	p.retiring = true
	p.mu.Unlock()
	p.retireIfDrained()
}

// retireIfDrained deletes a retiring partition once no lane holds an event.
func (p *partition) retireIfDrained() {
	p.mu.Lock()
	ready := p.retiring && len(p.lanes) == 0 && !p.retired
	if ready {
		p.retired = true
	}
	p.mu.Unlock()
	if !ready {
		return
	}
	m := p.m
	go func() {
		p.flush()
		if _, err := p.ch.QueueDelete(p.queue, false, false, false); err != nil {
			m.log.Warn("delete a retired partition; its next owner reaches its retire marker again", "queue", p.queue, "err", err)
			m.dropPartition(p)
			return
		}
		m.log.Info("a partition retired by a change of the partition count is handled and deleted", "queue", p.queue)
		m.dropPartition(p)
		m.markGone(p.queue)
	}()
}

// isMarker says whether d is a marker of a partition count change: one
// the mesh sent straight to the queue, under a broker-checked user.
func isMarker(d amqp.Delivery) (string, bool) {
	v, ok := d.Headers[wire.HeaderPartitions].(string)
	if !ok || d.Exchange != "" || d.UserId == "" {
		return "", false
	}
	return v, true
}

// startChange makes the change d (a start marker) asks for, as the
// intake's member (see the top of this file); every step may be done
// again. It returns the change, or a permanent error (the marker is
// then acknowledged and ignored), or a transient one (it is left for the
// intake's next consumer).
func (m *Module) startChange(ctx context.Context, s *session, d amqp.Delivery) (wire.PartitionChange, bool, error) {
	var c wire.PartitionChange
	if err := json.Unmarshal(d.Body, &c); err != nil || c.Partitions < 1 || c.Partitions > wire.Slots || c.From < 1 || c.From > wire.Slots || c.Epoch < 1 {
		return c, true, fmt.Errorf("a start marker's body %q is not a change from and to 1 to %d partitions of a later epoch", d.Body, wire.Slots)
	}
	g, name := m.cfg.Group, m.def.Name
	e := m.currentEpoch()
	if latest, err := m.discoverEpoch(s, e); err != nil {
		return c, false, err
	} else if latest.Number != e.Number {
		go m.follow(s)
		e = latest
	}
	switch {
	case c.Epoch == e.Number+1 && e.Settled && c.From == e.Count:
		ch, err := s.subConn.Channel()
		if err != nil {
			return c, false, err
		}
		args := partitionQueueArgs(m.cfg)
		for i := range c.Partitions {
			for _, q := range []string{wire.CatchUpQueue(g, name, c.Epoch, i), wire.PartitionQueueOf(g, name, c.Epoch, i)} {
				if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
					_ = ch.Close()
					return c, false, fmt.Errorf("declare queue %s: %w", q, err)
				}
			}
		}
		// Its queues are there: the epoch is, for whoever looks.
		if err := ch.ExchangeDeclare(wire.EpochExchange(g, name, c.Epoch), amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			_ = ch.Close()
			return c, false, fmt.Errorf("declare the epoch's exchange: %w", err)
		}
		_ = ch.Close()
		e = groupEpoch{Number: c.Epoch, Count: c.Partitions, Prev: e.Count}
		if err := m.setEpoch(e); err != nil {
			return c, false, err
		}
	case c.Epoch == e.Number && !e.Settled && c.Partitions == e.Count:
		// Started before by a member that did not finish: again.
		e.Prev = c.From
		if err := m.setEpoch(e); err != nil {
			return c, false, err
		}
	default:
		return c, true, fmt.Errorf("a start marker for epoch %d (%d partitions) while the group is at epoch %d (%d partitions, change over: %v): stale, or sent while a change is under way", c.Epoch, c.Partitions, e.Number, e.Count, e.Settled)
	}
	m.log.Info("changing the group's partition count", "group", g, "epoch", e.Number, "partitions", e.Count, "previous", e.Prev)
	if err := m.consumeEpoch(s, e); err != nil {
		return c, false, err
	}
	exchange := wire.GroupExchange(g, name)
	ch, err := s.subConn.Channel()
	if err != nil {
		return c, false, err
	}
	defer ch.Close()
	for j := range e.Prev {
		if err := ch.QueueUnbind(wire.PartitionQueueOf(g, name, e.Number-1, j), "", exchange, slotMatch(j, e.Prev)); err != nil {
			return c, false, fmt.Errorf("unbind an old partition: %w", err)
		}
	}
	for i := range e.Count {
		if err := ch.QueueBind(wire.PartitionQueueOf(g, name, e.Number, i), "", exchange, false, slotMatch(i, e.Count)); err != nil {
			return c, false, fmt.Errorf("bind a new partition: %w", err)
		}
	}
	for j := range e.Prev {
		if err := m.sendMarker(ctx, s, wire.PartitionQueueOf(g, name, e.Number-1, j), wire.PartitionsRetire, nil); err != nil {
			return c, false, err
		}
	}
	if err := m.sendMarker(ctx, s, wire.GroupIntake(g, name), wire.PartitionsEnd, nil); err != nil {
		return c, false, err
	}
	return c, false, nil
}

// endChange retires change's catch-up queues: the intake's member reached
// the end marker, and everything before it is in them.
func (m *Module) endChange(ctx context.Context, s *session, c wire.PartitionChange) error {
	for i := range c.Partitions {
		if err := m.sendMarker(ctx, s, wire.CatchUpQueue(m.cfg.Group, m.def.Name, c.Epoch, i), wire.PartitionsRetire, nil); err != nil {
			return err
		}
	}
	return nil
}

// sendMarker sends a marker of a change straight to queue, confirmed; a
// queue already gone is no error (its retire was done).
func (m *Module) sendMarker(ctx context.Context, s *session, queue, marker string, body []byte) error {
	if body == nil {
		body = []byte("{}")
	}
	msg := amqp.Publishing{
		Headers:      amqp.Table{wire.HeaderPartitions: marker},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		UserId:       m.node.userID,
		Timestamp:    time.Now(),
		Body:         body,
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.node.publishConfirmed(ctx, s, "", queue, msg); err != nil && !errors.Is(err, errUnroutable) {
		return fmt.Errorf("send the %s marker to %s: %w", marker, queue, err)
	}
	return nil
}
