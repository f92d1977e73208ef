// Package replay sends events recorded by the audit logger onto the mesh
// again: with their original ids, headers and bodies plus an x-replay-id
// header naming the replay, persistent and confirmed by the broker, at a
// chosen pace, to mesh.events (every subscriber) or to one module's queue.
// Each goes out under the replaying connection's broker user (its user-id,
// which the broker checks), so a replayed event says who replayed it; the
// original publisher's user rides along in x-mesh-user-id.
//
// What is replayed is fixed when the replay starts: Run takes the log's
// newest Seq as the cutoff (or, reading the mesh's history, the offset of
// a marker it writes into the stream: HistoryLog) and never sends an
// event stored after it, so a replay never replays what arrived during it
// (its own sends included).
// Consumers' de-duplication by id still applies: a module that handled an
// event acknowledges its replay without running the handler, unless it
// allows duplicates.
//
// It is what `meshctl audit replay` runs. The caller implements Log over
// the audit logger's tools (the selection is the Log's business), chooses a
// destination and a Pace, and calls Run with a broker connection:
//
//	res, err := replay.Run(ctx, conn, log, replay.Options{
//		ID:   ulid.Make().String(),
//		Pace: replay.Pace{Rate: 100}, // at most 100 events a second
//	})
//	if err != nil {
//		return err // res.Sent says how many were sent before it failed
//	}
//	fmt.Printf("replay %s: %d of %d events to %s\n", res.ID, res.Sent, res.Selected, res.Destination)
package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/amqpmsg"
	"github.com/meshkit/mesh/internal/wire"
)

// Event is one recorded event, as the log gives it.
type Event struct {
	ID, Type string
	// Headers are its headers as recorded, as text.
	Headers map[string]string
	Body    []byte
	// Time is its emit time (x-time): the pace "original" keeps the
	// spacing of these.
	Time time.Time
	// UserID is the broker user that published it, as recorded: a replay
	// keeps it in x-mesh-user-id, and publishes as its own user.
	UserID string
}

// Sent is one event a replay sent, and when.
type Sent struct {
	ID   string
	Time time.Time
}

// Log is the record a replay reads and writes: the audit logger.
type Log interface {
	// Cutoff is the Seq of the newest event stored now (a HistoryLog's:
	// the offset of its marker in the stream).
	Cutoff(ctx context.Context) (int64, error)
	// Count is how many selected events are stored up to upTo.
	Count(ctx context.Context, upTo int64) (int64, error)
	// Page returns the next selected events stored after the cursor and
	// up to upTo, oldest first, and the next cursor (0 at the end).
	Page(ctx context.Context, after, upTo int64) ([]Event, int64, error)
	// Record records what the replay sent, once the broker confirmed it.
	Record(ctx context.Context, replayID, destination string, sent []Sent) error
}

// Pace is how fast a replay sends. At most one field is set; none sends
// as fast as the broker confirms.
type Pace struct {
	// Factor keeps the events' original spacing (their emit times),
	// divided by Factor: 1 is the original speed, 10 ten times faster.
	Factor float64
	// Delay puts this long between one send and the next.
	Delay time.Duration
	// Rate sends at most this many events a second.
	Rate float64
}

// Check says what is wrong with p.
func (p Pace) Check() error {
	set := 0
	for _, on := range []bool{p.Factor != 0, p.Delay != 0, p.Rate != 0} {
		if on {
			set++
		}
	}
	switch {
	case set > 1:
		return errors.New("replay pace: choose one of the original spacing (a factor), a delay, or a rate")
	case p.Factor < 0, p.Delay < 0, p.Rate < 0:
		return errors.New("replay pace: a factor, delay or rate must be positive")
	}
	return nil
}

// Options steer Run.
type Options struct {
	// ID is the replay's id, sent in x-replay-id and recorded.
	ID string
	// Queue sends every event to this queue only (a module's
	// <node>.<module>.events), through the default exchange; "" sends to
	// mesh.events.
	Queue string
	Pace  Pace
	// DryRun sends nothing: Listed gets each event that would go.
	DryRun bool
	Listed func(Event)
	// Progress, if set, is told how many of total were sent (or listed).
	Progress func(done, total int)
}

