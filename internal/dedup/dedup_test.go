package dedup

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// clock is a fake clock safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// open opens a Set at path and closes it at the end of the test.
func open(t testing.TB, path string, opts Options) *Set {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = ulid.Make().String()
	}
	return out
}

func mustSeen(t testing.TB, s *Set, id string, want bool) {
	t.Helper()
	got, err := s.Seen(id)
	if err != nil {
		t.Fatalf("Seen(%s): %v", id, err)
	}
	if got != want {
		t.Fatalf("Seen(%s) = %v, want %v", id, got, want)
	}
}

func mustRecord(t testing.TB, s *Set, id string) {
	t.Helper()
	if err := s.Record(id, NoDigest); err != nil {
		t.Fatalf("Record(%s): %v", id, err)
	}
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestSeenAfterRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	a, b := ulid.Make().String(), ulid.Make().String()
	mustSeen(t, s, a, false)
	mustRecord(t, s, a)
	mustSeen(t, s, a, true)
	mustSeen(t, s, b, false)
	// Crockford base32 is case-insensitive: the same id in lower case.
	mustSeen(t, s, strings.ToLower(a), true)

	size := fileSize(t, path)
	mustRecord(t, s, a) // idempotent: not written again
	if got := fileSize(t, path); got != size {
		t.Fatalf("recording a held id again grew the log from %d to %d bytes", size, got)
	}
	if size != headerSize+recordSize {
		t.Fatalf("log is %d bytes, want %d", size, headerSize+recordSize)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d, want 1", s.Len())
	}
}

// TestAddIsSeenAtOnceAndWrittenByFlush: Add makes an id Seen without
// writing; Flush writes every added record with one write, after which a
// reopened log holds them; Close writes what is still to write.
func TestAddIsSeenAtOnceAndWrittenByFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	group := ids(8)
	for _, id := range group {
		if err := s.Add(id, NoDigest); err != nil {
			t.Fatal(err)
		}
		mustSeen(t, s, id, true)
	}
	if err := s.Add(group[0], NoDigest); err != nil { // idempotent: not kept twice
		t.Fatal(err)
	}
	if size := fileSize(t, path); size != headerSize {
		t.Fatalf("log is %d bytes before Flush, want %d (the header only)", size, headerSize)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if size, want := fileSize(t, path), int64(headerSize+len(group)*recordSize); size != want {
		t.Fatalf("log is %d bytes after Flush, want %d", size, want)
	}
	if err := s.Flush(); err != nil { // nothing to write
		t.Fatal(err)
	}
	// Record writes what was added before it first, then its own.
	late, own := ulid.Make().String(), ulid.Make().String()
	if err := s.Add(late, NoDigest); err != nil {
		t.Fatal(err)
	}
	mustRecord(t, s, own)
	if size, want := fileSize(t, path), int64(headerSize+(len(group)+2)*recordSize); size != want {
		t.Fatalf("log is %d bytes after Record, want %d", size, want)
	}
	unflushed := ulid.Make().String()
	if err := s.Add(unflushed, NoDigest); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	for _, id := range append(group, late, own, unflushed) {
		mustSeen(t, s, id, true)
	}
	if s.Len() != len(group)+3 {
		t.Fatalf("Len = %d after reopen, want %d", s.Len(), len(group)+3)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ulid.Make().String(), NoDigest); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close = %v, want ErrClosed", err)
	}
	if err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close = %v, want ErrClosed", err)
	}
}

