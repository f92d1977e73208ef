package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// publisher owns one confirm-mode channel and pipelines publishes on it:
// any number of goroutines publish at once and each waits only for its own
// confirm (amqp091-go's deferred confirmation, resolved by the connection's
// reader without another goroutine in between).
//
// The channel is shared by the publishing goroutines on purpose:
// amqp091-go serialises Publish with the channel's own lock.
//
// Returns (an unroutable mandatory publish) are matched by message id. The
// broker sends basic.return before the basic.ack of the same message, and
// amqp091-go hands them over in that order from one goroutine, so by the
// time a publish's confirm is done its return is already in the buffered
// returns channel. A publisher drains that channel under p.mu before it
// looks for its id, and so does a periodic sweep that keeps the buffer from
// filling; an id is therefore always either in the channel or in the map.
type publisher struct {
	ch      *amqp.Channel
	returns chan amqp.Return

	mu       sync.Mutex
	returned map[string]struct{}

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	shut      atomic.Bool // closed by the node, not lost

	// A channel the broker refuses everything on: set by watchRefusals
	// before the publisher is used. nackSince is when the first negative
	// confirm since the last positive one came (unix ns; 0: none).
	refusingAfter time.Duration
	onRefusing    func(exchange, key string, msg amqp.Publishing)
	nackSince     atomic.Int64
	refusingOnce  sync.Once
}

// watchRefusals makes the publisher call onRefusing, once, with the latest
// refused message, when the broker has refused every publish on its
// channel for after: no positive confirm since a negative one that long
// ago. RabbitMQ 3.10 refuses, for as long as the channel lives, every
// publish to a quorum queue from a channel opened while that queue's
// leader was being elected (its old leader's node killed), while a new
// channel is served at once (docs/adr/0027-failover-on-a-cluster.md).
func (p *publisher) watchRefusals(after time.Duration, onRefusing func(exchange, key string, msg amqp.Publishing)) {
	p.refusingAfter, p.onRefusing = after, onRefusing
}

// confirmed records the broker's confirm of a publish of msg to exchange
// with key on the channel: acked or refused (a negative confirm).
func (p *publisher) confirmed(acked bool, exchange, key string, msg amqp.Publishing) {
	if p.onRefusing == nil {
		return // not watched: every emit of a first session, or after a recycle
	}
	if acked {
		p.nackSince.Store(0)
		return
	}
	now := time.Now().UnixNano()
	if p.nackSince.CompareAndSwap(0, now) {
		return
	}
	if since := p.nackSince.Load(); since != 0 && time.Duration(now-since) >= p.refusingAfter {
		p.refusingOnce.Do(func() { p.onRefusing(exchange, key, msg) })
	}
}

func newPublisher(conn *amqp.Connection) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("put publish channel in confirm mode: %w", err)
	}
	p := &publisher{
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return, 4096)),
		returned: make(map[string]struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go p.sweep()
	return p, nil
}

// sweep drains returns nobody has looked for yet, so the buffer never fills
// (amqp091-go drops a notification it cannot deliver within 5 s).
func (p *publisher) sweep() {
	defer close(p.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.drainReturns()
			if len(p.returned) > 4096 {
				// Ids of returned publishes whose publishers gave up
				// waiting; nobody will ask for them.
				clear(p.returned)
			}
			p.mu.Unlock()
		}
	}
}

// drainReturns moves what the returns channel holds into p.returned. The
// caller holds p.mu.
func (p *publisher) drainReturns() {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			p.returned[r.MessageId] = struct{}{}
		default:
			return
		}
	}
}

// wasReturned reports whether the broker returned the message with id, and
// forgets it.
func (p *publisher) wasReturned(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainReturns()
	_, ok := p.returned[id]
	delete(p.returned, id)
	return ok
}

// publish sends msg mandatory and waits for the broker's confirm. It
// returns nil only for a positive confirm of a routed message.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	return p.publishUnlessBlocked(ctx, nil, exchange, key, msg)
}

// errBlocked says the broker blocked publishing (an alarm) before it
// confirmed: the message may or may not have arrived.
var errBlocked = errors.New("the broker blocks publishing (a memory or disk alarm)")

// publishUnlessBlocked is publish that also gives up, with errBlocked,
// once blocked is closed (session.whenBlocked).
func (p *publisher) publishUnlessBlocked(ctx context.Context, blocked <-chan struct{}, exchange, key string, msg amqp.Publishing) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish to %s with key %q: %w", exchange, key, err)
	}
	dc, err := p.ch.PublishWithDeferredConfirm(exchange, key, true, false, msg)
	if err != nil {
		if !errors.Is(err, amqp.ErrFieldType) { // a bad header is ours; anything else is the connection
			err = errors.Join(p.closedErr(), err)
		}
		return fmt.Errorf("publish to %s with key %q: %w", exchange, key, err)
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return fmt.Errorf("wait for confirm: %w", ctx.Err())
	case <-blocked:
		return fmt.Errorf("wait for confirm: %w", errBlocked)
	}
	if dc.Acked() || !p.ch.IsClosed() {
		p.confirmed(dc.Acked(), exchange, key, msg)
	}
	switch {
	case dc.Acked() && p.wasReturned(msg.MessageId):
		return errUnroutable
	case dc.Acked():
		return nil
	case p.ch.IsClosed():
		// The channel closed before the broker confirmed: the message may or
		// may not have arrived.
		return fmt.Errorf("publish to %s with key %q: no confirm before the channel closed: %w", exchange, key, p.closedErr())
	default:
		return wire.ErrRefused
	}
}

// errUnroutable is a publish the broker could neither route nor keep (it
// returned it): refused, but not worth retrying as a negative confirm is.
var errUnroutable = fmt.Errorf("%w: the broker could not route the event and could not keep it (is mesh.events' alternate exchange gone?)", wire.ErrRefused)

// closedErr says why the channel is gone: ErrClosed after close, else
// ErrConnectionLost (the broker or the network ended it).
func (p *publisher) closedErr() error {
	if p.shut.Load() {
		return sdk.ErrClosed
	}
	return wire.ErrConnectionLost
}

// abandon stops the publisher of a lost connection: publishes still
// waiting fail with ErrConnectionLost.
func (p *publisher) abandon() {
	p.closeOnce.Do(func() { close(p.stop) })
	<-p.done
}

// close closes the channel; it is idempotent.
func (p *publisher) close() error {
	p.shut.Store(true)
	p.closeOnce.Do(func() { close(p.stop) })
	err := p.ch.Close()
	<-p.done
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}
