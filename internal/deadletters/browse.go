package deadletters

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// held is a delivery the browser holds unacknowledged, with what it says.
type held struct {
	d amqp.Delivery
	m Message
}

// browser reads a keeper queue without taking anything from it: it consumes
// with manual acknowledgements, holds every delivery unacknowledged, and on
// close gives back whatever it did not acknowledge. It reads at most the
// number of messages the queue held when it opened, so it ends even while
// messages keep arriving. One goroutine owns it and its channel.
//
// It reads in windows: a consumer's prefetch is the window, and once the
// window is read the browser cancels that consumer (its deliveries stay
// held by the channel) and starts another, which the broker sends the
// next window. So the broker never sends more than a window ahead of the
// reader, and the client never buffers more than a window of bodies,
// however deep the queue. A window is sized by bytes: the first is
// firstWindow messages, each later one as many as browseBytes holds at
// the largest body read so far (at least 1, at most browseWindow). So
// what waits in the client is at most about browseBytes (or one body,
// when a body is larger), plus the window's growth when a body is larger
// than every one before it.
type browser struct {
	ch         *amqp.Channel
	queue      string
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
	idle       time.Duration
	conn       *amqp.Connection
	tag        string // the current consumer's tag
	count      int    // messages ready when the browse began
	window     int    // the current consumer's prefetch
	granted    int    // deliveries the consumers so far may get in all
	read       int    // deliveries read
	acked      int    // deliveries acknowledged (replayed or purged)
	largest    int    // the largest body read so far
	// acks are the delivery tags acknowledged (ack) but not yet sent:
	// an acknowledgement gives a consumer its credit back, and the broker
	// would send it more than its window; one sent after the reader
	// cancelled it can reach the client after the cancel's reply, for
	// no consumer, unread (seen on a quorum queue under load: a purge
	// read 119 of 120). So a window's acks are sent once its consumer is
	// cancelled (nextWindow), or at close.
	acks []uint64
}

// browseWindow is the most messages a browse asks the broker for at a
// time; firstWindow how many it asks for before it knows how large they
// are; browseBytes the bodies it asks for at a time, at the largest size
// read so far.
const (
	browseWindow = 512
	firstWindow  = 4
	browseBytes  = 8 << 20
)

// countedWait is how long a browse waits for the next delivery while it
// has read fewer messages than the queue held when it began: those
// messages are there, so a gap means a slow broker, not an empty queue. A
// quorum queue registers a consumer through its log (a write to disk),
// and a busy broker (or a busy client: a race-built test binary beside
// others on two cores) may take seconds over that, or between two
// deliveries, far longer than the idle timeout that ends a browse past
// the messages it counted. A queue emptied meanwhile by another consumer
// costs a browse this wait, once.
const countedWait = 10 * time.Second

// nextWindowSize is the window after one whose largest body was largest
// bytes: as many as browseBytes holds, between 1 and browseWindow.
func nextWindowSize(largest int) int {
	return min(max(browseBytes/max(largest, 1), 1), browseWindow)
}

// openBrowser opens a channel on conn and starts reading queue. It returns
// the browser and how many messages the queue held; when that is 0 it
// consumes nothing.
func openBrowser(conn *amqp.Connection, queue string, o options) (*browser, int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, 0, fmt.Errorf("open channel: %w", err)
	}
	b := &browser{ch: ch, conn: conn, queue: queue, closed: ch.NotifyClose(make(chan *amqp.Error, 1)), idle: o.idle}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return nil, 0, fmt.Errorf("%w: %s (no node has declared the mesh's topology in this virtual host)", ErrNoQueue, queue)
		}
		return nil, 0, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	b.count = q.Messages
	if q.Messages == 0 {
		return b, 0, nil
	}
	b.window = min(q.Messages, firstWindow)
	if err := b.consume(); err != nil {
		_ = ch.Close()
		return nil, 0, err
	}
	return b, q.Messages, nil
}

// consume starts a consumer for the next window, of b.window messages.
func (b *browser) consume() error {
	// The prefetch of the consumers started from now on (global false):
	// the consumers before keep theirs.
	if err := b.ch.Qos(b.window, 0, false); err != nil {
		return fmt.Errorf("set prefetch on %s: %w", b.queue, err)
	}
	b.tag = consumerTag()
	deliveries, err := b.ch.Consume(b.queue, b.tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", b.queue, err)
	}
	b.deliveries = deliveries
	b.granted += b.window
	return nil
}