// TestFlushThatFailsKeepsTheRecords: a write that fails (here the log's
// file is swapped for one opened read-only, as a full disk refuses)
// keeps the added records to write, and the next Flush writes them all.
func TestFlushThatFailsKeepsTheRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	group := ids(3)
	for _, id := range group {
		if err := s.Add(id, NoDigest); err != nil {
			t.Fatal(err)
		}
	}
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	f := s.f
	s.f = ro
	s.mu.Unlock()
	if err := s.Flush(); err == nil {
		t.Fatal("Flush to a read-only file succeeded")
	}
	if err := s.Record(ulid.Make().String(), NoDigest); err == nil {
		t.Fatal("Record to a read-only file succeeded")
	}
	mustSeen(t, s, group[0], true) // still held in memory
	s.mu.Lock()
	s.f = f
	s.mu.Unlock()
	ro.Close()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if size, want := fileSize(t, path), int64(headerSize+len(group)*recordSize); size != want {
		t.Fatalf("log is %d bytes, want %d", size, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	for _, id := range group {
		mustSeen(t, s, id, true)
	}
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "dedup", "m.log")
	want := ids(100)
	s := open(t, path, Options{})
	for _, id := range want {
		mustRecord(t, s, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	for _, id := range want {
		mustSeen(t, s, id, true)
	}
	mustSeen(t, s, ulid.Make().String(), false)
	if s.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(want))
	}
}

func TestPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "m.log")
	open(t, path, Options{})
	for p, want := range map[string]fs.FileMode{dir: 0o700, filepath.Dir(dir): 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got&^want != 0 {
			t.Errorf("%s has mode %v, want at most %v", p, got, want)
		}
	}
}

