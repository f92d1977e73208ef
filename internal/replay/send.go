package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// pacer says when each event may go.
type pacer struct {
	pace  Pace
	sleep func(ctx context.Context, d time.Duration) error
	now   func() time.Time

	n        int
	start    time.Time     // when the first event went
	first    time.Time     // the first event's emit time
	offset   time.Duration // the latest original offset used (never decreasing)
	lastDue  time.Time
	lastSent time.Time
}

// due is when ev may go, the previous one having gone at p.lastSent.
func (p *pacer) due(ev Event, now time.Time) time.Time {
	if p.n == 0 {
		p.start, p.first = now, ev.Time
		return now
	}
	switch {
	case p.pace.Factor > 0:
		// Events come in order of arrival, which may differ a little from
		// their emit times: the spacing never goes backwards.
		if !ev.Time.IsZero() && !p.first.IsZero() {
			p.offset = max(p.offset, ev.Time.Sub(p.first))
		}
		return p.start.Add(time.Duration(float64(p.offset) / p.pace.Factor))
	case p.pace.Delay > 0:
		return p.lastSent.Add(p.pace.Delay)
	case p.pace.Rate > 0:
		next := p.lastDue.Add(time.Duration(float64(time.Second) / p.pace.Rate))
		return maxTime(next, p.lastSent) // never a burst to catch up
	}
	return now
}

// wait sleeps until ev is due and returns when it went.
func (p *pacer) wait(ctx context.Context, ev Event) (time.Time, error) {
	now := p.now()
	due := p.due(ev, now)
	if d := due.Sub(now); d > 0 {
		if err := p.sleep(ctx, d); err != nil {
			return time.Time{}, err
		}
	}
	p.n++
	p.lastDue = due
	p.lastSent = p.now()
	return p.lastSent, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publisher sends with confirms, and mandatory so that a send to a queue
// that is gone comes back instead of vanishing.
type publisher struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	user    string // the connection's broker user, every send's user-id
}

func newPublisher(conn *amqp.Connection) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("replay: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("replay: publisher confirms: %w", err)
	}
	return &publisher{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, window))}, nil
}

func (p *publisher) close() { _ = p.ch.Close() }

// send sends chunk at the pacer's pace and waits for the broker's
// confirms. It returns the events the broker took, in order, up to the
// first it did not.
func (p *publisher) send(ctx context.Context, pc *pacer, chunk []Event, replayID, queue string) ([]Sent, error) {
	exchange, key := wire.ExchangeEvents, ""
	if queue != "" {
		exchange, key = "", queue
	}
	type inFlight struct {
		sent Sent
		dc   *amqp.DeferredConfirmation
	}
	flight := make([]inFlight, 0, len(chunk))
	var sendErr error
	for _, ev := range chunk {
		at, err := pc.wait(ctx, ev)
		if err != nil {
			sendErr = err
			break
		}
		k := key
		if k == "" {
			k = ev.Type
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, k, true, false, message(ev, replayID, queue, p.user))
		if err != nil {
			sendErr = fmt.Errorf("send %s: %w", ev.ID, err)
			break
		}
		flight = append(flight, inFlight{Sent{ID: ev.ID, Time: at}, dc})
	}
	var confirmed []Sent
	for _, f := range flight {
		ok, err := f.dc.WaitContext(ctx)
		if err != nil {
			sendErr = errors.Join(sendErr, fmt.Errorf("confirm of %s: %w", f.sent.ID, err))
			break
		}
		if !ok {
			sendErr = errors.Join(sendErr, fmt.Errorf("the broker refused %s (a negative confirm)", f.sent.ID))
			break
		}
		confirmed = append(confirmed, f.sent)
	}
	// A return comes before its message's confirm: once the confirms are
	// in, every return of the chunk is here. A returned event was not
	// delivered, so it is not taken.
	returned := map[string]bool{}
	for drained := false; !drained; {
		select {
		case r := <-p.returns:
			if !returned[r.MessageId] {
				sendErr = errors.Join(sendErr, fmt.Errorf("%s came back unrouted (%s): is queue %s still there?", r.MessageId, r.ReplyText, queue))
			}
			returned[r.MessageId] = true
		default:
			drained = true
		}
	}
	taken := confirmed[:0]
	for _, s := range confirmed {
		if !returned[s.ID] {
			taken = append(taken, s)
		}
	}
	return taken, sendErr
}

// queueExists checks that queue is there before anything is sent to it.
func queueExists(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("replay: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("replay: queue %s does not exist (a module's queue is <node>.<module>.events)", queue)
		}
		return fmt.Errorf("replay: check queue %s: %w", queue, err)
	}
	return nil
}
