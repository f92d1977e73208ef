package dedup

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Errors callers branch on.
var (
	// ErrInvalidID is wrapped by the error of Seen and Record for an event
	// id that is not a ULID (26 characters of Crockford base32). It is
	// permanent: the same id is refused every time.
	ErrInvalidID = errors.New("dedup: event id is not a ULID")

	// ErrClosed is returned by Seen and Record after Close.
	ErrClosed = errors.New("dedup: closed")

	// ErrFormat is wrapped by the error of Open when the file exists but
	// does not start with the header of a dedup log of a version this
	// package reads. The file is left untouched: remove it (the cost is
	// possible duplicate runs of handlers) or fix the path.
	ErrFormat = errors.New("dedup: not a dedup log")
)

// Defaults for [Options].
const (
	DefaultRetention  = 24 * time.Hour
	DefaultMaxEntries = 1_000_000
)

const (
	// defaultCompactMin is the number of log records below which the log
	// is never compacted.
	defaultCompactMin = 64 << 10

	// purgeBatch is how many expired entries Record forgets at most per
	// call, so that an idle period followed by traffic does not pause one
	// Record for the whole backlog.
	purgeBatch = 64
)

// Options configure a [Set]. The zero value is valid: every zero field
// takes its default.
type Options struct {
	// Retention is how long an id is remembered after it was recorded.
	// Default DefaultRetention (24h).
	Retention time.Duration

	// MaxEntries bounds the number of ids held; beyond it, the ids
	// recorded first are forgotten first. Default DefaultMaxEntries.
	MaxEntries int

	// Now returns the current time. Default time.Now; tests set a fake
	// clock. It must be safe for concurrent use.
	Now func() time.Time

	// Logger receives warnings that have no caller to return to (a failed
	// compaction inside Record, whose record was written). Default
	// slog.Default().
	Logger *slog.Logger

	// compactMin overrides defaultCompactMin, for tests.
	compactMin int
	// compactWritten, if set, is called by a background compaction once
	// the new file is written, before it takes the lock to swap the
	// files: tests hold it there to record meanwhile.
	compactWritten func()
}

// Validate checks the options, naming the field and the rule of every error
// it finds. Zero fields take their defaults and are valid.
func (o Options) Validate() error {
	var errs []error
	if o.Retention < 0 {
		errs = append(errs, fmt.Errorf("retention: %v is negative", o.Retention))
	}
	if o.MaxEntries < 0 {
		errs = append(errs, fmt.Errorf("max_entries: %d is negative", o.MaxEntries))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.compactMin <= 0 {
		o.compactMin = defaultCompactMin
	}
	return o
}

// Set is the record of the event ids one module handled, in memory and in an
// append-only log file. Create it with [Open]; it is safe for concurrent use.
type Set struct {
	path string
	opts Options

	mu     sync.Mutex
	closed bool
	f      *os.File
	ids    map[ulid.ULID]held // id -> when it was recorded, and its digest
	order  queue              // ids in record order, with their times
	stale  int                // entries of order superseded by a later entry of their id
	end    int64              // file offset of the next record
	count  int                // records in the file, valid or not
	retry  int                // count below which a failed compaction is not retried
	buf    [recordSize]byte
	// pending holds the records of ids added (Add) and not yet written,
	// in order.
	pending []byte

	// digests is the digest file beside the log (digests.go).
	digests digestFile

	// compacting is closed when the compaction running in the background
	// ends; nil when none runs.
	compacting chan struct{}
}

// Open opens the log at path, creating it (mode 0o600, parent directories
// 0o700) if it does not exist, and loads the ids recorded within the
// retention window. It cuts off a torn or invalid end of the file, and
// compacts the log if it holds more than twice as many records as live ids.
// Only one Set can have a file open at a time.
func Open(path string, opts Options) (*Set, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("dedup: options: %w", err)
	}
	opts = opts.withDefaults()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("dedup: create dir: %w", err)
	}
	f, err := openLocked(path)
	if err != nil {
		return nil, fmt.Errorf("dedup: open %s: %w", path, err)
	}
	s := &Set{path: path, opts: opts, f: f}
	if err := s.load(); err != nil {
		f.Close()
		return nil, fmt.Errorf("dedup: open %s: %w", path, err)
	}
	removeStaleTemps(path)
	if s.needsCompaction() {
		if err := s.compact(s.opts.Now().UnixNano()); err != nil {
			s.opts.Logger.Warn("dedup: compact log", "path", path, "err", err)
			s.retry = s.count + s.opts.compactMin
		}
	}
	return s, nil
}

