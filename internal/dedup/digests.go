package dedup

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/oklog/ulid/v2"

	"github.com/meshkit/mesh/internal/stateformat"
)

// The digest file: beside the log, "<log>.digests", the digest of each id
// recorded with one (see the package doc). It has a file of its own, not
// records of a new log format, so that the log stays the format v0.1.0
// reads: a rollback keeps every recorded id, and loses only the digests.

// digestsHeader starts every digest file: a magic and the format version
// (stateformat.DedupDigests, 1).
var digestsHeader = [headerSize]byte{'M', 'E', 'S', 'H', 'D', 'D', 'G', byte(stateformat.DedupDigests.Version)}

// digestsPath is the digest file of the log at path.
func digestsPath(path string) string { return path + ".digests" }

// digestFile is the digest file of a Set, guarded by the Set's mutex and
// by its log's lock. Its records have the log's layout with the digest in
// place of the time: the 16-byte id, the digest (8 bytes, little endian)
// and a CRC-32C of those 24 bytes.
type digestFile struct {
	path    string
	f       *os.File
	end     int64  // offset of the next record
	pending []byte // records of Set.Add not yet written
	buf     [recordSize]byte
}

// open opens (or creates) the digest file at path and calls each with
// every valid record in the file's order (a later record of an id is a
// later recording of it), cutting off a torn or invalid end.
func (d *digestFile) open(path string, each func(id ulid.ULID, digest uint64)) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open digests: %w", err)
	}
	d.path, d.f = path, f
	if err := d.load(each); err != nil {
		f.Close()
		return fmt.Errorf("digests %s: %w", path, err)
	}
	return nil
}

// load is open's reading of the file.
func (d *digestFile) load(each func(id ulid.ULID, digest uint64)) error {
	fi, err := d.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size < headerSize {
		got := make([]byte, size)
		if _, err := d.f.ReadAt(got, 0); err != nil {
			return fmt.Errorf("read header: %w", err)
		}
		if !bytes.HasPrefix(digestsHeader[:], got) {
			return fmt.Errorf("%w: %d bytes that do not start with the header", ErrFormat, size)
		}
		if _, err := d.f.WriteAt(digestsHeader[:], 0); err != nil {
			return fmt.Errorf("write header: %w", err)
		}
		if err := d.f.Sync(); err != nil {
			return fmt.Errorf("sync header: %w", err)
		}
		if err := syncDir(filepath.Dir(d.path)); err != nil {
			return fmt.Errorf("sync dir: %w", err)
		}
		d.end = headerSize
		return nil
	}
	var h [headerSize]byte
	if _, err := d.f.ReadAt(h[:], 0); err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	if h != digestsHeader {
		if bytes.Equal(h[:headerSize-1], digestsHeader[:headerSize-1]) && int(h[headerSize-1]) > stateformat.DedupDigests.Version {
			return fmt.Errorf("%w: %w", ErrFormat, stateformat.DedupDigests.Check(d.path, int(h[headerSize-1])))
		}
		return fmt.Errorf("%w: header %q, want %q", ErrFormat, h[:], digestsHeader[:])
	}
	n := (size - headerSize) / recordSize
	r := bufio.NewReaderSize(io.NewSectionReader(d.f, headerSize, n*recordSize), 1<<20)
	var rec [recordSize]byte
	good := int64(0)
	for i := int64(0); i < n; i++ {
		if _, err := io.ReadFull(r, rec[:]); err != nil {
			return fmt.Errorf("read record %d: %w", i, err)
		}
		id, digest, ok := decodeRecord(rec[:])
		if !ok {
			continue
		}
		good = i + 1
		if each != nil {
			each(id, uint64(digest))
		}
	}
	d.end = headerSize + good*recordSize
	if d.end < size {
		if err := d.f.Truncate(d.end); err != nil {
			return fmt.Errorf("cut off torn end: %w", err)
		}
	}
	return nil
}

// write writes the record of id's digest, unless it is NoDigest.
func (d *digestFile) write(id ulid.ULID, digest uint64) error {
	if digest == NoDigest {
		return nil
	}
	encodeRecord(d.buf[:], id, int64(digest))
	if _, err := d.f.WriteAt(d.buf[:], d.end); err != nil {
		return fmt.Errorf("write digest: %w", err)
	}
	d.end += recordSize
	return nil
}

// add keeps the record of id's digest for the next flush, unless it is
// NoDigest.
func (d *digestFile) add(id ulid.ULID, digest uint64) {
	if digest == NoDigest {
		return
	}
	n := len(d.pending)
	d.pending = append(d.pending, make([]byte, recordSize)...)
	encodeRecord(d.pending[n:], id, int64(digest))
}

// flush writes the records kept by add with one write(2); after an error
// they are kept for the next flush.
func (d *digestFile) flush() error {
	if len(d.pending) == 0 {
		return nil
	}
	if _, err := d.f.WriteAt(d.pending, d.end); err != nil {
		return fmt.Errorf("write %d digests: %w", len(d.pending)/recordSize, err)
	}
	d.end += int64(len(d.pending))
	d.pending = d.pending[:0]
	return nil
}

// writeCompacted writes the digests of snap as a new digest file to a
// temporary file beside it, and syncs it. The log's new file, locked,
// guards it: the caller writes that one first.
func (d *digestFile) writeCompacted(snap []live) (*os.File, error) {
	tmp, err := os.CreateTemp(filepath.Dir(d.path), tempPrefix(d.path)+"*")
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(tmp, 256<<10)
	w.Write(digestsHeader[:])
	var rec [recordSize]byte
	for _, e := range snap {
		if e.digest == NoDigest {
			continue
		}
		encodeRecord(rec[:], e.id, int64(e.digest))
		w.Write(rec[:])
	}
	if err := w.Flush(); err != nil {
		return nil, abandonTemp(tmp, err)
	}
	if err := tmp.Sync(); err != nil {
		return nil, abandonTemp(tmp, err)
	}
	return tmp, nil
}

// finish appends to tmp (writeCompacted's) the records written since
// offset from, renames it over the digest file and makes it the one in
// use. On an error tmp is left for the caller to abandon.
func (d *digestFile) finish(tmp *os.File, from int64) error {
	fi, err := tmp.Stat()
	if err != nil {
		return err
	}
	at := fi.Size()
	if tail := d.end - from; tail > 0 {
		buf := make([]byte, tail)
		if _, err := d.f.ReadAt(buf, from); err != nil {
			return fmt.Errorf("read the digests written meanwhile: %w", err)
		}
		if _, err := tmp.WriteAt(buf, at); err != nil {
			return err
		}
		at += tail
	}
	if err := os.Rename(tmp.Name(), d.path); err != nil {
		return err
	}
	old := d.f
	d.f, d.end = tmp, at
	old.Close()
	return nil
}

// close syncs and closes the file.
func (d *digestFile) close() error {
	if d.f == nil {
		return nil
	}
	serr := d.f.Sync()
	cerr := d.f.Close()
	d.f = nil
	if serr != nil {
		return serr
	}
	return cerr
}
