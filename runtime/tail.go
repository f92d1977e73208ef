package runtime

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// TailedEvent is one event seen by Tail.
type TailedEvent struct {
	// Event is the decoded event; when Err is set, only Type and Body are.
	Event sdk.Event
	// Headers are all of the message's headers as they were on the wire.
	Headers map[string]any
	// Err says how the message breaks the contract, or is nil.
	Err error
}

// Tail calls fn with every event matching pattern from now until ctx is
// done or fn returns an error. It reads from a temporary, exclusive,
// server-named queue that the broker deletes when Tail returns, so it takes
// nothing from any module. ready, if not nil, is called once that queue is
// bound: every event published after it is seen. If the connection is
// lost, Tail returns an error wrapping wire.ErrConnectionLost, and the
// events published until a new Tail is ready are not seen.
func (n *Node) Tail(ctx context.Context, pattern string, ready func(), fn func(TailedEvent) error) error {
	if err := wire.ValidateSubscription(pattern); err != nil {
		return err
	}
	sess, err := n.awaitSession(ctx)
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	ch, err := sess.subConn.Channel()
	if err != nil {
		return fmt.Errorf("tail: open channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{
		"x-queue-type": QueueClassic,
		"x-max-length": int64(100_000), // a stalled tail drops its oldest, never the broker's memory
	})
	if err != nil {
		return fmt.Errorf("tail: declare queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, pattern, wire.ExchangeEvents, false, nil); err != nil {
		return fmt.Errorf("tail: bind %q: %w", pattern, err)
	}
	// Plain Consume: ConsumeWithContext would cancel the consumer from its own
	// goroutine while the deferred Close runs, and the two calls can hang.
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("tail: consume: %w", err)
	}
	if ready != nil {
		ready()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				if ch.IsClosed() { // the channel went with its connection
					return fmt.Errorf("tail: %w", wire.ErrConnectionLost)
				}
				return fmt.Errorf("tail: the broker cancelled the consumer (was its queue deleted?)")
			}
			if err := fn(tailed(d)); err != nil {
				return err
			}
		}
	}
}

func tailed(d amqp.Delivery) TailedEvent {
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	return TailedEvent{
		Event:   eventOf(d, meta, d.RoutingKey, 1),
		Headers: d.Headers,
		Err:     err,
	}
}
