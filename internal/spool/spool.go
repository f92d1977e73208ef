package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshkit/mesh/internal/stateformat"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Errors callers branch on with errors.Is. The errors the methods return
// wrap them with the spool's path and the numbers that matter.
var (
	// ErrFull is returned by Append when the record would take the sum of
	// the records' sizes past Options.MaxBytes. Nothing was stored. It is
	// transient: Append again once Delete has made room.
	ErrFull = errors.New("spool: full")

	// ErrLocked is returned by Open when the spool file is held by another
	// process (probably another meshd with the same state dir) and its lock
	// was not released within Options.LockTimeout, or when this process
	// already has it open.
	ErrLocked = errors.New("spool: locked")

	// ErrClosed is returned by Append, Oldest and Delete once Close has been
	// called. It is permanent.
	ErrClosed = errors.New("spool: closed")
)

// Defaults for the zero values of Options' fields.
const (
	// DefaultMaxBytes bounds the sum of the records' sizes: 256 MiB.
	DefaultMaxBytes int64 = 256 << 20
	// DefaultLockTimeout is how long Open waits for another process to
	// release the file.
	DefaultLockTimeout = time.Second
)

// Options configure Open. The zero value of each field takes its default.
type Options struct {
	// MaxBytes bounds the sum of the sizes of the records held; the file
	// itself is larger (bbolt's pages and free list). 0 means
	// DefaultMaxBytes (256 MiB).
	MaxBytes int64
	// LockTimeout is how long Open waits for another process holding the
	// file to release it before failing with ErrLocked. 0 means
	// DefaultLockTimeout (1s).
	LockTimeout time.Duration
}

// Validate reports the fields that break a rule, by name.
func (o Options) Validate() error {
	var errs []error
	if o.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("spool: MaxBytes: %d is negative", o.MaxBytes))
	}
	if o.LockTimeout < 0 {
		errs = append(errs, fmt.Errorf("spool: LockTimeout: %v is negative", o.LockTimeout))
	}
	return errors.Join(errs...)
}

// Record is one record held in the spool.
type Record struct {
	// Seq is the record's sequence number: 1 for the first record ever
	// appended to the file, higher for every later one, never reused.
	Seq uint64
	// Data is the record as appended. Oldest returns a copy the caller
	// owns.
	Data []byte
}

// bucketName names the bbolt bucket that holds the records, keyed by their
// Seq as 8 big-endian bytes so that bbolt's key order is Seq order. The
// bucket's own sequence (NextSequence) hands out the Seqs.
var bucketName = []byte("records")

// A Spool is a durable, bounded, ordered store of records in one file. Its
// methods are safe for concurrent use.
type Spool struct {
	path string // as given to Open, for error messages
	abs  string // absolute path, the key of openPaths
	max  int64
	db   *bolt.DB

	// closeMu is read-held by every method that touches db, so that Close
	// (which takes it for writing) waits for them and no method uses a
	// closed db.
	closeMu sync.RWMutex
	closed  bool

	// appending counts the Appends in progress. One alone commits at once
	// with db.Update; while others are in progress it joins them in a
	// db.Batch, so that they share one transaction and one fsync.
	appending atomic.Int32

	// mu guards count and size: the number and the sum of the sizes of the
	// records held. They are computed by a scan at Open and kept up to date
	// so that Append can check the bound without a scan:
	//   - Append adds its record inside the write transaction that stores
	//     it, after checking the bound. bbolt runs one write transaction at
	//     a time, so these checks run in commit order and the bound holds
	//     exactly. If the transaction is rolled back, Append takes its
	//     record out again.
	//   - Delete takes its records out after the commit.
	// Both can only count too much for a moment, never too little, so the
	// bound is never exceeded and count is never negative.
	mu    sync.Mutex
	count int
	size  int64
}