func TestRetention(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{Retention: time.Hour, Now: clk.Now}
	s := open(t, path, opts)
	old, young := ulid.Make().String(), ulid.Make().String()
	mustRecord(t, s, old)
	clk.Advance(30 * time.Minute)
	mustRecord(t, s, young)

	clk.Advance(30*time.Minute - time.Nanosecond)
	mustSeen(t, s, old, true)
	clk.Advance(time.Nanosecond) // old is exactly Retention old now
	mustSeen(t, s, old, false)
	mustSeen(t, s, young, true)
	if s.Len() != 1 {
		t.Fatalf("Len = %d, want 1", s.Len())
	}

	// An expired id recorded again starts a new window.
	size := fileSize(t, path)
	mustRecord(t, s, old)
	mustSeen(t, s, old, true)
	if fileSize(t, path) != size+recordSize {
		t.Fatal("recording an expired id again did not append a record")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// young expires while the Set is closed and is not reloaded.
	clk.Advance(31 * time.Minute)
	s = open(t, path, opts)
	mustSeen(t, s, young, false)
	mustSeen(t, s, old, true)
	if s.Len() != 1 {
		t.Fatalf("Len after reopen = %d, want 1", s.Len())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	s = open(t, path, opts)
	if s.Len() != 0 {
		t.Fatalf("Len after everything expired = %d, want 0", s.Len())
	}
}

func TestPurgeForgetsExpiredIDsFromMemory(t *testing.T) {
	clk := newClock()
	s := open(t, filepath.Join(t.TempDir(), "m.log"), Options{Retention: time.Minute, Now: clk.Now})
	for _, id := range ids(1000) {
		mustRecord(t, s, id)
	}
	clk.Advance(time.Minute)
	// Each Record forgets up to purgeBatch expired ids: memory shrinks
	// without Len being called.
	for _, id := range ids(20) {
		mustRecord(t, s, id)
	}
	s.mu.Lock()
	held := len(s.ids)
	s.mu.Unlock()
	if held != 20 {
		t.Fatalf("%d ids in memory, want 20", held)
	}
}

func TestMaxEntriesEvictsOldest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{MaxEntries: 10, Now: clk.Now}
	s := open(t, path, opts)
	all := ids(25)
	for _, id := range all {
		clk.Advance(time.Second)
		mustRecord(t, s, id)
	}
	check := func() {
		t.Helper()
		if s.Len() != 10 {
			t.Fatalf("Len = %d, want 10", s.Len())
		}
		for i, id := range all {
			mustSeen(t, s, id, i >= 15)
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, opts)
	check()
}

func TestTornTail(t *testing.T) {
	for _, tail := range []struct {
		name string
		b    []byte
	}{
		{"half record", nil}, // filled in below
		{"garbage", []byte("not a record at all, and rather longer than one record")},
		{"zeros", make([]byte, 3*recordSize)},
		{"one byte", []byte{0x42}},
	} {
		t.Run(tail.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.log")
			s := open(t, path, Options{})
			before := ids(5)
			for _, id := range before {
				mustRecord(t, s, id)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			good := fileSize(t, path)

			b := tail.b
			if b == nil {
				var rec [recordSize]byte
				encodeRecord(rec[:], ulid.Make(), time.Now().UnixNano())
				b = rec[:recordSize/2]
			}
			appendFile(t, path, b)

			s = open(t, path, Options{})
			if got := fileSize(t, path); got != good {
				t.Fatalf("after Open the log is %d bytes, want the torn end cut off at %d", got, good)
			}
			after := ids(5)
			for _, id := range after {
				mustRecord(t, s, id)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, path, Options{})
			for _, id := range append(before, after...) {
				mustSeen(t, s, id, true)
			}
			if s.Len() != 10 {
				t.Fatalf("Len = %d, want 10", s.Len())
			}
		})
	}
}

func appendFile(t testing.TB, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A record in the middle whose checksum does not match is skipped; the
// records after it still load, and it stays in the file (compaction drops
// it).
func TestCorruptRecordInMiddleIsSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	all := ids(5)
	for _, id := range all {
		mustRecord(t, s, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	size := fileSize(t, path)

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(headerSize + 2*recordSize + 20) // a byte of the time of record 2
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s = open(t, path, Options{})
	for i, id := range all {
		mustSeen(t, s, id, i != 2)
	}
	if fileSize(t, path) != size {
		t.Fatal("Open cut off records after a corrupt record in the middle")
	}
	// Appends after it stay aligned and load.
	extra := ulid.Make().String()
	mustRecord(t, s, extra)
	s.Close()
	s = open(t, path, Options{})
	mustSeen(t, s, extra, true)
	if s.Len() != 5 {
		t.Fatalf("Len = %d, want 5", s.Len())
	}
}

func TestNotALogIsRefusedAndLeftAlone(t *testing.T) {
	for _, content := range []string{"hello, world: this is someone else's file\n", "MESH", "MESHDDP\x02" + strings.Repeat("x", recordSize)} {
		path := filepath.Join(t.TempDir(), "m.log")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{Logger: quiet})
		if content == "MESH" {
			// A prefix of the header: a creation torn by a crash.
			if err != nil {
				t.Fatalf("Open of a torn header: %v", err)
			}
			s.Close()
			continue
		}
		if !errors.Is(err, ErrFormat) {
			s.Close()
			t.Fatalf("Open of %q: err = %v, want ErrFormat", content, err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != content {
			t.Fatalf("Open changed a file it refused: %q", got)
		}
	}
}

func TestCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{Retention: time.Hour, Now: clk.Now, compactMin: 100}
	s := open(t, path, opts)

	// 300 ids that will expire, then live ones: the log passes 2x the
	// live ids and compacts inside Record.
	for _, id := range ids(300) {
		mustRecord(t, s, id)
	}
	clk.Advance(time.Hour)
	live := ids(50)
	for _, id := range live {
		clk.Advance(time.Millisecond)
		mustRecord(t, s, id)
	}
	s.waitCompaction() // it runs in the background
	size := fileSize(t, path)
	if max := int64(headerSize + 2*len(live)*recordSize); size > max || size < headerSize+int64(len(live))*recordSize {
		t.Fatalf("log is %d bytes after compaction, want %d..%d", size, headerSize+len(live)*recordSize, max)
	}
	if s.Len() != len(live) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(live))
	}
	// Appending after the compaction goes to the new file.
	more := ulid.Make().String()
	mustRecord(t, s, more)
	live = append(live, more)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, opts)
	for _, id := range live {
		mustSeen(t, s, id, true)
	}
	if s.Len() != len(live) {
		t.Fatalf("Len after reopen = %d, want %d", s.Len(), len(live))
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 2 {
		t.Fatalf("dir holds %d files after compaction, want only the log and its digests", len(entries))
	}
}

// heldCompaction opens a set at path whose first background compaction
// stops once it has written the new file, until release is closed; it
// records ids that expire, then live ones until a Record starts that
// compaction, and returns the live ids and a channel closed when the
// compaction is held.
func heldCompaction(t *testing.T, path string, release <-chan struct{}) (*Set, Options, []string, <-chan struct{}) {
	t.Helper()
	clk := newClock()
	written := make(chan struct{})
	var once sync.Once
	opts := Options{Retention: time.Hour, Now: clk.Now, compactMin: 100, compactWritten: func() {
		once.Do(func() {
			close(written)
			<-release
		})
	}}
	s := open(t, path, opts)
	for _, id := range ids(300) {
		mustRecord(t, s, id)
	}
	clk.Advance(time.Hour)
	var live []string
	for !compacting(s) {
		id := ulid.Make().String()
		clk.Advance(time.Millisecond)
		mustRecord(t, s, id)
		live = append(live, id)
	}
	return s, opts, live, written
}

// compacting reports whether a compaction runs in the background.
func compacting(s *Set) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.compacting != nil
}

// TestRecordDuringCompaction: while a compaction rewrites the log (held
// there by a hook, after the new file is written and before the swap),
// Seen and Record go on, so the rewrite holds no lock handlers wait on;
// what they record meanwhile is in the compacted log, and survives a
// reopen.
func TestRecordDuringCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	release := make(chan struct{})
	s, opts, live, written := heldCompaction(t, path, release)
	<-written // the new file is written; the swap waits
	during := ids(40)
	for _, id := range during {
		mustRecord(t, s, id)
		mustSeen(t, s, id, true)
	}
	mustSeen(t, s, live[0], true)
	close(release)
	s.waitCompaction()
	if got, want := fileSize(t, path), int64(headerSize+(len(live)+len(during))*recordSize); got != want {
		t.Fatalf("log is %d bytes after compaction, want %d (the live ids and those recorded meanwhile)", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, opts)
	for _, id := range append(live, during...) {
		mustSeen(t, s, id, true)
	}
	if n := s.Len(); n != len(live)+len(during) {
		t.Fatalf("Len after reopen = %d, want %d", n, len(live)+len(during))
	}
}

// TestCloseDuringCompaction: Close waits for a compaction running in the
// background, which then leaves the log as it was and no temporary file.
func TestCloseDuringCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	release := make(chan struct{})
	s, opts, live, written := heldCompaction(t, path, release)
	<-written
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 2 {
		t.Fatalf("dir holds %d files after Close, want only the log and its digests", len(entries))
	}
	opts.compactWritten = nil
	s = open(t, path, opts)
	for _, id := range live {
		mustSeen(t, s, id, true)
	}
}

func TestCompactionAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{Retention: time.Hour, Now: clk.Now}
	s := open(t, path, opts) // default compactMin: no compaction while writing
	for _, id := range ids(500) {
		mustRecord(t, s, id)
	}
	clk.Advance(time.Hour)
	live := ids(10)
	for _, id := range live {
		mustRecord(t, s, id)
	}
	s.Close()
	if got := fileSize(t, path); got != headerSize+510*recordSize {
		t.Fatalf("log is %d bytes, want 510 records", got)
	}
	// A stale temp file of an interrupted compaction is removed.
	stale := filepath.Join(filepath.Dir(path), tempPrefix(path)+"123")
	if err := os.WriteFile(stale, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	opts.compactMin = 100
	s = open(t, path, opts)
	if got := fileSize(t, path); got != headerSize+10*recordSize {
		t.Fatalf("log is %d bytes after Open, want compacted to 10 records", got)
	}
	for _, id := range live {
		mustSeen(t, s, id, true)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stale compaction temp file still there: %v", err)
	}
}

// Stale entries (an id recorded again after it expired) and MaxEntries
// eviction stay consistent through compaction and reopen.
func TestCompactionKeepsLatestOfReRecordedID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{Retention: time.Hour, MaxEntries: 200, Now: clk.Now, compactMin: 50}
	s := open(t, path, opts)
	again := ulid.Make().String()
	mustRecord(t, s, again)
	clk.Advance(time.Hour)
	mustRecord(t, s, again) // expired: recorded again, a new window
	var want []string
	for i, id := range ids(400) {
		clk.Advance(time.Second)
		mustRecord(t, s, id)
		if i >= 200 {
			want = append(want, id)
		}
	}
	checkInvariants(t, s)
	// again was evicted by MaxEntries (it was recorded first).
	mustSeen(t, s, again, false)
	for _, id := range want {
		mustSeen(t, s, id, true)
	}
	s.Close()
	s = open(t, path, opts)
	checkInvariants(t, s)
	mustSeen(t, s, again, false)
	for _, id := range want {
		mustSeen(t, s, id, true)
	}
	if s.Len() != 200 {
		t.Fatalf("Len = %d, want 200", s.Len())
	}
}