// Result says what a replay did.
type Result struct {
	ID string
	// Destination is mesh.events or the queue.
	Destination string
	// Cutoff is the Seq (a HistoryLog's: the stream offset) past which
	// nothing was replayed.
	Cutoff int64
	// Selected is how many events the selection held up to the cutoff,
	// and Sent how many were sent (0 in a dry run).
	Selected, Sent int
}

// window bounds the sends awaiting the broker's confirm.
const window = 256

// Run replays what log selects, up to the cutoff it takes at the start.
func Run(ctx context.Context, conn *amqp.Connection, log Log, o Options) (Result, error) {
	res := Result{ID: o.ID, Destination: wire.ExchangeEvents}
	if o.Queue != "" {
		res.Destination = o.Queue
	}
	if err := o.Pace.Check(); err != nil {
		return res, err
	}
	if o.ID == "" && !o.DryRun {
		return res, errors.New("replay: no replay id")
	}
	var err error
	if res.Cutoff, err = log.Cutoff(ctx); err != nil {
		return res, fmt.Errorf("replay: the log's cutoff: %w", err)
	}
	total, err := log.Count(ctx, res.Cutoff)
	if err != nil {
		return res, fmt.Errorf("replay: count the selection: %w", err)
	}
	progress := func(done int) {
		if o.Progress != nil {
			o.Progress(done, int(total))
		}
	}
	progress(0)
	var pub *publisher
	if !o.DryRun {
		user := amqpmsg.ConnUser(conn)
		if user == "" {
			return res, errors.New("replay: cannot tell the connection's broker user, which each replayed event names in its user-id (dial with a user in the URL: PLAIN)")
		}
		if o.Queue != "" {
			if err := queueExists(conn, o.Queue); err != nil {
				return res, err
			}
		}
		if pub, err = newPublisher(conn); err != nil {
			return res, err
		}
		pub.user = user
		defer pub.close()
	}
	pc := pacer{pace: o.Pace, sleep: sleepCtx, now: time.Now}
	for after := int64(0); ; {
		page, next, err := log.Page(ctx, after, res.Cutoff)
		if err != nil {
			return res, fmt.Errorf("replay: read the log after %d: %w", after, err)
		}
		for start := 0; start < len(page); start += window {
			chunk := page[start:min(start+window, len(page))]
			res.Selected += len(chunk)
			if o.DryRun {
				for _, ev := range chunk {
					if o.Listed != nil {
						o.Listed(ev)
					}
				}
				progress(res.Selected)
				continue
			}
			sent, err := pub.send(ctx, &pc, chunk, o.ID, o.Queue)
			if len(sent) > 0 {
				if rerr := log.Record(ctx, o.ID, res.Destination, sent); rerr != nil {
					return res, fmt.Errorf("replay %s: %d events sent but not recorded in the audit log: %w", o.ID, len(sent), rerr)
				}
				res.Sent += len(sent)
				progress(res.Sent)
			}
			if err != nil {
				return res, fmt.Errorf("replay %s: %w", o.ID, err)
			}
		}
		if next == 0 {
			return res, nil
		}
		after = next
	}
}

// message is what goes on the wire for ev: its recorded headers (the
// runtime's own x-mesh- bookkeeping left out), the replay's id, the
// original publisher's user in x-mesh-user-id, the replaying user as the
// user-id (the broker checks it: a replayed event says who replayed it),
// and the properties the contract asks for.
func message(ev Event, replayID, queue, user string) amqp.Publishing {
	headers := make(amqp.Table, len(ev.Headers)+3)
	for k, v := range ev.Headers {
		if strings.HasPrefix(k, "x-mesh-") || k == "content-type" {
			continue
		}
		headers[k] = v
	}
	headers[wire.HeaderReplayID] = replayID
	headers[wire.HeaderUserID] = ev.UserID
	if queue != "" {
		// The runtime reads the type from it on a direct send with a
		// user-id.
		headers[wire.HeaderRoutingKey] = ev.Type
	}
	return amqp.Publishing{Headers: headers, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent,
		MessageId: ev.ID, Timestamp: ev.Time, UserId: user, Body: ev.Body}
}
