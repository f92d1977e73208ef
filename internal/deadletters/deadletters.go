package deadletters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/exists"
	"github.com/meshkit/mesh/internal/wire"
)

// Errors callers branch on. Errors returned by List, Show, Replay and
// Purge, and the Err of each Left, wrap one of them (or the broker's or
// the context's error).
var (
	// ErrNotKeeper means the queue named is not one of the keeper queues,
	// wire.QueueDead and wire.QueueUnrouted. Permanent.
	ErrNotKeeper = errors.New("not a keeper queue (want " + wire.QueueDead + " or " + wire.QueueUnrouted + ")")
	// ErrNoQueue means the broker has no such queue in the virtual host:
	// no node has declared the mesh's topology there yet. Permanent until
	// one does.
	ErrNoQueue = errors.New("queue does not exist")
	// ErrBadFilter means a Filter field breaks its rule. Permanent.
	ErrBadFilter = errors.New("bad filter")
	// ErrNotFound means Show found no message with an id asked for.
	ErrNotFound = errors.New("message not found")

	// ErrQueueGone is a Left's reason when the queue a dead letter came
	// from no longer exists: the broker returned the replayed copy. The
	// dead letter stays. Permanent until the module runs again.
	ErrQueueGone = errors.New("queue gone")
	// ErrNoTarget is a Left's reason when a dead letter names no queue
	// that gave up (neither x-mesh-dead-queue nor x-death), or a name no
	// queue can have. Permanent.
	ErrNoTarget = errors.New("names no queue to replay to")
	// ErrForbiddenTarget is a Left's reason when the queue a dead letter
	// names is one a replay never sends to (see checkTarget): a tool's
	// request queue serve.*, one of the mesh's own mesh.*, a module's
	// dead-letter queue *.dead, a server-named amq.* queue (replies). No
	// queue of these gives up on an event, so the name was forged or
	// damaged. Permanent.
	ErrForbiddenTarget = errors.New("names a queue dead letters never go back to")
	// ErrNoUser means Replay cannot tell which broker user its connection
	// authenticated as (a mechanism other than PLAIN or AMQPLAIN), which
	// every replayed message names in its user-id. Permanent.
	ErrNoUser = errors.New("cannot tell the connection's broker user (dial with a user in the URL: PLAIN)")
	// ErrUnroutable is a Left's reason when the broker returned a replayed
	// unrouted event: mesh.events has no queue bound for it and no
	// alternate exchange to keep it. Permanent until the topology is
	// declared.
	ErrUnroutable = errors.New("returned by the broker: no queue and no alternate exchange")
	// ErrRefused is a Left's reason when the broker refused (nacked) the
	// replayed copy, for example because the target queue is full.
	// Transient: replaying again may work.
	ErrRefused = errors.New("refused by the broker")
)

// Result says what Replay or Purge did, or on a dry run would do.
type Result struct {
	// DryRun is true when nothing was changed.
	DryRun bool
	// Matched is how many messages matched the filter.
	Matched int
	// Done is how many of them were replayed or purged (on a dry run:
	// would be).
	Done int
	// Queues counts the replayed dead letters by the queue they went back
	// to (on a dry run: would go back to). Nil for Purge and for unrouted
	// events, which all go to mesh.events.
	Queues map[string]int
	// Left lists the matched messages that stayed in the keeper queue
	// (on a dry run: would stay), with why.
	Left []Left
	// CameBack counts replayed unrouted events that no queue took again,
	// so the alternate exchange brought them back to mesh.unrouted. It is
	// a lower bound: a copy that arrives after the idle timeout is not
	// counted. Always 0 on a dry run.
	CameBack int
	// Sent lists the messages Replay sent, in order, each with where it
	// went (a queue, or mesh.events) and when: what the audit logger is
	// told of (audit.replayed), so that an event's fates say it was
	// replayed. Nil for Purge and on a dry run.
	Sent []Sent
}

// Sent is one message a replay sent.
type Sent struct {
	ID, Destination string
	Time            time.Time
}

// Left is a matched message that stayed in the keeper queue.
type Left struct {
	// ID and Type are the message's id and event type.
	ID, Type string
	// Queue is the queue a dead letter would have gone back to ("" if it
	// names none).
	Queue string
	// Err says why; it wraps ErrQueueGone, ErrNoTarget,
	// ErrForbiddenTarget, ErrUnroutable or ErrRefused.
	Err error
}

