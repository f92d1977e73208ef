package deadletters

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// held is a delivery the browser holds unacknowledged, with what it says.
type held struct {
	d amqp.Delivery
	m Message
}

// browser reads a keeper queue without taking anything from it: it consumes
// with manual acknowledgements and a prefetch as large as the queue, holds
// every delivery unacknowledged, and on close gives back whatever it did not
// acknowledge. It reads at most the number of messages the queue held when
// it opened, so it ends even while messages keep arriving. One goroutine
// owns it and its channel.
type browser struct {
	ch         *amqp.Channel
	queue      string
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
	idle       time.Duration
	conn       *amqp.Connection
	tag        string // consumer tag
	count      int    // messages ready when the browse began
	acked      int    // deliveries acknowledged (replayed or purged)
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
	// The prefetch must let every message counted be held at once. It is
	// a 16-bit field: beyond that, 0 (no limit) is the only choice.
	prefetch := q.Messages
	if prefetch > math.MaxUint16 {
		prefetch = 0
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, 0, fmt.Errorf("set prefetch on %s: %w", queue, err)
	}
	b.tag = consumerTag()
	if b.deliveries, err = ch.Consume(queue, b.tag, false, false, false, false, nil); err != nil {
		_ = ch.Close()
		return nil, 0, fmt.Errorf("consume %s: %w", queue, err)
	}
	return b, q.Messages, nil
}

// next returns the next delivery, or ok=false when none arrives within the
// idle timeout.
func (b *browser) next(ctx context.Context) (d amqp.Delivery, ok bool, err error) {
	if b.deliveries == nil {
		return d, false, nil
	}
	t := time.NewTimer(b.idle)
	defer t.Stop()
	select {
	case d, open := <-b.deliveries:
		if !open {
			return d, false, fmt.Errorf("read %s: the broker stopped the browse: %w", b.queue, b.closeReason())
		}
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

// collect reads up to n deliveries, stopping early when the queue stays
// idle, and returns them held.
func (b *browser) collect(ctx context.Context, n int, dead bool) ([]held, error) {
	out := make([]held, 0, n)
	for len(out) < n {
		d, ok, err := b.next(ctx)
		if err != nil {
			return out, err
		}
		if !ok {
			break
		}
		out = append(out, held{d: d, m: messageOf(d, dead)})
	}
	return out, nil
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

// ack acknowledges a held delivery: it leaves the queue.
func (b *browser) ack(h held) error {
	if err := h.d.Ack(false); err != nil {
		return err
	}
	b.acked++
	return nil
}

// giveBackWait bounds how long close waits for a quorum queue to take back
// what the browse held.
const giveBackWait = 2 * time.Second

// close gives back to the queue every delivery not acknowledged, by
// cancelling the consumer and closing the channel.
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
// channel closed (about a millisecond), so a browse right after this one
// would count too few: close waits, up to giveBackWait, until the queue
// holds at least what it held at the start minus what was acknowledged.
func (b *browser) close() error {
	var cancelErr error
	if b.deliveries != nil {
		cancelErr = b.ch.Cancel(b.tag, false)
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
	deadline := time.Now().Add(giveBackWait)
	for {
		q, err := ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
		if err != nil || q.Messages >= want || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// browseMatching opens a browser on queue, reads what it holds and returns
// the deliveries that match f, still held. The caller closes the browser
// (returned even with an error, unless nil).
func browseMatching(ctx context.Context, conn *amqp.Connection, queue string, dead bool, f Filter, o options) ([]held, *browser, error) {
	b, n, err := openBrowser(conn, queue, o)
	if err != nil {
		return nil, nil, err
	}
	all, err := b.collect(ctx, n, dead)
	if err != nil {
		return nil, b, err
	}
	now := o.now()
	var matches []held
	for _, h := range all {
		if f.match(h.m, dead, now) {
			matches = append(matches, h)
		}
	}
	return matches, b, nil
}

// queueExists asks the broker whether queue exists, on a channel of its
// own since a passive declare of a missing queue closes the channel.
func queueExists(conn *amqp.Connection, queue string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return false, nil
		}
		return false, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return true, nil
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
