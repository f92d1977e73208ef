package plugin

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// collect reads batches from out until n items came, failing after a
// minute (a lost item).
func collect(t *testing.T, out <-chan []int, n int) [][]int {
	t.Helper()
	var got [][]int
	for count := 0; count < n; {
		select {
		case b := <-out:
			got = append(got, b)
			count += len(b)
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d items came out", count, n)
		}
	}
	return got
}

// TestBatchesKeepEveryItemInOrder: what goes in comes out once, in order,
// in batches of at most MaxBatch; items waiting together go together.
func TestBatchesKeepEveryItemInOrder(t *testing.T) {
	const n = 1000
	in := make(chan int, n)
	for i := range n {
		in <- i
	}
	done := make(chan struct{})
	defer close(done)
	batches := collect(t, Batches(in, done, nil), n)
	var all []int
	for _, b := range batches {
		if len(b) == 0 || len(b) > MaxBatch {
			t.Fatalf("a batch of %d items, want 1 to %d", len(b), MaxBatch)
		}
		all = append(all, b...)
	}
	for i, v := range all {
		if v != i {
			t.Fatalf("item %d is %d: out of order or repeated", i, v)
		}
	}
	if len(all) != n {
		t.Fatalf("%d items came out, want %d", len(all), n)
	}
	// All were waiting: every batch but the last is full, unless the
	// batcher stalled for a whole Gap between two reads.
	if len(batches) >= n/2 {
		t.Errorf("%d batches for %d items waiting together", len(batches), n)
	}
}

// TestBatchesLoneItemGoes: an item with nothing after it goes without
// waiting for more.
func TestBatchesLoneItemGoes(t *testing.T) {
	in := make(chan int)
	done := make(chan struct{})
	defer close(done)
	out := Batches(in, done, nil)
	for i := range 3 {
		in <- i
		if b := collect(t, out, 1); !slices.Equal(b[0], []int{i}) {
			t.Fatalf("batch %v, want [%d]", b[0], i)
		}
	}
}

// TestBatchesFlushNow: when flushNow says nothing more is coming, a batch
// goes at once with what it has, even with more waiting.
func TestBatchesFlushNow(t *testing.T) {
	in := make(chan int, 10)
	for i := range 10 {
		in <- i
	}
	done := make(chan struct{})
	defer close(done)
	for i, b := range collect(t, Batches(in, done, func() bool { return true }), 10) {
		if !slices.Equal(b, []int{i}) {
			t.Fatalf("batch %d is %v, want [%d]", i, b, i)
		}
	}
}

// TestBatchesEndWithDone: closing done closes the batches, whether a batch
// is filling or not (one due at that moment may still come out).
func TestBatchesEndWithDone(t *testing.T) {
	for _, filling := range []bool{false, true} {
		in := make(chan int, 1)
		done := make(chan struct{})
		// flushNow is asked once a batch has its first item: the batch
		// is filling when done closes.
		asked := make(chan struct{})
		var once sync.Once
		out := Batches(in, done, func() bool { once.Do(func() { close(asked) }); return false })
		if filling {
			in <- 1
			<-asked
		}
		close(done)
		for ended := false; !ended; {
			select {
			case b, ok := <-out:
				if ok && (!filling || !slices.Equal(b, []int{1})) {
					t.Fatalf("filling=%v: a batch %v after done", filling, b)
				}
				ended = !ok
			case <-time.After(time.Minute):
				t.Fatalf("filling=%v: the batches did not end", filling)
			}
		}
	}
}
