package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// A replay from the mesh's history (ADR 35) reads the stream bound to #
// on mesh.events instead of the audit logger's index. Offsets stand in
// for the index's Seq: the cutoff is the offset of a marker the replay
// writes into the stream itself, and a page's cursor is the offset to
// read next.
//
// Measured on RabbitMQ 3.10 (runtime/history.go): a stream consumer must
// set a prefetch (406 otherwise); a numeric x-stream-offset starts exactly
// there, "first" at the oldest kept, a timestamp at the chunk holding that
// second (broker time, whole seconds); each delivery carries its offset in
// x-stream-offset (a long); an offset past the end waits for what comes.

const (
	// DefaultHistoryPage is how many events a page of the history holds
	// when HistoryConfig.PageSize is 0.
	DefaultHistoryPage = 1000
	// historyPrefetch bounds the deliveries in flight on a read of the
	// stream (a stream consumer must have one).
	historyPrefetch = 256
	// clockSlack is how far before the window's From a read starts: the
	// stream is read by the broker's time of arrival, the window is on the
	// emitters' x-time.
	clockSlack = 5 * time.Minute
	// markerSearch is how far back from now the marker is looked for (the
	// broker's clock may be behind ours).
	markerSearch = 10 * time.Minute
)

// HistorySelection is what a replay from the history sends: the events
// that match every field set (an empty field matches any).
type HistorySelection struct {
	// From and To bound the emit time (x-time): at or after From, before
	// To. Zero leaves that end open.
	From, To time.Time
	// Types are AMQP topic patterns of the event type (any of them).
	Types []string
	// Sources, Nodes, UserIDs and IDs are the emitter (x-source), the
	// emitting node (x-node), the broker user that published it (its
	// user-id) and the event id (x-event-id): any of each.
	Sources, Nodes, UserIDs, IDs []string
	// Replays selects the copies earlier replays sent to mesh.events
	// (carrying x-replay-id) as well. By default they are skipped: the
	// history holds each one's original too, so replaying both would send
	// the event twice.
	Replays bool
}

// HistoryConfig configures a HistoryLog.
type HistoryConfig struct {
	// Stream is the history's stream (history.stream in the node config).
	Stream string
	// Selection says which events are replayed.
	Selection HistorySelection
	// PageSize is how many events a page holds at most (0:
	// DefaultHistoryPage): what a replay holds in memory at a time.
	PageSize int
	// MarkerID is the value of the cutoff's marker (wire.HeaderHistoryMarker):
	// the replay's id; "" makes a fresh one.
	MarkerID string
	// Record records what the replay sent (the audit logger's
	// audit.replayed tool). Nil records nothing: the history is not
	// written to, and no one keeps what the replay sent.
	Record func(ctx context.Context, replayID, destination string, sent []Sent) error
}

// Validate says what is wrong with c.
func (c HistoryConfig) Validate() error {
	var errs []error
	if err := wire.ValidateQueueName(c.Stream); err != nil {
		errs = append(errs, fmt.Errorf("replay history: stream: %w", err))
	}
	for _, p := range c.Selection.Types {
		if err := wire.ValidatePattern(p); err != nil {
			errs = append(errs, fmt.Errorf("replay history: type: %w", err))
		}
	}
	s := c.Selection
	if !s.From.IsZero() && !s.To.IsZero() && !s.To.After(s.From) {
		errs = append(errs, fmt.Errorf("replay history: the window's end %s is not after its start %s",
			s.To.UTC().Format(time.RFC3339Nano), s.From.UTC().Format(time.RFC3339Nano)))
	}
	if c.PageSize < 0 {
		errs = append(errs, fmt.Errorf("replay history: page size %d is negative", c.PageSize))
	}
	return errors.Join(errs...)
}

// HistoryLog is the mesh's history (a RabbitMQ stream) as the Log a
// replay reads, the events its selection holds a page at a time.
//
// Cutoff writes a marker into the stream (through the default exchange,
// under the connection's user, confirmed) and takes its offset: the
// stream's messages before it are the replay's to send, none after it
// ever is, so the replay's own sends to mesh.events, which the stream
// also keeps, are never replayed. Runtime readers of the history skip
// the marker (amqpmsg.IsHistoryMarker). Every read is a consumer on a
// channel of its own, closed when the read ends.
//
// The window is on the events' emit time, the stream is read by arrival:
// a read starts 5 minutes of clock slack before From (at the stream's
// start when From is zero) and goes on to the cutoff, so an event that
// reached the broker more than 5 minutes after its x-time said (one that
// waited in a node's spool) and before From-5m is not found. Messages
// that break the wire contract and the cutoff markers are skipped.
//
// A HistoryLog is for one replay at a time: Run calls its methods in
// turn, never at once.
type HistoryLog struct {
	conn *amqp.Connection
	cfg  HistoryConfig
	// searchFrom is where the marker was looked for, and found: a read
	// from there or before reaches the cutoff.
	searchFrom time.Time
}