// Option is a per-call setting of List, Show, Replay and Purge.
type Option func(*options)

type options struct {
	dryRun   bool
	progress func(done, total int)
	idle     time.Duration
	now      func() time.Time
	limit    int
	body     int  // bytes of each body List keeps; < 0: all of it
	summary  bool // List keeps each message's fields alone (Summaries)
}

func collectOptions(opts []Option) options {
	o := options{idle: DefaultIdleTimeout, now: time.Now, body: -1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.idle <= 0 {
		o.idle = DefaultIdleTimeout
	}
	return o
}

// DefaultIdleTimeout is how long a browse waits for the next message before
// it takes the queue as read to the end.
const DefaultIdleTimeout = 500 * time.Millisecond

// DryRun makes Replay and Purge report what they would do and change
// nothing: every message stays where it is. A dry replay of dead letters
// still checks that each target queue exists.
func DryRun() Option { return func(o *options) { o.dryRun = true } }

// WithProgress has Replay, Purge and List call f(done, total) once with
// done 0 and then after each message: Replay over the matches it
// replays, Purge and List over the messages they read (total is how many
// the queue held when they began; they read no further). It is called
// from the calling goroutine and must return quickly.
func WithProgress(f func(done, total int)) Option {
	return func(o *options) { o.progress = f }
}

// WithLimit makes List and Replay stop at the first n matching messages
// (0: no limit), so they neither read nor hold the rest of a deep queue.
// A Replay holds the messages it replays in memory until it has replayed
// them: the limit bounds that.
func WithLimit(n int) Option { return func(o *options) { o.limit = max(n, 0) } }

// WithBodyLimit makes List and Show keep at most the first n bytes of
// each message's body: Message.Body is a copy of them (so the whole body
// read from the broker is not held), and Message.Size is still the whole
// body's length. n < 0 keeps every body whole (the default). Replay and
// Purge ignore it.
func WithBodyLimit(n int) Option { return func(o *options) { o.body = n } }

// Summaries makes List and Show keep of each message its fields alone,
// in a bounded size whatever its publisher wrote: no Headers, no Body
// (Size still says the body's length), the Error cut to SummaryError
// bytes and every other text field to SummaryText, each cut one ending
// in "…". N summaries take at most about N × (13 × SummaryText +
// SummaryError + 400) bytes (8 KiB each), and typically well under 1 KiB
// each: what a list of many messages (a console's groups) needs, however
// large the bodies. A field cut short no longer matches the whole text
// (an id longer than SummaryText cannot be looked up by what it shows).
// Replay and Purge ignore it.
func Summaries() Option { return func(o *options) { o.summary = true } }

// SummaryText and SummaryError bound the text of a summary's fields
// (Summaries): every field's but the error's at SummaryText bytes (the
// protocol bounds what the runtime writes there, names and ids, at 255),
// the error's at SummaryError (the runtime cuts what it writes at 4096).
const (
	SummaryText  = 256
	SummaryError = 4096
)

// keep is what List keeps of m, as the options say.
func (o options) keep(m Message) Message {
	switch {
	case o.summary:
		m.Headers, m.Body = nil, nil
		m.Error = cut(m.Error, SummaryError)
		for _, f := range []*string{&m.ID, &m.Type, &m.UserID, &m.DeadBy, &m.Exchange, &m.RoutingKey, &m.Source, &m.SourceNode,
			&m.Queue, &m.Node, &m.Module, &m.Reason, &m.ContentType} {
			*f = cut(*f, SummaryText)
		}
	case o.body >= 0 && len(m.Body) > o.body:
		m.Body = bytes.Clone(m.Body[:o.body])
	}
	return m
}

// cut is a copy of s if it has at most n bytes; otherwise of its first n
// bytes, at most, up to a whole rune, and "…". A copy of its own: a
// summary holds nothing of what it was read from (a field read from a
// body, or a part of another field, would hold all of it).
func cut(s string, n int) string {
	if len(s) <= n {
		return strings.Clone(s)
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n]) + "…"
}

// WithIdleTimeout sets how long a browse waits for the next message before
// it stops reading (default DefaultIdleTimeout).
func WithIdleTimeout(d time.Duration) Option { return func(o *options) { o.idle = d } }