func TestInvalidIDs(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "m.log"), Options{})
	for _, id := range []string{
		"",
		"not-a-ulid",
		"01ARZ3NDEKTSV4RRFFQ69G5FA",   // 25 chars
		"01ARZ3NDEKTSV4RRFFQ69G5FAVV", // 27 chars
		"01ARZ3NDEKTSV4RRFFQ69G5FAU",  // U is not Crockford base32
		"01ARZ3NDEKTSV4RRFFQ69G5FA!",
		"81ARZ3NDEKTSV4RRFFQ69G5FAV", // overflows 128 bits
		"01ARZ3NDEKTSV4RRFFQ69G5FA\u00e9",
		strings.Repeat("0", 1000),
	} {
		if _, err := s.Seen(id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("Seen(%q) err = %v, want ErrInvalidID", id, err)
		}
		if err := s.Record(id, NoDigest); !errors.Is(err, ErrInvalidID) {
			t.Errorf("Record(%q) err = %v, want ErrInvalidID", id, err)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("Len = %d after invalid ids, want 0", s.Len())
	}
}

func TestClosed(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "m.log"), Options{})
	id := ulid.Make().String()
	mustRecord(t, s, id)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Seen(id); !errors.Is(err, ErrClosed) {
		t.Fatalf("Seen after Close: %v, want ErrClosed", err)
	}
	if err := s.Record(id, NoDigest); !errors.Is(err, ErrClosed) {
		t.Fatalf("Record after Close: %v, want ErrClosed", err)
	}
	if s.Len() != 0 {
		t.Fatalf("Len after Close = %d, want 0", s.Len())
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	if s2, err := Open(path, Options{Logger: quiet}); err == nil {
		s2.Close()
		t.Fatal("a second Open of an open log succeeded")
	}
	s.Close()
	open(t, path, Options{}) // free again after Close
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string // substring of the error, "" for none
	}{
		{Options{}, ""},
		{Options{Retention: time.Minute, MaxEntries: 1}, ""},
		{Options{Retention: -time.Second}, "retention: -1s is negative"},
		{Options{MaxEntries: -1}, "max_entries: -1 is negative"},
	} {
		err := tc.opts.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.opts, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.opts, err, tc.want)
		}
		if _, err := Open(filepath.Join(t.TempDir(), "m.log"), tc.opts); err == nil {
			t.Errorf("Open accepted %+v", tc.opts)
		}
	}
}

func TestConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	opts := Options{MaxEntries: 5000, compactMin: 500}
	s := open(t, path, opts)
	shared := ids(200)
	const workers, per = 8, 1000
	recorded := make([][]string, workers)
	var records atomic.Int64 // Record calls so far, by every worker
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				id := ulid.Make().String()
				if err := s.Record(id, NoDigest); err != nil {
					t.Error(err)
					return
				}
				since := records.Add(1)
				recorded[w] = append(recorded[w], id)
				if err := s.Record(shared[i%len(shared)], NoDigest); err != nil {
					t.Error(err)
					return
				}
				records.Add(1)
				ok, err := s.Seen(id)
				// Held unless MaxEntries newer ids came in between (a
				// worker descheduled while the others record).
				if err != nil || (!ok && records.Load()-since < int64(opts.MaxEntries)) {
					t.Errorf("Seen(%s) right after Record = %v, %v", id, ok, err)
					return
				}
				if i%100 == 0 {
					s.Len()
				}
			}
		})
	}
	wg.Wait()
	// 8000 distinct + 200 shared ids, bound 5000: the newest 5000 are held.
	if s.Len() != 5000 {
		t.Fatalf("Len = %d, want 5000", s.Len())
	}
	checkInvariants(t, s)
	held := maps.Clone(s.ids)
	s.Close()
	s = open(t, path, opts)
	if !maps.Equal(s.ids, held) {
		t.Fatalf("after reopen %d ids are held, not the %d held before", len(s.ids), len(held))
	}
	n := 0
	for w := range workers {
		for _, id := range recorded[w] {
			if ok, _ := s.Seen(id); ok {
				n++
			}
		}
	}
	if n < 5000-len(shared) {
		t.Fatalf("%d of the distinct ids are held, want at least %d", n, 5000-len(shared))
	}
}