// batchDelay is how long a db.Batch waits for more Appends to join it
// before it commits (bbolt's default is 10ms). An Append alone does not wait
// at all (see Spool.appending); the others join a batch while the write
// transaction before theirs is being fsynced, which takes about a
// millisecond on an SSD. On the machine the benchmarks ran on, 64 goroutines
// appending got 235µs per Append with 10ms, 60µs with 1ms, and 2ms with 0
// (every batch then starts at once and holds few Appends).
const batchDelay = time.Millisecond

// openPaths holds the absolute paths of the spools open in this process.
// bbolt's flock would also refuse a second Open of the same file in the
// same process on Linux, but only after LockTimeout and with a message
// blaming another process.
var (
	openMu    sync.Mutex
	openPaths = map[string]bool{}
)

// Open opens the spool at path, creating the file (mode 0600) and its
// parent directories (mode 0700) if they do not exist, and counts the
// records it holds.
//
// If another process holds the file, Open waits up to opts.LockTimeout for
// it and then fails with an error wrapping ErrLocked. The same happens at
// once if this process already has the file open.
func Open(path string, opts Options) (*Spool, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}

	openMu.Lock()
	if openPaths[abs] {
		openMu.Unlock()
		return nil, fmt.Errorf("open spool %s: this process already has it open: %w", path, ErrLocked)
	}
	openPaths[abs] = true
	openMu.Unlock()
	s, err := open(path, abs, opts)
	if err != nil {
		openMu.Lock()
		delete(openPaths, abs)
		openMu.Unlock()
		return nil, err
	}
	return s, nil
}

func open(path, abs string, opts Options) (*Spool, error) {
	// The file's directory, and those MkdirAll creates, are fsynced below
	// (on every Open, in case an earlier one crashed before doing it):
	// without that a machine crash could lose a new file however often it
	// was synced.
	existing := filepath.Dir(abs)
	for {
		if _, err := os.Stat(existing); err == nil || filepath.Dir(existing) == existing {
			break
		}
		existing = filepath.Dir(existing)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	db, err := bolt.Open(abs, 0o600, &bolt.Options{Timeout: opts.LockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open spool %s: another process (probably another meshd with the same state dir) "+
			"holds it; its lock was not released within %v: %w", path, opts.LockTimeout, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	db.MaxBatchDelay = batchDelay
	s := &Spool{path: path, abs: abs, max: opts.MaxBytes, db: db}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := stateformat.Spool.CheckBolt(tx, path); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketName)
		if err != nil {
			return err
		}
		s.count, s.size = 0, 0
		return b.ForEach(func(_, v []byte) error {
			s.count++
			s.size += int64(len(v))
			return nil
		})
	})
	if err == nil {
		for dir := filepath.Dir(abs); err == nil; dir = filepath.Dir(dir) {
			err = syncDir(dir)
			if dir == existing {
				break
			}
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open spool %s: %w", path, err)
	}
	return s, nil
}

// syncDir fsyncs a directory, making the entries created in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Append stores data as the newest record and returns its Seq. It returns
// once the record is on disk (fsynced); a record appended after another
// Append returned gets a higher Seq. data may be empty; Append does not
// keep it after it returns.
//
// Appends made at the same time from several goroutines are committed
// together, sharing one fsync.
//
// If the record would take the sum of the records' sizes past
// Options.MaxBytes, Append stores nothing and returns an error wrapping
// ErrFull that says how full the spool is.
func (s *Spool) Append(data []byte) (seq uint64, err error) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return 0, fmt.Errorf("append to spool %s: %w", s.path, ErrClosed)
	}
	size := int64(len(data))
	// Refuse at once what cannot fit now, without a transaction. The check
	// that counts is the one inside the transaction below.
	s.mu.Lock()
	err = s.fits(size)
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}

	// bbolt may call fn more than once (db.Batch retries the others alone
	// when one fails), each time in a new transaction after rolling back
	// the last; counted says whether the record is in count and size.
	counted := false
	fn := func(tx *bolt.Tx) error {
		s.mu.Lock()
		if counted {
			s.count--
			s.size -= size
			counted = false
		}
		if err := s.fits(size); err != nil {
			s.mu.Unlock()
			return err
		}
		s.count++
		s.size += size
		counted = true
		s.mu.Unlock()

		b := tx.Bucket(bucketName)
		n, err := b.NextSequence()
		if err != nil {
			return err
		}
		if err := b.Put(seqKey(n), data); err != nil {
			return err
		}
		seq = n
		return nil
	}
	if s.appending.Add(1) == 1 {
		err = s.db.Update(fn)
	} else {
		err = s.db.Batch(fn)
	}
	s.appending.Add(-1)

	if err != nil {
		if counted {
			s.mu.Lock()
			s.count--
			s.size -= size
			s.mu.Unlock()
		}
		if errors.Is(err, ErrFull) {
			return 0, err
		}
		return 0, fmt.Errorf("append to spool %s: %w", s.path, err)
	}
	return seq, nil
}