// nextWindow ends the consumer whose window has been read and starts
// another. Its deliveries stay held by the channel: the broker does not
// send them again, and close gives them back.
func (b *browser) nextWindow() error {
	if err := b.ch.Cancel(b.tag, false); err != nil {
		return fmt.Errorf("read %s past %d messages: %w", b.queue, b.read, err)
	}
	if err := b.flushAcks(); err != nil {
		return err
	}
	b.window = nextWindowSize(b.largest)
	return b.consume()
}

// moreCredit lets the broker send more once the window is read: a new
// window while the browse reads the messages it counted; past them
// (cameBack), the window's acknowledgements, which give the same consumer
// as many more, or a new window when there are none.
func (b *browser) moreCredit() error {
	if n := len(b.acks); b.read >= b.count && n > 0 {
		if err := b.flushAcks(); err != nil {
			return err
		}
		b.granted += n
		return nil
	}
	return b.nextWindow()
}

// next returns the next delivery, or ok=false when none arrives within the
// idle timeout (countedWait, while fewer than the counted messages are
// read).
func (b *browser) next(ctx context.Context) (d amqp.Delivery, ok bool, err error) {
	if b.deliveries == nil {
		return d, false, nil
	}
	if b.read == b.granted {
		if err := b.moreCredit(); err != nil {
			return d, false, err
		}
	}
	wait := b.idle
	if b.read < b.count {
		wait = max(wait, countedWait)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case d, open := <-b.deliveries:
		if !open {
			return d, false, fmt.Errorf("read %s: the broker stopped the browse: %w", b.queue, b.closeReason())
		}
		b.read++
		b.largest = max(b.largest, len(d.Body))
		return d, true, nil
	case <-t.C:
		return d, false, nil
	case <-ctx.Done():
		return d, false, ctx.Err()
	}
}