// keeper checks that queue is a keeper queue and says whether it is the
// dead letters' one.
func keeper(queue string) (dead bool, err error) {
	switch queue {
	case wire.QueueDead:
		return true, nil
	case wire.QueueUnrouted:
		return false, nil
	}
	return false, fmt.Errorf("%w: %q", ErrNotKeeper, queue)
}

// List returns the messages of a keeper queue (wire.QueueDead or
// wire.QueueUnrouted) that match f, in the order the queue delivers them
// (oldest first, unless some were given back by an earlier browse), up to
// the WithLimit. Every message stays in the queue: List holds them
// unacknowledged while it reads and gives them all back before it
// returns. It keeps in memory only the messages it returns.
func List(ctx context.Context, conn *amqp.Connection, queue string, f Filter, opts ...Option) (out []Message, err error) {
	dead, o, b, n, err := startWalk(conn, queue, f, opts)
	if b != nil {
		defer func() { err = errors.Join(err, b.close()) }()
	}
	if err != nil {
		return nil, err
	}
	err = b.walk(ctx, n, dead, f, o, func(h held) (bool, error) {
		out = append(out, o.keep(h.m))
		return o.limit > 0 && len(out) >= o.limit, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Show returns the messages of a keeper queue with the given ids (message
// id or x-event-id), in queue order; every message stays in the queue. If
// some id matches no message, it returns the messages found and an error
// wrapping ErrNotFound that names the missing ids. With Summaries, a
// message is found by its Message.ID alone (its headers are not kept).
func Show(ctx context.Context, conn *amqp.Connection, queue string, ids []string, opts ...Option) ([]Message, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no id given", ErrBadFilter)
	}
	msgs, err := List(ctx, conn, queue, Filter{IDs: ids}, opts...)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, id := range ids {
		found := false
		for _, m := range msgs {
			if m.ID == id || text(m.Headers[wire.HeaderEventID]) == id {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return msgs, fmt.Errorf("%w in %s: %s", ErrNotFound, queue, strings.Join(missing, ", "))
	}
	return msgs, nil
}

// Replay sends the matching messages of a keeper queue back to be handled,
// and removes each from the keeper queue only once the broker has confirmed
// its copy and not returned it.
//
// Every replayed message has the replaying connection's broker user as its
// user-id (the broker checks it), so a replayed event says who replayed it,
// and the original publisher's user (Message.UserID) in x-mesh-user-id.
//
// A dead letter goes back to the queue that gave up on it, and only there,
// through the default exchange: the original body, properties and message
// id, persistent, with the original headers minus the broker's
// (x-death, x-first-death-*, x-last-death-*, x-delivery-count) and the
// runtime's (x-mesh-*: the dead-letter headers, x-mesh-attempt, so attempts
// start over), and with x-mesh-routing-key set to the event type, which the
// runtime reads as the type of an event arriving by another routing key
// (it honours it there because the message has a user-id). Only a queue
// checkTarget allows is sent to: a module's event queue or a queue outside
// the mesh's own names; any other is left with ErrForbiddenTarget. If that
// queue no longer exists the dead letter stays, reported in Result.Left
// with ErrQueueGone.
// A dead letter no queue gave up on (reason refused: the broker refused it
// as a node resent it from its spool) goes to mesh.events again with its
// type as the routing key, counted in Result.Queues under mesh.events.
//
// An unrouted event is published again to mesh.events with its type as the
// routing key (x-mesh-routing-key when a node kept it there itself) and its
// headers. If a queue is bound for it now it is routed there; if not,
// the alternate exchange brings it back to mesh.unrouted, counted in
// Result.CameBack.
//
// A message left in place is not an error; the error is for what stopped
// the whole replay (a bad filter, a missing queue, a lost connection, ctx
// cancelled), and comes with the Result so far. Replay is at least once: if
// it stops between a confirm and the removal, the event is both replayed
// and still kept.
func Replay(ctx context.Context, conn *amqp.Connection, queue string, f Filter, opts ...Option) (res Result, err error) {
	dead, o, b, n, err := startWalk(conn, queue, f, opts)
	res.DryRun = o.dryRun
	if b != nil {
		defer func() { err = errors.Join(err, b.close()) }()
	}
	if err != nil {
		return res, err
	}
	if dead {
		res.Queues = make(map[string]int)
	}
	// The matches first, up to the limit, reading the queue as fast as
	// the broker sends it (what does not match is not kept); then the
	// replay, one confirmed publish at a time.
	var matches []held
	read := o
	read.progress = nil
	err = b.walk(ctx, n, dead, f, read, func(h held) (bool, error) {
		matches = append(matches, h)
		return o.limit > 0 && len(matches) >= o.limit, nil
	})
	res.Matched = len(matches)
	if err != nil || len(matches) == 0 {
		return res, err
	}
	o.report(0, len(matches))
	if o.dryRun {
		there := make(map[string]bool)
		for i, h := range matches {
			if err := dryReplayOne(conn, h, dead, &res, there); err != nil {
				return res, err
			}
			o.report(i+1, len(matches))
		}
		return res, nil
	}
	user := amqpmsg.ConnUser(conn)
	if user == "" {
		return res, ErrNoUser
	}
	pub, err := newPublisher(conn)
	if err != nil {
		return res, err
	}
	defer pub.close()
	replayed := make(map[string]int) // unrouted ids replayed, to know their copies
	for i, h := range matches {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		matches[i] = held{} // replayed or left: its body is not needed any more
		msg := amqpmsg.Republishing(h.d, droppedOnReplay)
		msg.UserId = user // who replays it; the broker checks it
		msg.Headers[wire.HeaderUserID] = h.m.UserID
		exchange, key := wire.ExchangeEvents, h.m.Type
		switch {
		case dead && toExchange(h):
		case dead:
			if err := checkTarget(h.m.Queue); err != nil {
				res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type, Queue: h.m.Queue, Err: err})
				o.report(i+1, len(matches))
				continue
			}
			exchange, key = "", h.m.Queue
			if h.m.Type != "" {
				msg.Headers[wire.HeaderRoutingKey] = h.m.Type
			}
		}
		returned, err := pub.publish(ctx, exchange, key, msg)
		switch {
		case errors.Is(err, ErrRefused):
			res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type, Queue: h.m.Queue, Err: err})
		case err != nil:
			return res, fmt.Errorf("replay %s: %w", h.m.ID, err)
		case returned != nil && exchange == "":
			res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type, Queue: h.m.Queue,
				Err: fmt.Errorf("%w: %s (%s)", ErrQueueGone, h.m.Queue, returned.ReplyText)})
		case returned != nil:
			res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type,
				Err: fmt.Errorf("%w (%s)", ErrUnroutable, returned.ReplyText)})
		default:
			if err := b.ack(h); err != nil {
				return res, fmt.Errorf("remove replayed %s from %s (it was replayed and is still kept): %w", h.m.ID, queue, err)
			}
			res.Done++
			dest := key
			if exchange != "" {
				dest = exchange
			}
			res.Sent = append(res.Sent, Sent{ID: h.m.ID, Destination: dest, Time: time.Now().UTC()})
			switch {
			case exchange == "":
				res.Queues[key]++
			case dead:
				res.Queues[wire.ExchangeEvents]++ // a refused event, sent to the exchange again
			default:
				replayed[h.m.ID]++
			}
		}
		o.report(i+1, len(matches))
	}
	if !dead && res.Done > 0 {
		res.CameBack, err = b.cameBack(ctx, replayed, res.Done)
	}
	return res, err
}