// Seen reports whether id was recorded within the retention window,
// whatever its digest. The error wraps ErrInvalidID if id is not a ULID,
// and is ErrClosed after Close.
func (s *Set) Seen(id string) (bool, error) {
	v, _, err := s.Check(id, NoDigest)
	return v != New, err
}

// Verdict is what [Set.Check] found of an id.
type Verdict int

// Verdicts of [Set.Check].
const (
	// New: the id is not recorded (or its record expired).
	New Verdict = iota
	// Duplicate: the id is recorded with the same digest, or one of the
	// two digests is unknown (NoDigest: recorded by v0.1.0, or checked
	// without one).
	Duplicate
	// Conflict: the id is recorded with another digest: the same id
	// with other content.
	Conflict
)

// String returns "new", "duplicate" or "conflict".
func (v Verdict) String() string {
	switch v {
	case New:
		return "new"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// NoDigest is the digest of an id recorded without one (by v0.1.0, whose
// log has no digests, or by a caller that passes none): it matches every
// digest, so such an id is a duplicate, never a conflict.
const NoDigest uint64 = 0

// Check reports whether id was recorded within the retention window and,
// if so, whether with digest: the recorded digest is returned beside a
// Conflict, to name it. The error wraps ErrInvalidID if id is not a ULID,
// and is ErrClosed after Close.
func (s *Set) Check(id string, digest uint64) (v Verdict, recorded uint64, err error) {
	u, err := parseID(id)
	if err != nil {
		return New, NoDigest, err
	}
	cutoff := s.cutoff(s.opts.Now().UnixNano())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return New, NoDigest, ErrClosed
	}
	h, ok := s.ids[u]
	s.mu.Unlock()
	switch {
	case !ok || h.at <= cutoff:
		return New, NoDigest, nil
	case h.digest == NoDigest || digest == NoDigest || h.digest == digest:
		return Duplicate, h.digest, nil
	}
	return Conflict, h.digest, nil
}

// Record records that id was handled, with digest, a digest of the
// content handled (NoDigest if the caller has none). It is idempotent: an
// id already held is not written again, and keeps the digest it was
// recorded with. Otherwise it writes the digest's record to the digest
// file and the id's to the log, one write(2) each, without fsync, and then
// adds id to memory, so that once Record returned the id survives a crash
// of the process (see the package doc on power loss). The error wraps
// ErrInvalidID if id is not a ULID, is ErrClosed after Close, and
// otherwise is a write error, after which id is not recorded.
//
// Record is [Set.Add] and [Set.Flush] in one, for a caller that writes
// one id at a time.
func (s *Set) Record(id string, digest uint64) error {
	u, err := parseID(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	now := s.opts.Now().UnixNano()
	prev, wasHeld := s.ids[u]
	if wasHeld && prev.at > s.cutoff(now) {
		return s.flushLocked() // it may be held but not written yet (Add)
	}
	if err := s.flushLocked(); err != nil {
		return err // what was added before goes first
	}
	// The digest first: a digest without its id in the log is never
	// read, an id without its digest is taken for a duplicate.
	if err := s.digests.write(u, digest); err != nil {
		return fmt.Errorf("dedup: record %s: %w", id, err)
	}
	encodeRecord(s.buf[:], u, now)
	if _, err := s.f.WriteAt(s.buf[:], s.end); err != nil {
		// The next record is written at the same offset, over whatever
		// part of this one reached the file.
		return fmt.Errorf("dedup: record %s: %w", id, err)
	}
	s.add(u, held{at: now, digest: digest}, wasHeld) // before a compaction wrote may start copies memory
	s.wrote(1, now)
	return nil
}

// Add records that id was handled in memory at once, so that Seen reports
// it from now on, and keeps its record to write to the log with the next
// [Set.Flush] (or Record, or Close): a caller that handles many events
// writes their records with one write(2) where Record would make one each.
// Until that write, a crash of the process forgets id: the caller must not
// take the step that makes a repeat of the event unlikely to be noticed
// otherwise (the runtime: acknowledging the delivery) before Flush
// returned nil. It is idempotent like Record, and keeps digest as Record
// does. The error wraps ErrInvalidID if id is not a ULID, and is ErrClosed
// after Close; Add does no I/O.
func (s *Set) Add(id string, digest uint64) error {
	u, err := parseID(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	now := s.opts.Now().UnixNano()
	prev, wasHeld := s.ids[u]
	if wasHeld && prev.at > s.cutoff(now) {
		return nil
	}
	n := len(s.pending)
	s.pending = append(s.pending, make([]byte, recordSize)...)
	encodeRecord(s.pending[n:], u, now)
	s.digests.add(u, digest)
	s.add(u, held{at: now, digest: digest}, wasHeld)
	return nil
}

// Flush writes the records of the ids added since the last write, with one
// write(2), without fsync. After an error (the disk is full, say) the
// records are still kept to write, and the next Flush tries again; the ids
// stay in memory meanwhile. It is ErrClosed after Close, and nil when
// nothing waits to be written.
func (s *Set) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.flushLocked()
}

// flushLocked is Flush; the caller holds s.mu.
func (s *Set) flushLocked() error {
	if len(s.pending) == 0 {
		return nil
	}
	// The digests first, as in Record.
	if err := s.digests.flush(); err != nil {
		return fmt.Errorf("dedup: write %d records: %w", len(s.pending)/recordSize, err)
	}
	if _, err := s.f.WriteAt(s.pending, s.end); err != nil {
		// The next write starts at the same offset, over whatever part of
		// this one reached the file.
		return fmt.Errorf("dedup: write %d records: %w", len(s.pending)/recordSize, err)
	}
	n := len(s.pending) / recordSize
	s.pending = s.pending[:0]
	s.wrote(n, s.opts.Now().UnixNano())
	return nil
}

// wrote accounts for n records just written at the log's end, then
// forgets a few expired ids and starts a compaction if one is due. The
// caller holds s.mu.
func (s *Set) wrote(n int, now int64) {
	s.end += int64(n) * recordSize
	s.count += n
	s.purge(now, purgeBatch)
	if s.needsCompaction() {
		s.compactInBackground(now)
	}
}

// compactChunk is how many entries a background compaction copies per
// hold of the lock.
const compactChunk = 16 << 10

// compactInBackground starts a compaction whose work happens on its own
// goroutine, so Seen and Record go on meanwhile: it copies the live
// entries recorded so far, compactChunk at a time under the lock (an
// entry forgotten meanwhile is left out), rewrites the file without the
// lock, then swaps the files under the lock, with the records written
// meanwhile copied over. The caller holds s.mu.
func (s *Set) compactInBackground(now int64) {
	first, end := s.order.popped, s.order.popped+uint64(s.order.len())
	from, cutoff := s.end, s.cutoff(now)
	dgFrom := s.digests.end
	done := make(chan struct{})
	s.compacting = done
	go func() {
		defer close(done)
		snap := make([]live, 0, end-first)
		for pos := first; pos < end; pos += compactChunk {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				break
			}
			head := s.order.popped
			for p := max(pos, head); p < min(pos+compactChunk, end); p++ {
				if e := s.order.at(int(p - head)); e.at > cutoff && !s.isStale(e) {
					snap = append(snap, s.liveOf(e))
				}
			}
			s.mu.Unlock()
		}
		tmp, err := s.writeCompacted(snap)
		if s.opts.compactWritten != nil {
			s.opts.compactWritten()
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.compacting = nil
		switch {
		case err == nil && s.closed:
			tmp.abandon(nil)
			return
		case err == nil:
			err = s.compactFinish(tmp, len(snap), from, dgFrom)
		}
		if err != nil && !s.closed {
			// The records were written to the old log: report the
			// compaction here and try again after compactMin more
			// records.
			s.opts.Logger.Warn("dedup: compact log", "path", s.path, "err", err)
			s.retry = s.count + s.opts.compactMin
		}
	}()
}

// waitCompaction returns once no compaction runs in the background.
func (s *Set) waitCompaction() {
	s.mu.Lock()
	done := s.compacting
	s.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Len returns the number of ids held within the retention window. It
// forgets the expired ones first, so it costs time proportional to their
// number; it is meant for metrics and tests, not the hot path. If the clock
// stepped back, ids that expired behind a live one are still counted until
// the next compaction. After Close it returns 0.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0
	}
	s.purge(s.opts.Now().UnixNano(), -1)
	return len(s.ids)
}

// Close writes the records still to write (Add), syncs and closes the log
// and releases the memory. It is
// idempotent: a second Close returns nil.
func (s *Set) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.waitCompaction() // it sees closed and drops its file
	s.mu.Lock()
	defer s.mu.Unlock()
	ferr := s.flushLocked()
	s.ids, s.order, s.stale, s.pending = nil, queue{}, 0, nil
	serr := s.f.Sync()
	cerr := s.f.Close()
	derr := s.digests.close()
	if err := errors.Join(ferr, serr, cerr, derr); err != nil {
		return fmt.Errorf("dedup: close %s: %w", s.path, err)
	}
	return nil
}

