package dedup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// FuzzOpenLog writes arbitrary bytes as the log and checks that Open never
// panics, refuses a file without the header and leaves it alone, loads
// exactly the valid records within the retention window (checked against an
// independent reading of the bytes), leaves an aligned file, and that a
// second Open loads the same ids.
func FuzzOpenLog(f *testing.F) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(at time.Time, id ulid.ULID) []byte {
		b := make([]byte, recordSize)
		encodeRecord(b, id, at.UnixNano())
		return b
	}
	a, b, c := ulid.Make(), ulid.Make(), ulid.Make()
	live, old, future := now.Add(-30*time.Minute), now.Add(-2*time.Hour), now.Add(time.Hour)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	h := header[:]
	corrupt := rec(live, b)
	corrupt[5] ^= 1
	f.Add([]byte{})
	f.Add([]byte("MESH"))
	f.Add([]byte("hello, world"))
	f.Add(cat(h))
	f.Add(cat(h, rec(live, a)))
	f.Add(cat(h, rec(live, a), rec(old, b), rec(future, c)))
	f.Add(cat(h, rec(live, a), corrupt, rec(live, c)))
	f.Add(cat(h, rec(live, a), rec(live, b)[:13]))
	f.Add(cat(h, rec(old, a), rec(live, a), rec(live, b), rec(live, a), rec(old, c), rec(live, c)))
	f.Add(cat(h, rec(live, a), rec(live, b), rec(live, c), make([]byte, 2*recordSize)))
	f.Add(cat(h, rec(old, a), rec(old, b), rec(old, c), rec(old, a), rec(old, b), rec(live, c)))
	f.Add(cat([]byte("MESHDDP\x02"), rec(live, a)))

	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "m.log")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		opts := Options{Retention: time.Hour, Now: func() time.Time { return now }, Logger: quiet, compactMin: 4}
		want, good, isLog := readLog(data, now.Add(-time.Hour).UnixNano())

		s, err := Open(path, opts)
		if !isLog {
			if err == nil {
				s.Close()
				t.Fatalf("Open accepted a file without the header: %q", data)
			}
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("Open of a file without the header: %v, want ErrFormat", err)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
				t.Fatalf("Open changed a file it refused")
			}
			return
		}
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if !maps.Equal(times(s.ids), want) {
			s.Close()
			t.Fatalf("Open loaded %v, want %v", s.ids, want)
		}
		checkInvariants(t, s)
		if s.Len() != len(want) {
			t.Fatalf("Len = %d, want %d", s.Len(), len(want))
		}
		for id := range want {
			if ok, err := s.Seen(id.String()); !ok || err != nil {
				t.Fatalf("Seen(%s) = %v, %v", id, ok, err)
			}
		}
		size := fileSize(t, path)
		if (size-headerSize)%recordSize != 0 || size > max(good, headerSize) || size < headerSize+int64(len(want))*recordSize {
			t.Fatalf("after Open the log is %d bytes; %d bytes up to the last valid record, %d live", size, good, len(want))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		s, err = Open(path, opts)
		if err != nil {
			t.Fatalf("second Open: %v", err)
		}
		defer s.Close()
		if !maps.Equal(times(s.ids), want) {
			t.Fatalf("second Open loaded %v, want %v", s.ids, want)
		}
	})
}

// readLog reads data as a log independently of load: the live ids (the last
// valid record of each id wins), the length up to the end of the last valid
// record, and whether data is a log at all (has the header or a prefix of
// it).
func readLog(data []byte, cutoff int64) (live map[ulid.ULID]int64, good int64, isLog bool) {
	live = map[ulid.ULID]int64{}
	if len(data) < headerSize {
		return live, 0, bytes.HasPrefix(header[:], data)
	}
	if !bytes.Equal(data[:headerSize], header[:]) {
		return nil, 0, false
	}
	good = headerSize
	tbl := crc32.MakeTable(crc32.Castagnoli)
	for off := headerSize; off+recordSize <= len(data); off += recordSize {
		r := data[off : off+recordSize]
		if crc32.Checksum(r[:24], tbl) != binary.LittleEndian.Uint32(r[24:]) {
			continue
		}
		good = int64(off + recordSize)
		at := int64(binary.LittleEndian.Uint64(r[16:24]))
		if at > cutoff {
			live[ulid.ULID(r[:16])] = at
		}
	}
	return live, good, true
}

// times is when each id in ids was recorded.
func times(ids map[ulid.ULID]held) map[ulid.ULID]int64 {
	out := make(map[ulid.ULID]int64, len(ids))
	for id, h := range ids {
		out[id] = h.at
	}
	return out
}
