package dedup

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/oklog/ulid/v2"

	"github.com/meshkit/mesh/internal/stateformat"
)

// The log file: header, then records of recordSize bytes at aligned offsets
// (see the package doc).
const (
	headerSize = 8
	recordSize = 16 + 8 + 4
)

// header starts every log: a magic and the format version
// (stateformat.DedupLog, 1).
var header = [headerSize]byte{'M', 'E', 'S', 'H', 'D', 'D', 'P', byte(stateformat.DedupLog.Version)}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeRecord writes the record of id recorded at into b.
func encodeRecord(b []byte, id ulid.ULID, at int64) {
	_ = b[recordSize-1]
	copy(b[:16], id[:])
	binary.LittleEndian.PutUint64(b[16:24], uint64(at))
	binary.LittleEndian.PutUint32(b[24:28], crc32.Checksum(b[:24], castagnoli))
}

// decodeRecord returns the id and time of the record in b, and whether its
// checksum matches.
func decodeRecord(b []byte) (id ulid.ULID, at int64, ok bool) {
	_ = b[recordSize-1]
	if binary.LittleEndian.Uint32(b[24:28]) != crc32.Checksum(b[:24], castagnoli) {
		return id, 0, false
	}
	copy(id[:], b[:16])
	return id, int64(binary.LittleEndian.Uint64(b[16:24])), true
}

// openLocked opens (or creates) the file at path and takes an exclusive
// lock on it. If the file was replaced (a compaction renamed a new one over
// it) between the open and the lock, it opens the new one.
func openLocked(path string) (*os.File, error) {
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := lockFile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock (is another Set using it?): %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		pi, err := os.Stat(path)
		if err == nil && os.SameFile(fi, pi) {
			return f, nil
		}
		f.Close()
	}
	return nil, errors.New("the file keeps being replaced")
}

// load reads the log into memory: it checks the header (writing it to a new
// file), loads the valid records recorded within the retention window and
// cuts off invalid records and a partial record at the end.
func (s *Set) load() error {
	fi, err := s.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size < headerSize {
		// A new file, or one whose creation was torn before the header
		// reached the disk.
		got := make([]byte, size)
		if _, err := s.f.ReadAt(got, 0); err != nil {
			return fmt.Errorf("read header: %w", err)
		}
		if !bytes.HasPrefix(header[:], got) {
			return fmt.Errorf("%w: %d bytes that do not start with the header", ErrFormat, size)
		}
		if _, err := s.f.WriteAt(header[:], 0); err != nil {
			return fmt.Errorf("write header: %w", err)
		}
		// Make the header durable once, so that a power loss cannot
		// leave a log whose records have no header.
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync header: %w", err)
		}
		if err := syncDir(filepath.Dir(s.path)); err != nil {
			return fmt.Errorf("sync dir: %w", err)
		}
		s.ids = make(map[ulid.ULID]held)
		s.end = headerSize
		return s.digests.open(digestsPath(s.path), nil)
	}
	var h [headerSize]byte
	if _, err := s.f.ReadAt(h[:], 0); err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	if h != header {
		if bytes.Equal(h[:headerSize-1], header[:headerSize-1]) && int(h[headerSize-1]) > stateformat.DedupLog.Version {
			// A later release's log, before a rollback: left as it is.
			return fmt.Errorf("%w: %w", ErrFormat, stateformat.DedupLog.Check(s.path, int(h[headerSize-1])))
		}
		return fmt.Errorf("%w: header %q, want %q", ErrFormat, h[:], header[:])
	}

	n := (size - headerSize) / recordSize
	s.ids = make(map[ulid.ULID]held, min(n, int64(s.opts.MaxEntries)))
	s.order = newQueue(int(min(n, int64(s.opts.MaxEntries)+1)))
	cutoff := s.cutoff(s.opts.Now().UnixNano())
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, headerSize, n*recordSize), 1<<20)
	var rec [recordSize]byte
	good := int64(0) // records up to and including the last valid one
	for i := int64(0); i < n; i++ {
		if _, err := io.ReadFull(r, rec[:]); err != nil {
			return fmt.Errorf("read record %d: %w", i, err)
		}
		id, at, ok := decodeRecord(rec[:])
		if !ok {
			continue // skip it: the records after it are still aligned
		}
		good = i + 1
		if at <= cutoff {
			continue
		}
		prev, wasHeld := s.ids[id]
		if wasHeld && prev.at == at {
			continue // the same record twice: keep one entry
		}
		s.add(id, held{at: at}, wasHeld)
	}
	s.end = headerSize + good*recordSize
	s.count = int(good)
	if s.end < size {
		if err := s.f.Truncate(s.end); err != nil {
			return fmt.Errorf("cut off torn end: %w", err)
		}
	}
	// The digests of the ids just loaded; those of ids the log no longer
	// holds are dropped.
	return s.digests.open(digestsPath(s.path), func(id ulid.ULID, digest uint64) {
		if h, ok := s.ids[id]; ok {
			h.digest = digest
			s.ids[id] = h
		}
	})
}

// compact rewrites the log with only the live ids, synchronously (Open,
// and tests): see compactStart and compactFinish. The caller holds s.mu or
// is the only user of s.
func (s *Set) compact(now int64) error {
	s.prune(now)
	snap, from := s.compactStart(now)
	dgFrom := s.digests.end
	tmp, err := s.writeCompacted(snap)
	if err != nil {
		return err
	}
	return s.compactFinish(tmp, len(snap), from, dgFrom)
}