// TestMemoryPerID logs the heap the set takes per id, to check the figure
// in the package doc.
func TestMemoryPerID(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := open(t, filepath.Join(t.TempDir(), "m.log"), Options{})
	const n = 1 << 20
	now := time.Now().UnixNano()
	before := heapAlloc()
	s.mu.Lock()
	for i := range n {
		var id ulid.ULID
		id[0], id[1], id[2] = byte(i), byte(i>>8), byte(i>>16)
		s.add(id, held{at: now + int64(i)}, false)
	}
	s.mu.Unlock()
	after := heapAlloc()
	t.Logf("%d ids: about %d bytes per id", s.Len(), (after-before)/n)
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func TestHeaderIsFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	s := open(t, path, Options{})
	mustRecord(t, s, ulid.Make().String())
	s.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, header[:]) {
		t.Fatalf("log starts with %q, want the header", b[:headerSize])
	}
}

// checkInvariants checks the memory of s: every held id has exactly one
// entry in the record order with its time, the other entries are counted in
// s.stale, and at most MaxEntries ids are held.
func checkInvariants(t testing.TB, s *Set) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[ulid.ULID]int{}
	stale := 0
	s.order.each(func(e entry) {
		if h, ok := s.ids[e.id]; ok && h.at == e.at {
			live[e.id]++
		} else {
			stale++
		}
	})
	if stale != s.stale {
		t.Fatalf("%d stale entries in the record order, s.stale = %d", stale, s.stale)
	}
	if len(live) != len(s.ids) {
		t.Fatalf("%d held ids have an entry in the record order, %d are held", len(live), len(s.ids))
	}
	for id, n := range live {
		if n != 1 {
			t.Fatalf("id %s has %d live entries", id, n)
		}
	}
	if len(s.ids) > s.opts.MaxEntries {
		t.Fatalf("%d ids held, MaxEntries %d", len(s.ids), s.opts.MaxEntries)
	}
}

// If the clock steps back, an id can expire behind one that is still live:
// Seen treats it as absent at once, compaction drops it, and so does the
// purge once the live one in front expires.
func TestClockSteppedBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	clk := newClock()
	opts := Options{Retention: time.Hour, Now: clk.Now}
	s := open(t, path, opts)
	ahead := ulid.Make().String()
	mustRecord(t, s, ahead)
	clk.Advance(-30 * time.Minute)
	behind := ids(5)
	for _, id := range behind {
		mustRecord(t, s, id)
	}
	clk.Advance(70 * time.Minute) // behind ids are 70m old, ahead is 40m old
	mustSeen(t, s, ahead, true)
	for _, id := range behind {
		mustSeen(t, s, id, false)
	}
	fresh := ulid.Make().String()
	mustRecord(t, s, fresh)
	checkInvariants(t, s)
	if n := s.Len(); n != 7 {
		t.Fatalf("Len = %d, want 7: the expired ids behind a live one stay until compaction", n)
	}

	s.mu.Lock()
	err := s.compact(clk.Now().UnixNano())
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, s)
	if n := s.Len(); n != 2 {
		t.Fatalf("Len after compaction = %d, want 2", n)
	}
	if got := fileSize(t, path); got != headerSize+2*recordSize {
		t.Fatalf("log is %d bytes after compaction, want 2 records", got)
	}
	s.Close()
	s = open(t, path, opts)
	checkInvariants(t, s)
	mustSeen(t, s, ahead, true)
	mustSeen(t, s, fresh, true)
	if n := s.Len(); n != 2 {
		t.Fatalf("Len after reopen = %d, want 2", n)
	}
}
