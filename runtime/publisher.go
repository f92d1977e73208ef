package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/sdk"
)

// publisher owns one confirm-mode channel and pipelines publishes on it:
// any number of goroutines publish at once, each waits only for its own
// confirm, and one goroutine reads the confirms and returns.
//
// The channel is shared by the publishing goroutines on purpose: amqp091-go
// serialises Publish with the channel's own lock, and GetNextPublishSeqNo
// must be read under the same lock we publish under (p.mu), so that the
// delivery tag we wait for is the one the broker will confirm.
type publisher struct {
	ch *amqp.Channel

	mu       sync.Mutex
	pending  map[uint64]*confirmWait
	returned map[string]struct{} // message ids the broker returned, awaiting their ack
	err      error               // set once the channel is gone

	done chan struct{}
}

type confirmWait struct {
	messageID string
	result    chan error
}

var waitPool = sync.Pool{New: func() any { return &confirmWait{result: make(chan error, 1)} }}

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
		pending:  make(map[uint64]*confirmWait),
		returned: make(map[string]struct{}),
		done:     make(chan struct{}),
	}
	// The confirm channel is buffered for throughput. The return channel is
	// not, and both are read by the one goroutine below: amqp091-go hands
	// frames over one at a time, so a basic.return is read before the
	// basic.ack of the same message (rabbitmq-3.10-facts.md, item 5).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go p.track(confirms, returns, closed)
	return p, nil
}

func (p *publisher) track(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closed <-chan *amqp.Error) {
	defer close(p.done)
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.mu.Lock()
			p.returned[r.MessageId] = struct{}{}
			p.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				p.fail(errors.New("publish channel closed"))
				return
			}
			p.resolve(c)
		case e := <-closed:
			// Resolve the confirms already buffered before failing the
			// rest.
		drain:
			for {
				select {
				case c, ok := <-confirms:
					if !ok {
						break drain
					}
					p.resolve(c)
				default:
					break drain
				}
			}
			if e == nil {
				p.fail(sdk.ErrClosed)
			} else {
				p.fail(fmt.Errorf("publish channel closed: %w", e))
			}
			return
		}
	}
}

func (p *publisher) resolve(c amqp.Confirmation) {
	p.mu.Lock()
	w, ok := p.pending[c.DeliveryTag]
	if ok {
		delete(p.pending, c.DeliveryTag)
	}
	var wasReturned bool
	if ok {
		if _, wasReturned = p.returned[w.messageID]; wasReturned {
			delete(p.returned, w.messageID)
		}
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	switch {
	case !c.Ack:
		w.result <- sdk.ErrRefused
	case wasReturned:
		w.result <- sdk.ErrUnroutable
	default:
		w.result <- nil
	}
}

func (p *publisher) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	for tag, w := range p.pending {
		delete(p.pending, tag)
		w.result <- err
	}
}

// publish sends msg persistent and mandatory and waits for the broker's
// confirm. It returns nil only for a positive confirm of a routed message.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish to %s with key %q: %w", exchange, key, err)
	}
	w := waitPool.Get().(*confirmWait)
	w.messageID = msg.MessageId
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		waitPool.Put(w)
		return err
	}
	tag := p.ch.GetNextPublishSeqNo()
	p.pending[tag] = w
	err := p.ch.Publish(exchange, key, true, false, msg)
	if err != nil {
		delete(p.pending, tag)
	}
	p.mu.Unlock()
	if err != nil {
		waitPool.Put(w)
		if errors.Is(err, amqp.ErrClosed) {
			err = errors.Join(sdk.ErrClosed, err)
		}
		return fmt.Errorf("publish to %s with key %q: %w", exchange, key, err)
	}
	select {
	case err := <-w.result:
		waitPool.Put(w)
		return err
	case <-ctx.Done():
		// The confirm will still arrive and be written to w.result, so w
		// must not go back to the pool: leave it to the garbage collector.
		return fmt.Errorf("wait for confirm: %w", ctx.Err())
	}
}

func (p *publisher) close() error {
	err := p.ch.Close()
	<-p.done
	return err
}
