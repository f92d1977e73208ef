package console

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshkit/mesh/internal/deadletters"
)

// KeptQuery is what Mesh.Kept reads of a keeper queue.
type KeptQuery struct {
	// Filter selects the messages.
	Filter deadletters.Filter
	// Limit bounds the messages read (deadletters.WithLimit); 0 reads
	// them all.
	Limit int
	// Summaries keeps of each message its fields alone, no headers nor
	// body (deadletters.Summaries): what a page of groups shows.
	Summaries bool
	// Body, when positive and not Summaries, bounds what is kept of each
	// body (deadletters.WithBodyLimit); 0 keeps each body whole.
	Body int
	// Progress, when not nil, hears how many messages were read of how
	// many (deadletters.WithProgress).
	Progress func(read, total int)
}

// Options are the deadletters options that read what q says, for an
// implementation of Mesh.Kept with deadletters.List.
func (q KeptQuery) Options() []deadletters.Option {
	opts := []deadletters.Option{deadletters.WithLimit(q.Limit)}
	switch {
	case q.Summaries:
		opts = append(opts, deadletters.Summaries())
	case q.Body > 0:
		opts = append(opts, deadletters.WithBodyLimit(q.Body))
	}
	if q.Progress != nil {
		opts = append(opts, deadletters.WithProgress(q.Progress))
	}
	return opts
}

// key is q as a key of the reads shared.
func (q KeptQuery) key() string {
	f := q.Filter
	return strings.Join([]string{f.Module, f.Node, f.Type, f.OlderThan.String(), f.NewerThan.String(), strings.Join(f.IDs, "\x01"), f.Queue,
		strconv.Itoa(q.Limit), strconv.FormatBool(q.Summaries), strconv.Itoa(q.Body)}, "\x00")
}

// The bounds of the reads of the keeper queues.
const (
	// keptFresh is how long what a read found is shown to the pages
	// that ask the same of the same queue.
	keptFresh = 5 * time.Second
	// keptReadTimeout bounds a read: a queue of gigabytes takes a minute
	// (the broker sends every body, about 200 MB/s on one machine). A
	// page waits for it askTimeout at most, then says it is still read
	// (503); reloaded, it waits again for the same read.
	keptReadTimeout = 5 * time.Minute
	// maxBrowses bounds the reads of the keeper queues running at once;
	// browseWait is how long another waits for its turn before its page
	// is refused (503).
	maxBrowses = 2
	browseWait = 10 * time.Second
	// maxReads bounds the reads remembered (their pages' keys: a keeper
	// queue's groups, one message's page).
	maxReads = 8
)

// Why a page of a keeper queue is refused for now (503): it may be asked
// again in a moment.
var (
	errBrowsesBusy = fmt.Errorf("%d reads of the keeper queues are running, and this page waited %v for its turn: try again in a moment", maxBrowses, browseWait)
	errActing      = errors.New("a replay or purge of the queue is running, and no page reads a queue while it does (each would hide messages from the other)")
	errStillRead   = errors.New("still reading the queue")
)

// browses are the console's reads (browses) of the keeper queues,
// shared by the pages and kept out of the way of the replays and purges.
//
// A read is deadletters.List: it consumes the queue, holding every message
// unacknowledged until it has read to the end (a message given back at
// once would be delivered to it again), then gives them all back with one
// basic.nack (requeue) and closes its channel, before the page is drawn.
// It keeps of each message only what the page shows (summaries for the
// groups, a bounded preview of one body), so no page holds the queue's
// bodies.
//
//   - Shared: the pages that ask the same of the same queue while a read
//     runs wait for it, and those that ask within keptFresh after it
//     ended are shown what it read (its time is on the page). A group's
//     page after its queue's page reads nothing.
//   - Bounded: at most maxBrowses reads run at once; another waits up to
//     browseWait for its turn, then its page is refused (503, saying so).
//     A read runs for keptReadTimeout at most; a page waits for it
//     askTimeout at most, then says how far it got (503), and the read
//     goes on for the page reloaded.
//   - A replay or a purge started from the console waits for the reads
//     of its queue running to end, and no read of that queue starts
//     while it runs: a page of it is shown what was read within
//     keptFresh, or refused (503, saying a replay or purge runs). So a
//     replay never misses a message because a page holds it, nor does a
//     page miss one because a replay holds it. The replays and purges of
//     one queue take turns too, for the same reason. When one ends, what
//     was read of its queue is forgotten: the next page reads it again.
//
// Another process (meshctl dlq, a second console) reading the same queue
// still contends with these: each sees only what the other does not
// hold.
type browses struct {
	mesh  Mesh
	now   func() time.Time
	slots chan struct{} // a token per read running
	wait  time.Duration // browseWait; tests shorten it
	// work is the context of the shared reads, which outlive the page
	// that began them (other pages wait for them too); working counts
	// them, for Server.Close.
	work    context.Context
	working *sync.WaitGroup

	mu     sync.Mutex
	reads  map[string]*read // by queue and query
	queues map[string]*gate // by queue
}

// read is one read of a keeper queue, running or done.
type read struct {
	queue string
	done  chan struct{} // closed when msgs, err and at are set
	msgs  []deadletters.Message
	err   error
	at    time.Time // when it ended
	// read and total are its progress: messages read, of how many.
	read, total atomic.Int64
}

// gate is who reads and acts on one keeper queue.
type gate struct {
	browsing int           // reads of the queue begun (waiting for a slot or running) and not ended
	acting   bool          // a replay or purge of the queue runs
	waiting  int           // replays and purges waiting for their turn
	changed  chan struct{} // closed (and made anew) when browsing drops or acting ends
}