// dryReplayOne adds to res what Replay would do with h, checking for a
// dead letter that its target queue exists (exists caches the answers).
func dryReplayOne(conn *amqp.Connection, h held, dead bool, res *Result, there map[string]bool) error {
	switch {
	case !dead:
		res.Done++
	case toExchange(h):
		res.Done++
		res.Queues[wire.ExchangeEvents]++
	case checkTarget(h.m.Queue) != nil:
		res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type, Queue: h.m.Queue, Err: checkTarget(h.m.Queue)})
	default:
		ok, known := there[h.m.Queue]
		if !known {
			var err error
			if ok, err = exists.Queue(conn, h.m.Queue); err != nil {
				return err
			}
			there[h.m.Queue] = ok
		}
		if ok {
			res.Done++
			res.Queues[h.m.Queue]++
		} else {
			res.Left = append(res.Left, Left{ID: h.m.ID, Type: h.m.Type, Queue: h.m.Queue,
				Err: fmt.Errorf("%w: %s", ErrQueueGone, h.m.Queue)})
		}
	}
	return nil
}

// toExchange says whether a dead letter goes back to mesh.events rather
// than to a queue: no queue gave up on it, the broker refused it as a node
// resent it from its spool (reason refused), or a node's mover set aside a
// schedule whose module was removed or lost its grant (reason revoked),
// which the operator's replay delivers after all.
func toExchange(h held) bool {
	return h.m.Queue == "" && (h.m.Reason == wire.DeadReasonRefused || h.m.Reason == wire.DeadReasonRevoked)
}