// parseID returns the binary form of a ULID event id.
func parseID(id string) (ulid.ULID, error) {
	u, err := ulid.ParseStrict(id)
	if err != nil {
		shown := id
		if len(shown) > 40 {
			shown = shown[:40] + "..."
		}
		return u, fmt.Errorf("%w: %q: %w", ErrInvalidID, shown, err)
	}
	return u, nil
}

// cutoff returns the recording time at or before which an id has expired
// at now.
func (s *Set) cutoff(now int64) int64 {
	r := int64(s.opts.Retention)
	if now < minInt64+r {
		return minInt64
	}
	return now - r
}

const minInt64 = -1 << 63

// held is what memory keeps of a recorded id.
type held struct {
	at     int64  // when it was recorded, unix ns
	digest uint64 // NoDigest if unknown
}

// add puts id, recorded as h, into memory and forgets the ids recorded
// first beyond MaxEntries. If the map held id already (an expired entry),
// its earlier entry in the record order becomes stale: the map no longer
// holds its time.
func (s *Set) add(id ulid.ULID, h held, wasHeld bool) {
	if wasHeld {
		s.stale++
	}
	s.ids[id] = h
	s.order.push(entry{id: id, at: h.at})
	for len(s.ids) > s.opts.MaxEntries {
		s.popFront()
	}
}