func newBrowses(m Mesh, now func() time.Time, work context.Context, working *sync.WaitGroup) *browses {
	return &browses{mesh: m, now: now, slots: make(chan struct{}, maxBrowses), wait: browseWait, work: work, working: working,
		reads: map[string]*read{}, queues: map[string]*gate{}}
}

// gate is queue's gate; b.mu is held.
func (b *browses) gate(queue string) *gate {
	g, ok := b.queues[queue]
	if !ok {
		g = &gate{changed: make(chan struct{})}
		b.queues[queue] = g
	}
	return g
}

// signal wakes those waiting for g to change; b.mu is held.
func (g *gate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// get reads queue as q says, or is given what a read of the same began
// or ended within keptFresh found; at is when that read ended. A page
// that stops waiting does not stop a read that others may wait for.
func (b *browses) get(ctx context.Context, queue string, q KeptQuery) (msgs []deadletters.Message, at time.Time, err error) {
	key := queue + "\x00" + q.key()
	b.mu.Lock()
	b.forget()
	r, ok := b.reads[key]
	if !ok {
		if r, err = b.begin(queue); err != nil {
			b.mu.Unlock()
			return nil, time.Time{}, err
		}
		b.reads[key] = r
		b.working.Add(1)
		go func() {
			defer b.working.Done()
			rctx, cancel := context.WithTimeout(b.work, keptReadTimeout)
			defer cancel()
			b.run(rctx, key, r, q)
		}()
	}
	b.mu.Unlock()
	select {
	case <-r.done:
		return r.msgs, r.at, r.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, time.Time{}, fmt.Errorf("%w %s: %d of its %d messages read; the read goes on, and this page shows it when reloaded",
				errStillRead, queue, r.read.Load(), r.total.Load())
		}
		return nil, time.Time{}, ctx.Err()
	}
}

// getOwn reads queue as q says for this request alone: what it keeps is
// not shown to another page (one whole body).
func (b *browses) getOwn(ctx context.Context, queue string, q KeptQuery) ([]deadletters.Message, error) {
	b.mu.Lock()
	r, err := b.begin(queue)
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	b.run(ctx, "", r, q)
	return r.msgs, r.err
}

// begin begins a read of queue, unless a replay or purge of it runs or
// waits; b.mu is held.
func (b *browses) begin(queue string) (*read, error) {
	g := b.gate(queue)
	if g.acting || g.waiting > 0 {
		return nil, fmt.Errorf("%s: %w", queue, errActing)
	}
	g.browsing++
	return &read{queue: queue, done: make(chan struct{})}, nil
}

// run waits for a slot and reads; then it ends r (forgetting it, under
// key, if it failed: the next page tries again).
func (b *browses) run(ctx context.Context, key string, r *read, q KeptQuery) {
	q.Progress = func(read, total int) { r.read.Store(int64(read)); r.total.Store(int64(total)) }
	if r.err = b.slot(ctx); r.err == nil {
		r.msgs, r.err = b.mesh.Kept(ctx, r.queue, q)
		<-b.slots
	}
	b.mu.Lock()
	r.at = b.now()
	if r.err != nil && key != "" && b.reads[key] == r {
		delete(b.reads, key)
	}
	g := b.gate(r.queue)
	g.browsing--
	g.signal()
	b.mu.Unlock()
	close(r.done)
}

// slot takes a slot for a read: one free, or the first freed within
// b.wait.
func (b *browses) slot(ctx context.Context) error {
	select {
	case b.slots <- struct{}{}:
		return nil
	default:
	}
	if b.wait <= 0 {
		return errBrowsesBusy
	}
	t := time.NewTimer(b.wait)
	defer t.Stop()
	select {
	case b.slots <- struct{}{}:
		return nil
	case <-t.C:
		return errBrowsesBusy
	case <-ctx.Done():
		return ctx.Err()
	}
}

// forget drops the reads that ended more than keptFresh ago, and the
// oldest ended while more than maxReads are remembered; b.mu is held.
func (b *browses) forget() {
	now := b.now()
	for k, r := range b.reads {
		if !r.at.IsZero() && now.Sub(r.at) > keptFresh {
			delete(b.reads, k)
		}
	}
	for len(b.reads) >= maxReads {
		oldest := ""
		for k, r := range b.reads {
			if !r.at.IsZero() && (oldest == "" || r.at.Before(b.reads[oldest].at)) {
				oldest = k
			}
		}
		if oldest == "" {
			return // all still running: they hold nothing yet
		}
		delete(b.reads, oldest)
	}
}

// act waits for the turn of a replay or purge of queue: no read of it
// running, nor another replay or purge; no read of it begins from the
// call on. waiting is called once if it has to wait. done ends the turn
// and forgets what was read of the queue.
func (b *browses) act(ctx context.Context, queue string, waiting func()) (done func(), err error) {
	b.mu.Lock()
	g := b.gate(queue)
	g.waiting++
	told := false
	for g.browsing > 0 || g.acting {
		if !told && waiting != nil {
			told = true
			waiting()
		}
		changed := g.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			b.mu.Lock()
			g.waiting--
			g.signal()
			b.mu.Unlock()
			return nil, ctx.Err()
		}
		b.mu.Lock()
	}
	g.waiting--
	g.acting = true
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		g.acting = false
		for k, r := range b.reads {
			if r.queue == queue {
				delete(b.reads, k)
			}
		}
		g.signal()
	}, nil
}
