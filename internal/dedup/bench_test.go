package dedup

import (
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
)

// seq returns n distinct ULID strings.
func seq(n int) []string {
	base := ulid.Make()
	out := make([]string, n)
	for i := range out {
		id := base
		id[15], id[14], id[13], id[12] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		out[i] = id.String()
	}
	return out
}

// BenchmarkSeen asks for an id that is held, in a set of 100k ids.
func BenchmarkSeen(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(100_000)
	for _, id := range all {
		mustRecord(b, s, id)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ok, err := s.Seen(all[i%len(all)]); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkSeenParallel is BenchmarkSeen from GOMAXPROCS goroutines, to
// show what the one mutex costs under contention.
func BenchmarkSeenParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(100_000)
	for _, id := range all {
		mustRecord(b, s, id)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if ok, err := s.Seen(all[i%len(all)]); !ok || err != nil {
				b.Error(ok, err)
				return
			}
			i++
		}
	})
}

// BenchmarkRecord records new ids with the default options: one write(2)
// each, plus, past a million ids, eviction and the occasional compaction
// (amortised in ns/op).
func BenchmarkRecord(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Record(all[i], NoDigest); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAddFlush8 adds new ids and writes them eight at a time, as the
// runtime does at an acknowledgement of eight deliveries (ns/op is per id).
func BenchmarkAddFlush8(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Add(all[i], NoDigest); err != nil {
			b.Fatal(err)
		}
		if i%8 == 7 {
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRecordParallel is BenchmarkRecord from GOMAXPROCS goroutines.
func BenchmarkRecordParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(b.N + 1)
	var next chan int = make(chan int, 1)
	next <- 0
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := <-next
			next <- i + 1
			if err := s.Record(all[i%len(all)], NoDigest); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCompact measures one whole compaction of a full set (the
// default MaxEntries of a million live ids), file rewrite and fsync
// included. Since ADR 17 only BenchmarkCompactPause of it holds the lock.
func BenchmarkCompact(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	all := seq(DefaultMaxEntries)
	for _, id := range all {
		mustRecord(b, s, id)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.mu.Lock()
		err := s.compact(s.opts.Now().UnixNano())
		s.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompactPause measures the longest a background compaction of
// a full set holds the lock, so what a Seen or Record call can wait for:
// the copy of one chunk of live entries (the file is rewritten without the
// lock). Compare BenchmarkCompact, the whole of it.
func BenchmarkCompactPause(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "m.log"), Options{})
	for _, id := range seq(DefaultMaxEntries) {
		mustRecord(b, s, id)
	}
	cutoff := s.cutoff(s.opts.Now().UnixNano())
	snap := make([]entry, 0, compactChunk)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap = snap[:0]
		s.mu.Lock()
		for p := range compactChunk {
			if e := s.order.at(p); e.at > cutoff && !s.isStale(e) {
				snap = append(snap, e)
			}
		}
		s.mu.Unlock()
		if len(snap) != compactChunk {
			b.Fatalf("chunk of %d entries", len(snap))
		}
	}
}

// BenchmarkOpen measures loading a log of a million live ids.
func BenchmarkOpen(b *testing.B) {
	path := filepath.Join(b.TempDir(), "m.log")
	s := open(b, path, Options{})
	for _, id := range seq(DefaultMaxEntries) {
		mustRecord(b, s, id)
	}
	s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := Open(path, Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