// checkTarget checks the queue a dead letter names before publishing to it.
// A name that could not be sent would fail the publish, not just this one
// dead letter (ErrNoTarget). And the name is only what the dead letter
// says, so it is sent to only if it is a queue that gives up on events and
// whose consumer takes a replay as an event (ErrForbiddenTarget
// otherwise):
//   - a module's event queue, <node>.<module>.events (splitModuleQueue):
//     its node reads the type from x-mesh-routing-key and handles it only
//     if the module subscribes to it;
//   - a queue outside the mesh's own names, which a module consumes
//     (sdk.Mesh.Consume, a dispatcher's trigger queue shop.orders): its
//     node dead-letters what its handler gives up on, naming the queue.
//
// Never a mesh-internal queue, whatever its shape: serve.* (a tool's
// request queue: a replay there would run the tool with a caller the dead
// letter claims), mesh.* (keepers, node locks), amq.* (server-named: reply
// queues, tail and membership queues), *.dead (modules' dead-letter
// queues, which never give up on anything). The audit logger's queue,
// <node>.audit-logger.events, is a module event queue like any other: the
// logger dead-letters what it could not store, and records a replayed
// copy of an id it holds as no second row.
func checkTarget(queue string) error {
	if queue == "" {
		return ErrNoTarget
	}
	if _, _, module := splitModuleQueue(queue); !module {
		why := ""
		switch {
		case strings.HasPrefix(queue, "serve."):
			why = "a tool's request queue (serve.*)"
		case strings.HasPrefix(queue, "mesh."):
			why = "one of the mesh's own queues (mesh.*)"
		case strings.HasPrefix(queue, "amq."):
			why = "a server-named queue (amq.*: replies, tails)"
		case strings.HasSuffix(queue, ".dead"):
			why = "a module's dead-letter queue (*.dead)"
		}
		if why != "" {
			return fmt.Errorf("%w: %q is %s; a dead letter goes back only to a module's event queue <node>.<module>.events "+
				"or to a queue a module consumes, so this name is forged or damaged", ErrForbiddenTarget, queue, why)
		}
	}
	if err := wire.ValidateQueueName(queue); err != nil {
		return fmt.Errorf("%w: %w", ErrNoTarget, err)
	}
	return nil
}

// startWalk checks queue and f and opens a browser on queue; n is how
// many messages it held. The caller closes the browser (when not nil),
// which gives back every message it did not ack.
func startWalk(conn *amqp.Connection, queue string, f Filter, opts []Option) (dead bool, o options, b *browser, n int, err error) {
	o = collectOptions(opts)
	if dead, err = keeper(queue); err != nil {
		return dead, o, nil, 0, err
	}
	if err = f.Validate(); err != nil {
		return dead, o, nil, 0, err
	}
	b, n, err = openBrowser(conn, queue, o)
	return dead, o, b, n, err
}

// Purge deletes the matching messages of a keeper queue; every other
// message stays. With DryRun it only counts them.
func Purge(ctx context.Context, conn *amqp.Connection, queue string, f Filter, opts ...Option) (res Result, err error) {
	dead, o, b, n, err := startWalk(conn, queue, f, opts)
	res.DryRun = o.dryRun
	if b != nil {
		defer func() { err = errors.Join(err, b.close()) }()
	}
	if err != nil {
		return res, err
	}
	err = b.walk(ctx, n, dead, f, o, func(h held) (bool, error) {
		res.Matched++
		if !o.dryRun {
			if err := b.ack(h); err != nil {
				return true, fmt.Errorf("purge %s from %s: %w", h.m.ID, queue, err)
			}
		}
		res.Done++
		return false, nil
	})
	return res, err
}

func (o options) report(done, total int) {
	if o.progress != nil {
		o.progress(done, total)
	}
}

// droppedOnReplay says whether a replay drops header k: the broker's and
// the runtime's own (x-mesh-*), of which Replay sets those it means.
func droppedOnReplay(k string) bool {
	return amqpmsg.Bookkeeping(k)
}