var _ Log = (*HistoryLog)(nil)

// NewHistoryLog is the history on stream cfg.Stream of the broker conn
// is connected to.
func NewHistoryLog(conn *amqp.Connection, cfg HistoryConfig) (*HistoryLog, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, errors.New("replay history: no broker connection")
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultHistoryPage
	}
	return &HistoryLog{conn: conn, cfg: cfg}, nil
}

// Cutoff writes a marker into the stream and returns its offset.
func (l *HistoryLog) Cutoff(ctx context.Context) (int64, error) {
	user := amqpmsg.ConnUser(l.conn)
	if user == "" {
		return 0, errors.New("cannot tell the connection's broker user, which the history's marker must carry in its user-id (dial with a user in the URL: PLAIN)")
	}
	if err := l.streamExists(); err != nil {
		return 0, err
	}
	marker := l.cfg.MarkerID
	if marker == "" {
		marker = ulid.Make().String()
	}
	nonce := ulid.Make().String() // this marker's, should the same value be written twice
	searchFrom := time.Now().Add(-markerSearch)
	if err := l.writeMarker(ctx, user, marker, nonce); err != nil {
		return 0, err
	}
	cutoff := int64(-1)
	err := l.scan(ctx, searchFrom, math.MaxInt64, func(offset int64, d amqp.Delivery) bool {
		if v, _ := d.Headers[wire.HeaderHistoryMarker].(string); v == marker && d.MessageId == nonce && amqpmsg.IsHistoryMarker(d) {
			cutoff = offset
			return false
		}
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("find the marker %s in the stream %s: %w", marker, l.cfg.Stream, err)
	}
	l.searchFrom = searchFrom
	return cutoff, nil
}

// Count is how many selected events the stream holds before offset upTo.
func (l *HistoryLog) Count(ctx context.Context, upTo int64) (int64, error) {
	var n int64
	err := l.scan(ctx, l.start(), upTo, func(_ int64, d amqp.Delivery) bool {
		if _, ok := l.selected(d); ok {
			n++
		}
		return true
	})
	return n, err
}

// Page returns the next selected events before offset upTo, at most the
// page size, from the start of the window (after 0) or from offset after,
// and the offset to read next: 0 when the read reached upTo.
func (l *HistoryLog) Page(ctx context.Context, after, upTo int64) ([]Event, int64, error) {
	var start any = l.start()
	if after != 0 {
		start = after
	}
	var page []Event
	next := int64(0)
	err := l.scan(ctx, start, upTo, func(offset int64, d amqp.Delivery) bool {
		if offset < after {
			return true
		}
		if len(page) == l.cfg.PageSize {
			next = offset // never 0: a page was read before it
			return false
		}
		if ev, ok := l.selected(d); ok {
			page = append(page, ev)
		}
		return true
	})
	if err != nil {
		return nil, 0, err
	}
	return page, next, nil
}

// Record records what the replay sent through the function the config
// gave, if any.
func (l *HistoryLog) Record(ctx context.Context, replayID, destination string, sent []Sent) error {
	if l.cfg.Record == nil {
		return nil
	}
	return l.cfg.Record(ctx, replayID, destination, sent)
}

// start is where a read of the window starts: From less the clock slack,
// never later than where the marker was found (a read from there reaches
// the cutoff), or the stream's first message.
func (l *HistoryLog) start() any {
	from := l.cfg.Selection.From
	if from.IsZero() {
		return "first"
	}
	from = from.Add(-clockSlack)
	if !l.searchFrom.IsZero() && from.After(l.searchFrom) {
		from = l.searchFrom
	}
	return from
}

// streamExists checks that the stream is there before a marker goes to
// it.
func (l *HistoryLog) streamExists() error {
	ch, err := l.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(l.cfg.Stream, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("the history stream %s does not exist (history.stream in the node config; a node declares it)", l.cfg.Stream)
		}
		return fmt.Errorf("check the history stream %s: %w", l.cfg.Stream, err)
	}
	return nil
}