// isStale reports whether e was superseded by a later entry of its id. It
// looks at the map only if there are stale entries at all, which is rare (an
// id recorded again after it expired).
func (s *Set) isStale(e entry) bool {
	if s.stale == 0 {
		return false
	}
	h, ok := s.ids[e.id]
	return !ok || h.at != e.at
}

// popFront removes the first entry of the record order, and its id from
// the map unless the entry is stale.
func (s *Set) popFront() {
	e := s.order.front()
	s.order.pop()
	if s.isStale(e) {
		s.stale--
		return
	}
	delete(s.ids, e.id)
}

// purge forgets expired and stale entries from the front of the record
// order, at most limit of them (all if limit < 0). It stops at the first
// live entry: if the clock stepped back, an expired id behind it stays in
// memory (Seen treats it as absent) until compaction.
func (s *Set) purge(now int64, limit int) {
	cutoff := s.cutoff(now)
	for ; limit != 0 && s.order.len() > 0; limit-- {
		if e := s.order.front(); e.at > cutoff && !s.isStale(e) {
			return
		}
		s.popFront()
	}
}

// needsCompaction reports whether the log holds more than twice as many
// records as live ids, and enough records to be worth it.
func (s *Set) needsCompaction() bool {
	return s.compacting == nil && s.count > s.opts.compactMin && s.count > 2*len(s.ids) && s.count >= s.retry
}