// fits returns an error wrapping ErrFull if a record of size bytes does not
// fit. s.mu must be held.
func (s *Spool) fits(size int64) error {
	if s.size+size > s.max {
		return fmt.Errorf("append to spool %s: a %d-byte record does not fit: %d of %d bytes held: %w",
			s.path, size, s.size, s.max, ErrFull)
	}
	return nil
}

// Oldest returns up to n of the oldest records, in Seq order: fewer if the
// spool holds fewer, none if n <= 0. The records' Data are copies the caller
// may keep and modify.
func (s *Spool) Oldest(n int) ([]Record, error) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("read spool %s: %w", s.path, ErrClosed)
	}
	if n <= 0 {
		return nil, nil
	}
	recs := make([]Record, 0, min(n, s.Len()))
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketName).Cursor()
		for k, v := c.First(); k != nil && len(recs) < n; k, v = c.Next() {
			data := make([]byte, len(v))
			copy(data, v)
			recs = append(recs, Record{Seq: binary.BigEndian.Uint64(k), Data: data})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read spool %s: %w", s.path, err)
	}
	return recs, nil
}

// Delete removes the records with the given Seqs; Seqs it does not hold
// are ignored. It returns once the removal is on disk (fsynced).
func (s *Spool) Delete(seqs ...uint64) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return fmt.Errorf("delete from spool %s: %w", s.path, ErrClosed)
	}
	if len(seqs) == 0 {
		return nil
	}
	var count int
	var size int64
	err := s.db.Update(func(tx *bolt.Tx) error {
		count, size = 0, 0
		c := tx.Bucket(bucketName).Cursor()
		for _, seq := range seqs {
			key := seqKey(seq)
			// Seek, not Get: it tells an empty record from a missing one.
			k, v := c.Seek(key)
			if !bytes.Equal(k, key) {
				continue
			}
			if err := c.Delete(); err != nil {
				return err
			}
			count++
			size += int64(len(v))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete from spool %s: %w", s.path, err)
	}
	s.mu.Lock()
	s.count -= count
	s.size -= size
	s.mu.Unlock()
	return nil
}

// Len returns the number of records held. It is kept in memory and cheap.
// While Appends and Deletes are in progress it may count a record whose
// Append has not returned yet or whose Delete has not.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Bytes returns the sum of the sizes of the records held, counted like Len.
func (s *Spool) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Close waits for the calls in progress, then closes the file and releases
// its lock. Calling it again does nothing and returns nil; Append, Oldest
// and Delete called after it return an error wrapping ErrClosed. Len and
// Bytes keep returning the last counts.
func (s *Spool) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.db.Close()
	openMu.Lock()
	delete(openPaths, s.abs)
	openMu.Unlock()
	if err != nil {
		return fmt.Errorf("close spool %s: %w", s.path, err)
	}
	return nil
}

func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}