// writeMarker sends the cutoff's marker straight to the stream and waits
// for the broker's confirm.
func (l *HistoryLog) writeMarker(ctx context.Context, user, marker, nonce string) error {
	ch, err := l.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("publisher confirms: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", l.cfg.Stream, true, false, amqp.Publishing{
		Headers:      amqp.Table{wire.HeaderHistoryMarker: marker},
		DeliveryMode: amqp.Persistent,
		MessageId:    nonce,
		Timestamp:    time.Now(),
		UserId:       user,
	})
	if err != nil {
		return fmt.Errorf("write the cutoff's marker to the stream %s: %w", l.cfg.Stream, err)
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("confirm of the cutoff's marker: %w", err)
	case !ok:
		return fmt.Errorf("the broker refused the cutoff's marker to the stream %s (a negative confirm)", l.cfg.Stream)
	}
	select { // a return comes before its confirm
	case r := <-returns:
		return fmt.Errorf("the cutoff's marker came back unrouted (%s): is the stream %s still there?", r.ReplyText, l.cfg.Stream)
	default:
	}
	return nil
}

// scan reads the stream from start (an offset, "first" or a time),
// handing each delivery before offset upTo to fn until fn returns false
// or a delivery at upTo or past it comes. It reads on a channel of its
// own, closed when it returns.
func (l *HistoryLog) scan(ctx context.Context, start any, upTo int64, fn func(offset int64, d amqp.Delivery) bool) error {
	ch, err := l.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(historyPrefetch, 0, false); err != nil { // a stream reader must have one (406 otherwise)
		return fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(l.cfg.Stream, "", false, false, false, false, amqp.Table{"x-stream-offset": start})
	if err != nil {
		return fmt.Errorf("read the history stream %s: %w", l.cfg.Stream, err)
	}
	unacked := 0
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok = <-deliveries:
		}
		if !ok {
			select {
			case e := <-closed:
				if e != nil {
					return fmt.Errorf("read the history stream %s: %w", l.cfg.Stream, e)
				}
			default:
			}
			return fmt.Errorf("read the history stream %s: the broker ended the read (was the stream deleted?)", l.cfg.Stream)
		}
		offset, isOffset := d.Headers[wire.HeaderStreamOffset].(int64)
		if !isOffset {
			return fmt.Errorf("%s is not a stream: its messages carry no %s", l.cfg.Stream, wire.HeaderStreamOffset)
		}
		if offset >= upTo || !fn(offset, d) {
			return nil
		}
		// Acks only make room in the prefetch: one for half of it.
		if unacked++; unacked >= historyPrefetch/2 {
			if err := d.Ack(true); err != nil {
				return fmt.Errorf("acknowledge history deliveries: %w", err)
			}
			unacked = 0
		}
	}
}

// selected is d as an Event, if it is one (not a marker, not a message
// that breaks the wire contract) and the selection takes it.
func (l *HistoryLog) selected(d amqp.Delivery) (Event, bool) {
	if amqpmsg.IsHistoryMarker(d) {
		return Event{}, false
	}
	typ, ok := eventType(d)
	if !ok || wire.ValidateEventType(typ) != nil {
		return Event{}, false
	}
	headers := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		if k != wire.HeaderStreamOffset { // the stream's, not the event's
			headers[k] = v
		}
	}
	meta, err := wire.DecodeMeta(headers, d.ContentType, d.Body)
	if err != nil {
		return Event{}, false
	}
	s := l.cfg.Selection
	if _, replayed := headers[wire.HeaderReplayID]; replayed && !s.Replays {
		return Event{}, false
	}
	switch {
	case !s.From.IsZero() && meta.Time.Before(s.From),
		!s.To.IsZero() && !meta.Time.Before(s.To),
		len(s.Types) > 0 && !slices.ContainsFunc(s.Types, func(p string) bool { return wire.MatchPattern(p, typ) }),
		!anyOf(s.Sources, meta.Source),
		!anyOf(s.Nodes, meta.Node),
		!anyOf(s.UserIDs, d.UserId),
		!anyOf(s.IDs, meta.ID):
		return Event{}, false
	}
	text := make(map[string]string, len(headers))
	for k, v := range headers {
		text[k] = deadletters.HeaderText(v)
	}
	return Event{ID: meta.ID, Type: typ, Headers: text, Body: d.Body, Time: meta.Time, UserID: d.UserId}, true
}

// eventType is the type of the event d holds, as the runtime reads it:
// the routing key of a message through an exchange (mesh.events); for
// one sent straight to the stream, the x-mesh-routing-key header of a
// publisher the broker verified, and no type otherwise.
func eventType(d amqp.Delivery) (string, bool) {
	if d.Exchange != "" {
		return d.RoutingKey, true
	}
	rk, ok := d.Headers[wire.HeaderRoutingKey].(string)
	return rk, ok && d.UserId != ""
}

// anyOf reports whether v is one of set, or set is empty.
func anyOf(set []string, v string) bool {
	return len(set) == 0 || slices.Contains(set, v)
}