// closeReason is why the channel closed, as far as the broker said.
func (b *browser) closeReason() error {
	select {
	case e, ok := <-b.closed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp.ErrClosed
}

// walk reads up to n deliveries, oldest first, stopping early when the
// queue stays idle, and calls visit with each one f matches, until visit
// says stop or fails. A delivery f does not match is not kept: the
// channel holds it unacknowledged, by its tag alone, until close gives it
// back. So memory holds one message at a time, plus what visit keeps.
// The progress option hears (read, n).
func (b *browser) walk(ctx context.Context, n int, dead bool, f Filter, o options, visit func(held) (stop bool, err error)) error {
	now := o.now()
	o.report(0, n)
	for read := 0; read < n; {
		d, ok, err := b.next(ctx)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		read++
		if m := messageOf(d, dead); f.match(m, dead, now) {
			stop, err := visit(held{d: d, m: m})
			if err != nil {
				return err
			}
			if stop {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		o.report(read, n)
	}
	return nil
}

// cameBack reads on past the browsed messages for the copies of replayed
// unrouted events (ids, by count) that no queue took and the alternate
// exchange brought back. Copies stay in the queue. It stops when all want
// copies are seen, when the queue stays idle, or after reading 2*want+1024
// messages, so a stream of new unrouted events cannot keep it reading.
func (b *browser) cameBack(ctx context.Context, ids map[string]int, want int) (int, error) {
	seen := 0
	for read := 0; seen < want && read < 2*want+1024; read++ {
		d, ok, err := b.next(ctx)
		if err != nil {
			return seen, err
		}
		if !ok {
			break
		}
		if id := messageOf(d, false).ID; ids[id] > 0 {
			ids[id]--
			seen++
		}
	}
	return seen, nil
}

// ack acknowledges a held delivery: it leaves the queue once the
// acknowledgement is sent, when its window ends or at close (acks).
func (b *browser) ack(h held) error {
	b.acks = append(b.acks, h.d.DeliveryTag)
	b.acked++
	return nil
}

// flushAcks sends the acknowledgements ack deferred.
func (b *browser) flushAcks() error {
	for i, tag := range b.acks {
		if err := b.ch.Ack(tag, false); err != nil {
			b.acks = b.acks[i:]
			return fmt.Errorf("remove messages from %s: %w", b.queue, err)
		}
	}
	b.acks = b.acks[:0]
	return nil
}

// giveBackWait bounds how long close waits for a quorum queue to take back
// more of what the browse held, and giveBackMax how long in all.
const (
	giveBackWait = 2 * time.Second
	giveBackMax  = 30 * time.Second
)

// close gives back to the queue every delivery not acknowledged, by
// cancelling the consumer, giving them back with one basic.nack (multiple,
// requeue) and closing the channel.
//
// The give-back is a nack, not a reject, on purpose: from RabbitMQ 4.3 a
// nack does not count toward a quorum queue's delivery limit (only a
// reject does), so browsing spends none of a dead letter's deliveries,
// and the keeper queues have no dead-letter exchange to catch one that
// ran out. On 3.10 every return counts, with no limit by default; on 4.0
// to 4.2 every delivery counts against the default limit of 20 (see
// docs/adr/0017-lifecycle-and-browsing.md for the policy that lifts it).
//
// The cancel comes first because a channel keeps at most 32 commands in
// flight to a quorum queue and holds further acknowledgements back until
// earlier ones are applied (rabbit_fifo_client's soft limit). Observed on
// RabbitMQ 3.10.8: a channel closed right after 40 acks lost the last 7 and
// those messages were given back instead of removed; after 1000 acks it lost
// 3. basic.cancel is applied by the queue synchronously, and with it first
// no ack was lost in any run.
//
// A quorum queue also takes given-back messages back a little after the
// channel closed (about a millisecond for a few small ones; seconds for
// a thousand of 1 MiB on a busy broker), so a browse right after this
// one would count too few, and a replay would miss what it did not
// count: close waits until the queue holds at least what it held at the
// start minus what was acknowledged, as long as the count keeps rising
// once it has begun to (giveBackWait without a rise ends the wait:
// another consumer may have taken some), for giveBackMax at most.
func (b *browser) close() error {
	var cancelErr error
	if b.deliveries != nil {
		// The acknowledgements go before the cancel, which the queue
		// applies synchronously (below).
		cancelErr = b.flushAcks()
		if cancelErr == nil {
			cancelErr = b.ch.Cancel(b.tag, false)
		}
		if cancelErr == nil {
			// Tag 0 with multiple: every delivery outstanding on the
			// channel, read or not.
			cancelErr = b.ch.Nack(0, true, true)
		}
	}
	if err := b.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("give back the messages of %s: %w", b.queue, err)
	}
	if cancelErr != nil && !errors.Is(cancelErr, amqp.ErrClosed) {
		return fmt.Errorf("stop reading %s (some removals may not have taken effect): %w", b.queue, cancelErr)
	}
	want := b.count - b.acked
	if b.deliveries == nil || want <= 0 {
		return nil
	}
	ch, err := b.conn.Channel()
	if err != nil {
		return nil // the messages are back; only the wait is skipped
	}
	defer ch.Close()
	start := time.Now()
	first, last, rose := -1, -1, start
	poll := 2 * time.Millisecond
	for {
		q, err := ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
		now := time.Now()
		if err != nil || q.Messages >= want {
			return nil
		}
		if first < 0 {
			first = q.Messages
		}
		if q.Messages > last {
			last, rose = q.Messages, now
		}
		// Until the count first rises the give-back has not landed (a
		// quorum queue applies it in one command, which a broker busy
		// writing may take seconds over): only giveBackMax ends that wait.
		if (last > first && now.Sub(rose) > giveBackWait) || now.Sub(start) > giveBackMax {
			return nil
		}
		time.Sleep(poll)
		poll = min(2*poll, 50*time.Millisecond)
	}
}

// publisher publishes replayed copies, one at a time, mandatory and with
// confirms. One goroutine owns it and its channel.
type publisher struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

func newPublisher(conn *amqp.Connection) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return &publisher{
		ch: ch,
		// One publish is in flight at a time, so one return at most.
		returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// publish sends msg mandatory and waits for its confirm. It returns the
// broker's basic.return if the message was returned (the broker sends it
// before the ack, and the client hands it over before it resolves the
// confirm), an error wrapping ErrRefused on a nack, or another error if the
// publish could not be made or confirmed.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (*amqp.Return, error) {
	select {
	case <-p.returns: // a stale return of an earlier publish that timed out
	default:
	}
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("wait for the confirm: %w", err)
	}
	select {
	case r := <-p.returns:
		return &r, nil
	default:
	}
	if !acked {
		if p.ch.IsClosed() {
			return nil, fmt.Errorf("the broker closed the publishing channel: %w", p.closeReason())
		}
		return nil, ErrRefused
	}
	return nil, nil
}

func (p *publisher) closeReason() error {
	select {
	case e, ok := <-p.closed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp.ErrClosed
}

func (p *publisher) close() { _ = p.ch.Close() }

// consumerTag is a unique consumer tag that says who is reading.
func consumerTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "mesh-deadletters-" + hex.EncodeToString(b[:])
}
