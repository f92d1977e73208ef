package deadletters_test

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/heaptest"
	"github.com/meshkit/mesh/internal/wire"
)

// peakHeap samples the heap in use every millisecond while f runs and
// returns how far above its level before f it rose at most.
func peakHeap(f func()) uint64 {
	h := heaptest.Around(f)
	return h.Grew
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

// TestSummariesHoldNoBodies: listing a keeper queue of 1 MiB unrouted
// events as summaries, or with a 4 KiB preview of each body, keeps the
// heap within twice what the browse may buffer (its window, about 8 MiB
// of bodies, and the body being read) and what it keeps, far below the
// bodies' total; every message stays, and the fields are read whole.
func TestSummariesHoldNoBodies(t *testing.T) {
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const count, size = 96, 1 << 20
	body := `{"pad":"` + strings.Repeat("x", size-10) + `"}`
	var pending []func() bool
	for i := range count {
		e := newEvent("mesh.nobody.listens", "shop", body)
		dc, err := m.ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, e.typ, false, false, e.publishing())
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, func() bool { ok, _ := dc.WaitContext(ctx); return ok })
		if len(pending) == 16 || i == count-1 {
			for _, wait := range pending {
				if !wait() {
					t.Fatal("an unrouted event was not confirmed")
				}
			}
			pending = pending[:0]
		}
	}
	if n := m.count(wire.QueueUnrouted, count); n != count {
		t.Fatalf("%d unrouted events, want %d", n, count)
	}
	// What a browse may hold live: its window (8 MiB of bodies), the
	// body being read and the one being handed over, and what it keeps
	// (under 1 KiB a summary, 4 KiB more with the preview). The heap in
	// use grows to twice what the collector found live before it runs
	// again (GOGC=100), and what it finds live includes what was
	// allocated while it marked (here 2 MiB a message: the body and its
	// frames): the heap may grow by the heap before and 4 times the
	// bound.
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	bound := uint64(8<<20 + 2*size + count*(1<<10+4<<10))
	for _, tc := range []struct {
		name string
		opt  deadletters.Option
		body int
	}{{"summaries", deadletters.Summaries(), 0}, {"4 KiB previews", deadletters.WithBodyLimit(4 << 10), 4 << 10}} {
		var msgs []deadletters.Message
		var err error
		h := heaptest.Around(func() { msgs, err = deadletters.List(ctx, m.conn, wire.QueueUnrouted, deadletters.Filter{}, tc.opt) })
		t.Logf("%s of %d unrouted events of %d KiB: the live heap grew by %.1f MiB at most, the heap in use by %.1f MiB from %.1f MiB (bound %.1f MiB live)",
			tc.name, count, size>>10, mib(h.Live), mib(h.Grew), mib(h.Base), mib(bound))
		if h.Grew > h.Base+4*bound {
			t.Errorf("%s: the heap in use grew by %.1f MiB, over %.1f MiB", tc.name, mib(h.Grew), mib(h.Base+4*bound))
		}
		if err != nil || len(msgs) != count {
			t.Fatalf("%s: %d messages, %v", tc.name, len(msgs), err)
		}
		if g := msgs[0]; g.Size != len(body) || len(g.Body) != tc.body || g.Type != "mesh.nobody.listens" || g.Source != "shop" || g.ID == "" ||
			(g.Headers == nil) != (tc.body == 0) {
			t.Errorf("%s: the first read as ID %q type %q source %q size %d, %d bytes of body, headers %v", tc.name, g.ID, g.Type, g.Source, g.Size, len(g.Body), g.Headers != nil)
		}
		if n := m.count(wire.QueueUnrouted, count); n != count {
			t.Fatalf("%s: %d unrouted events left, want %d", tc.name, n, count)
		}
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