// prune drops the stale and expired entries from memory, wherever they
// are in the record order (purge stops at the first live one). The caller
// holds s.mu.
func (s *Set) prune(now int64) {
	cutoff := s.cutoff(now)
	s.order.filter(func(e entry) bool {
		if s.isStale(e) {
			return false
		}
		if e.at <= cutoff {
			delete(s.ids, e.id)
			return false
		}
		return true
	})
	s.stale = 0
}

// compactStart returns a copy of the live entries, oldest first, and the
// log's end now (compactFinish copies the records written after it). It
// is one pass over memory, with no I/O; the caller holds s.mu. A
// background compaction copies the same in chunks instead.
func (s *Set) compactStart(now int64) (snap []live, from int64) {
	cutoff := s.cutoff(now)
	snap = make([]live, 0, s.order.len())
	if s.stale == 0 {
		s.order.each(func(e entry) {
			if e.at > cutoff {
				snap = append(snap, s.liveOf(e))
			}
		})
	} else {
		s.order.each(func(e entry) {
			if e.at > cutoff && !s.isStale(e) {
				snap = append(snap, s.liveOf(e))
			}
		})
	}
	return snap, s.end
}

// live is an entry a compaction keeps, with its digest.
type live struct {
	entry
	digest uint64
}

// liveOf is e, a live entry, with its digest. The caller holds s.mu.
func (s *Set) liveOf(e entry) live {
	return live{entry: e, digest: s.ids[e.id].digest}
}

// writeCompacted writes snap as a new log to a locked temporary file in the
// log's directory and syncs it, and their digests as a new digest file
// (digestFile.writeCompacted). It needs no lock: the Set goes on
// recording meanwhile.
func (s *Set) writeCompacted(snap []live) (*compacted, error) {
	tmp, err := os.CreateTemp(filepath.Dir(s.path), tempPrefix(s.path)+"*")
	if err != nil {
		return nil, err
	}
	// Lock the new file before it takes the log's name, so that an Open
	// racing with the rename cannot take it.
	if err := lockFile(tmp); err != nil {
		return nil, abandonTemp(tmp, fmt.Errorf("lock: %w", err))
	}
	w := bufio.NewWriterSize(tmp, 256<<10)
	w.Write(header[:])
	var rec [recordSize]byte
	for _, e := range snap {
		encodeRecord(rec[:], e.id, e.at)
		w.Write(rec[:])
	}
	if err := w.Flush(); err != nil {
		return nil, abandonTemp(tmp, err)
	}
	if err := tmp.Sync(); err != nil {
		return nil, abandonTemp(tmp, err)
	}
	dg, err := s.digests.writeCompacted(snap)
	if err != nil {
		return nil, abandonTemp(tmp, fmt.Errorf("digests: %w", err))
	}
	return &compacted{log: tmp, digests: dg}, nil
}

// compacted is a compaction's new files, written and synced.
type compacted struct {
	log, digests *os.File
}

// abandon closes and removes both files, and returns err.
func (c *compacted) abandon(err error) error {
	abandonTemp(c.digests, nil)
	return abandonTemp(c.log, err)
}

// compactFinish appends to c's log, which holds n records, the records
// written to the log since offset from (and to its digest file those
// written since dgFrom), renames the digest file and then the log over
// theirs and makes them the Set's. Until the renames the old files stay
// in use; after them, the new ones are, even if syncing the directory
// fails. A crash between the two renames leaves a new digest file beside
// the old log, which holds every id the new one does: nothing is lost.
// The records appended are not synced, as no record is (see the package
// doc on power loss). The caller holds s.mu.
func (s *Set) compactFinish(c *compacted, n int, from, dgFrom int64) error {
	tmp := c.log
	at := headerSize + int64(n)*recordSize
	if tail := s.end - from; tail > 0 {
		buf := make([]byte, tail)
		if _, err := s.f.ReadAt(buf, from); err != nil {
			return c.abandon(fmt.Errorf("read the records written meanwhile: %w", err))
		}
		if _, err := tmp.WriteAt(buf, at); err != nil {
			return c.abandon(err)
		}
		at += tail
	}
	if err := s.digests.finish(c.digests, dgFrom); err != nil {
		return c.abandon(fmt.Errorf("digests: %w", err))
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return abandonTemp(tmp, err)
	}
	old := s.f
	s.f = tmp
	s.end = at
	s.count = int((at - headerSize) / recordSize)
	s.retry = 0
	return errors.Join(old.Close(), syncDir(filepath.Dir(s.path)))
}

// abandonTemp closes and removes a compaction's temporary file, and
// returns err.
func abandonTemp(tmp *os.File, err error) error {
	tmp.Close()
	os.Remove(tmp.Name())
	return err
}

// tempPrefix is the name prefix of the temporary files compaction writes
// next to the log at path.
func tempPrefix(path string) string {
	return "." + filepath.Base(path) + ".compact-"
}

// removeStaleTemps removes the temporary files of compactions that a crash
// interrupted. It runs with the log locked, so no compaction is running.
func removeStaleTemps(path string) {
	for _, p := range []string{path, digestsPath(path)} {
		matches, _ := filepath.Glob(filepath.Join(filepath.Dir(p), escapeGlob(tempPrefix(p))+"*"))
		for _, m := range matches {
			os.Remove(m)
		}
	}
}

// escapeGlob escapes the pattern characters of filepath.Match in s.
func escapeGlob(s string) string {
	var b bytes.Buffer
	for _, c := range []byte(s) {
		switch c {
		case '*', '?', '[', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}
