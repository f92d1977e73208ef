package dedup

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/meshkit/mesh/internal/stateformat"
)

func mustCheck(t testing.TB, s *Set, id string, digest uint64, want Verdict, wantRecorded uint64) {
	t.Helper()
	v, recorded, err := s.Check(id, digest)
	if err != nil {
		t.Fatalf("Check(%s, %x): %v", id, digest, err)
	}
	if v != want || (want != New && recorded != wantRecorded) {
		t.Fatalf("Check(%s, %x) = %v with %x recorded, want %v with %x", id, digest, v, recorded, want, wantRecorded)
	}
}

// TestConflict: an id recorded with a digest is a duplicate for the same
// digest (or none) and a conflict for another, naming the recorded one,
// through Record and Add alike, and after a reopen.
func TestConflict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	a, b, c := ulid.Make().String(), ulid.Make().String(), ulid.Make().String()
	mustCheck(t, s, a, 7, New, 0)
	if err := s.Record(a, 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(b, 9); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(c, NoDigest); err != nil {
		t.Fatal(err)
	}
	check := func(s *Set) {
		t.Helper()
		mustCheck(t, s, a, 7, Duplicate, 7)
		mustCheck(t, s, a, NoDigest, Duplicate, 7)
		mustCheck(t, s, a, 8, Conflict, 7)
		mustCheck(t, s, b, 9, Duplicate, 9)
		mustCheck(t, s, b, 7, Conflict, 9)
		mustCheck(t, s, c, 1234, Duplicate, NoDigest) // recorded without one
	}
	check(s)
	// Recorded again with another digest: idempotent, the first stays.
	if err := s.Record(a, 8); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, s, a, 8, Conflict, 7)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(open(t, path, Options{}))
}

// TestDigestsSurviveCompaction: a compaction keeps the digests of the
// live ids, and of those recorded while it ran in the background; the
// digests of expired ids are gone from the rewritten file.
func TestDigestsSurviveCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	release := make(chan struct{})
	s, opts, live, written := heldCompaction(t, path, release)
	<-written
	during := ids(40)
	for i, id := range during {
		if err := s.Record(id, uint64(1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	s.waitCompaction()
	// A synchronous compaction too, with digests recorded before it.
	if err := s.Record(live[0], 5); err != nil { // held: keeps NoDigest
		t.Fatal(err)
	}
	extra := ulid.Make().String()
	if err := s.Record(extra, 77); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	err := s.compact(opts.Now().UnixNano())
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := fileSize(t, digestsPath(path)), int64(headerSize+(len(during)+1)*recordSize); got != want {
		t.Fatalf("digest file is %d bytes after compaction, want %d (the live digests only)", got, want)
	}
	s = open(t, path, opts)
	for i, id := range during {
		mustCheck(t, s, id, uint64(1000+i), Duplicate, uint64(1000+i))
		mustCheck(t, s, id, 1, Conflict, uint64(1000+i))
	}
	mustCheck(t, s, extra, 78, Conflict, 77)
	mustCheck(t, s, live[0], 5, Duplicate, NoDigest)
}

// TestLogWithoutDigests: a log of v0.1.0 (no digest file) is read as it
// was: its ids are duplicates whatever the digest. The log itself stays
// format 1, so v0.1.0 reads it after a rollback, and v0.1.0's
// recordings after the digests were written are duplicates too.
func TestLogWithoutDigests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	a := ulid.Make().String()
	if err := s.Record(a, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("MESHDDP\x01")) || len(b) != headerSize+recordSize {
		t.Fatalf("the log is not v0.1.0's format 1 with one record: %q", b)
	}
	if err := os.Remove(digestsPath(path)); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	mustCheck(t, s, a, 4, Duplicate, NoDigest)
}

// TestDigestsNewerFormat: a digest file of a later format is refused with
// both formats named, and left untouched with its log.
func TestDigestsNewerFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	mustRecord(t, s, ulid.Make().String())
	s.Close()
	h := digestsHeader
	h[headerSize-1]++
	if err := os.WriteFile(digestsPath(path), h[:], 0o600); err != nil {
		t.Fatal(err)
	}
	logBefore, _ := os.ReadFile(path)
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrFormat) || !errors.Is(err, stateformat.ErrNewer) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("a digest file of a newer format: %v", err)
	}
	if b, _ := os.ReadFile(digestsPath(path)); !bytes.Equal(b, h[:]) {
		t.Errorf("the refused digest file changed: %q", b)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, logBefore) {
		t.Errorf("the log changed")
	}
}

// FuzzOpenDigests writes arbitrary bytes as the digest file of a log that
// holds two ids, and checks that Open never panics, refuses a file
// without the header and leaves it alone, and otherwise gives each id the
// digest of its last valid record (NoDigest without one), the same again
// after a second Open.
func FuzzOpenDigests(f *testing.F) {
	a, b := ulid.Make(), ulid.Make()
	rec := func(id ulid.ULID, digest uint64) []byte {
		r := make([]byte, recordSize)
		encodeRecord(r, id, int64(digest))
		return r
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	h := digestsHeader[:]
	f.Add([]byte{})
	f.Add([]byte("MESHDDG"))
	f.Add(cat(h, rec(a, 1)))
	f.Add(cat(h, rec(a, 1), rec(b, 2), rec(a, 3)))
	f.Add(cat(h, rec(a, 1), rec(b, 2)[:9]))
	f.Add(cat(h, rec(ulid.Make(), 5), rec(b, 2)))
	f.Add(cat([]byte("MESHDDG\x02"), rec(a, 1)))
	f.Add(cat([]byte("MESHDDP\x01"), rec(a, 1)))
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "m.log")
		log := append(append([]byte(nil), header[:]...), make([]byte, 2*recordSize)...)
		encodeRecord(log[headerSize:], a, now.UnixNano())
		encodeRecord(log[headerSize+recordSize:], b, now.UnixNano())
		if err := os.WriteFile(path, log, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(digestsPath(path), data, 0o600); err != nil {
			t.Fatal(err)
		}
		opts := Options{Retention: time.Hour, Now: func() time.Time { return now }, Logger: quiet}
		isFile := bytes.HasPrefix(data, h) || (len(data) < headerSize && bytes.HasPrefix(h, data))
		want := map[ulid.ULID]uint64{a: NoDigest, b: NoDigest}
		if bytes.HasPrefix(data, h) {
			for off := headerSize; off+recordSize <= len(data); off += recordSize {
				if id, d, ok := decodeRecord(data[off : off+recordSize]); ok {
					if _, held := want[id]; held {
						want[id] = uint64(d)
					}
				}
			}
		}
		for range 2 {
			s, err := Open(path, opts)
			if !isFile {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("Open with a digest file without its header: %v, want ErrFormat", err)
				}
				if got, _ := os.ReadFile(digestsPath(path)); !bytes.Equal(got, data) {
					t.Fatal("Open changed a digest file it refused")
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			for id, d := range want {
				s.mu.Lock()
				got := s.ids[id].digest
				s.mu.Unlock()
				if got != d {
					s.Close()
					t.Fatalf("digest of %s = %x, want %x", id, got, d)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if size := fileSize(t, digestsPath(path)); (size-headerSize)%recordSize != 0 {
				t.Fatalf("digest file of %d bytes after Open: not aligned", size)
			}
		}
	})
}
