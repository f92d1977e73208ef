package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/heaptest"
	"github.com/meshkit/mesh/internal/wire"
)

// brokerMesh is a fake mesh whose keeper queues are a real broker's: Kept
// reads them as meshctl's does (deadletters.List with q.Options(), on a
// connection of its own).
type brokerMesh struct {
	*fakeMesh
	url string

	mu    sync.Mutex
	kepts int
}

func (m *brokerMesh) Kept(ctx context.Context, queue string, q KeptQuery) ([]deadletters.Message, error) {
	m.mu.Lock()
	m.kepts++
	m.mu.Unlock()
	conn, err := amqp.Dial(m.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return deadletters.List(ctx, conn, queue, q.Filter, q.Options()...)
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// keptSize is the count and body size of the unrouted events
// TestAPageViewHoldsNoBodies keeps: MESH_CONSOLE_MEMORY=COUNTxKIB
// (10000x1024 for issue 47's 10,000 of 1 MiB: 10 GB on the broker);
// 600 of 256 KiB by default: 150 MiB of bodies, four times the most a
// view may grow the heap by (bound, below), in well under a minute of
// make test.
func keptSize(t *testing.T) (count, size int) {
	count, size = 600, 256<<10
	if v := os.Getenv("MESH_CONSOLE_MEMORY"); v != "" {
		n, kib, ok := strings.Cut(v, "x")
		c, err1 := strconv.Atoi(n)
		k, err2 := strconv.Atoi(kib)
		if !ok || err1 != nil || err2 != nil || c < 1 || k < 1 {
			t.Fatalf("MESH_CONSOLE_MEMORY=%q: want COUNTxKIB (600x256)", v)
		}
		count, size = c, k<<10
	}
	return count, size
}

// TestAPageViewHoldsNoBodies (issue 47): with thousands of large
// unrouted events kept, a view of /unrouted, four views at once, a
// group's page and one message's page each grow meshctl's heap by a
// bounded amount, whatever the bodies' total:
//
//	live ≤ L = 8 MiB (the read's window of bodies) + 2 × S (the body being
//	           read and the one handed over) + N × 2 KiB (a summary, and
//	           the page's share of it) [+ 64 KiB shown of one body]
//	heap in use ≤ heap before + 4 × L
//
// (GOGC=100: the heap grows to twice what the collector found live
// before it runs again, and what it finds live includes what was
// allocated while it marked, here about twice each body: it and its
// frames). The four views at once read the queue once. Before issue 47
// a view held every body, twice over: N × S × 2.
func TestAPageViewHoldsNoBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a keeper queue with hundreds of megabytes")
	}
	count, size := keptSize(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	url := brokertest.VHost(t) // deleted, with what it holds, when the test ends
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The mesh's topology as a node declares it: what no queue takes
	// from mesh.events goes to mesh.unrouted.
	if err := ch.ExchangeDeclare(wire.ExchangeUnrouted, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(wire.ExchangeEvents, amqp.ExchangeTopic, true, false, false, false, amqp.Table{"alternate-exchange": wire.ExchangeUnrouted}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(wire.QueueUnrouted, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(wire.QueueUnrouted, "", wire.ExchangeUnrouted, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"pad":"` + strings.Repeat("x", size-10) + `"}`)
	var last string
	var pending []*amqp.DeferredConfirmation
	for i := range count {
		id := ulid.Make().String()
		typ := fmt.Sprintf("module.shop.order.kind%d", i%5) // five groups
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, typ, false, false, amqp.Publishing{
			MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body,
			Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "n0"},
		})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) == 64 || i == count-1 {
			for _, dc := range pending {
				if ok, err := dc.WaitContext(ctx); !ok || err != nil {
					t.Fatalf("an unrouted event not confirmed: %v", err)
				}
			}
			pending = pending[:0]
		}
		last = id
	}
	if q, err := ch.QueueDeclarePassive(wire.QueueUnrouted, true, false, false, false, nil); err != nil || q.Messages != count {
		t.Fatalf("mesh.unrouted holds %d, want %d: %v", q.Messages, count, err)
	}

	m := &brokerMesh{fakeMesh: &fakeMesh{}, url: url}
	c := &clock{now: time.Now()} // the reads stay fresh until the test moves it
	s, err := New(Config{Mesh: m, Addr: "127.0.0.1:1", Token: testToken, TokenName: "operator", Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// view asks for a page until it is shown: a read of gigabytes takes
	// longer than a page waits (the read goes on).
	view := func(path string) (int, string) {
		for {
			req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:1"+path, nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "still reading") {
				return rec.Code, rec.Body.String()
			}
		}
	}
	reads := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.kepts
	}

	defer debug.SetGCPercent(debug.SetGCPercent(100))
	L := uint64(8<<20 + 2*size + count*(2<<10))
	check := func(what string, h heaptest.Use, extra uint64) {
		t.Helper()
		bound := L + extra
		t.Logf("%s with %d unrouted events of %d KiB (%.0f MiB): the live heap grew by %.1f MiB, the heap in use by %.1f MiB from %.1f MiB; "+
			"L %.1f MiB, bound %.1f MiB", what, count, size>>10, float64(count)*float64(size)/(1<<20), mib(h.Live), mib(h.Grew), mib(h.Base), mib(bound), mib(h.Base+4*bound))
		if h.Grew > h.Base+4*bound {
			t.Errorf("%s: the heap in use grew by %.1f MiB, over %.1f MiB", what, mib(h.Grew), mib(h.Base+4*bound))
		}
	}

	var status int
	var page string
	check("a view of /unrouted", heaptest.Around(func() { status, page = view("/unrouted") }), 0)
	if status != http.StatusOK || !strings.Contains(page, fmt.Sprintf("%d unrouted events", count)) {
		t.Fatalf("/unrouted: %d %.500s", status, page)
	}
	_, group, _ := strings.Cut(page, `href="/unrouted/group/`)
	group, _, _ = strings.Cut(group, `"`)

	c.add(keptFresh + time.Second)
	var pages [4]int
	check("four views of /unrouted at once", heaptest.Around(func() {
		var wg sync.WaitGroup
		for i := range pages {
			wg.Go(func() { pages[i], _ = view("/unrouted") })
		}
		wg.Wait()
	}), 0)
	if pages != [4]int{200, 200, 200, 200} || reads() != 2 {
		t.Errorf("four views at once: %v, %d reads in all, want 2 (the first view's, and one for the four)", pages, reads())
	}

	c.add(keptFresh + time.Second)
	check("a view of a group's page", heaptest.Around(func() { status, page = view("/unrouted/group/" + group) }), 0)
	if status != http.StatusOK || strings.Count(page, `class="pick"`) != count/5 {
		t.Errorf("the group's page: %d, %d messages, want %d", status, strings.Count(page, `class="pick"`), count/5)
	}

	check("a view of the last message's page", heaptest.Around(func() { status, page = view("/unrouted/message/" + last) }), messageBodyShown)
	if status != http.StatusOK || !strings.Contains(page, fmt.Sprintf("of %d:", len(body))) {
		t.Errorf("the message's page: %d %.500s", status, page)
	}

	if q, err := ch.QueueDeclarePassive(wire.QueueUnrouted, true, false, false, false, nil); err != nil || q.Messages != count {
		t.Errorf("after the views mesh.unrouted holds %d, want %d: %v", q.Messages, count, err)
	}
}
