package deadletters_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// peakHeap samples the heap in use every millisecond while f runs and
// returns how far above its level before f it rose at most.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	stop, done := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapAlloc)
			mu.Unlock()
		}
	}()
	f()
	close(stop)
	<-done
	if peak < base {
		return 0
	}
	return peak - base
}

// TestBrowseKeepsMemoryBounded: a keeper queue much larger than what a
// browse may hold in memory (48 MB of dead letters) is listed with a
// limit, searched for a few messages at its end and purged of them, each
// with the heap staying far below the queue's size; every other message
// stays.
func TestBrowseKeepsMemoryBounded(t *testing.T) {
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const count, size = 6000, 8 << 10
	body := `{"pad":"` + strings.Repeat("x", size-10) + `"}`
	var last []string
	var pending []func() bool
	for i := range count {
		e := newEvent("module.shop.order.created", "shop", body)
		msg := e.publishing()
		msg.Headers[wire.HeaderDeadQueue] = "n1.billing.events"
		msg.Headers[wire.HeaderDeadReason] = wire.DeadReasonPermanent
		dc, err := m.ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeDead, e.typ, false, false, msg)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, func() bool { ok, _ := dc.WaitContext(ctx); return ok })
		if len(pending) == 256 || i == count-1 {
			for _, wait := range pending {
				if !wait() {
					t.Fatal("a dead letter was not confirmed")
				}
			}
			pending = pending[:0]
		}
		if i >= count-3 {
			last = append(last, e.id)
		}
	}
	if n := m.count(wire.QueueDead, count); n != count {
		t.Fatalf("%d dead letters, want %d", n, count)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(25)) // collect what a browse drops promptly
	const bound = 16 << 20                           // a third of the queue

	var msgs []deadletters.Message
	var err error
	if grew := peakHeap(func() {
		msgs, err = deadletters.List(ctx, m.conn, wire.QueueDead, deadletters.Filter{}, deadletters.WithLimit(10))
	}); grew > bound {
		t.Errorf("listing 10 of %d dead letters of %d KiB grew the heap by %d MiB", count, size>>10, grew>>20)
	}
	if err != nil || len(msgs) != 10 {
		t.Fatalf("list: %d messages, %v", len(msgs), err)
	}
	var res deadletters.Result
	if grew := peakHeap(func() { res, err = deadletters.Purge(ctx, m.conn, wire.QueueDead, deadletters.Filter{IDs: last}) }); grew > bound {
		t.Errorf("purging the last 3 of %d dead letters of %d KiB grew the heap by %d MiB", count, size>>10, grew>>20)
	}
	if err != nil || res.Matched != 3 || res.Done != 3 {
		t.Fatalf("purge: %+v, %v", res, err)
	}
	if n := m.count(wire.QueueDead, count-3); n != count-3 {
		t.Fatalf("%d dead letters left, want %d", n, count-3)
	}
}
