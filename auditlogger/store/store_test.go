package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

func open(t testing.TB) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func event(i int, typ string) Event {
	return Event{
		ID: fmt.Sprintf("01JAUDIT%018d", i), Type: typ, Source: "umami", Node: "anchor",
		Time: t0.Add(time.Duration(i) * time.Second), Headers: map[string]string{"x-event-id": fmt.Sprintf("01JAUDIT%018d", i), "x-tenant": "acme"},
		Body: []byte(fmt.Sprintf(`{"n":%d,"order":{"tier":"gold","items":[{"sku":"a%d"}]}}`, i, i)), Arrived: t0.Add(time.Hour),
	}
}

// TestAddStoresEachIDOnce: an id added again (a redelivery, a resend, a
// replay), in the same batch or later, is not a second row; what is stored
// comes back whole, JSON or not, after the store is closed and opened
// again.
func TestAddStoresEachIDOnce(t *testing.T) {
	s, path := open(t)
	ctx := context.Background()
	a, b := event(1, "module.umami.site.created"), event(2, "module.umami.site.deleted")
	b.UserID, b.Redelivered, b.CausationID, b.Schema = "publisher", true, a.ID, "2"
	bad := Event{ID: "not-a-ulid", Type: "mesh.x.y", Body: []byte{0xff, 0x00, '{'}, Malformed: "x-event-id is not a ULID", Arrived: t0}
	if n, err := s.Add(ctx, a, b, a, bad); err != nil || n != 3 {
		t.Fatalf("added %d, %v; want 3", n, err)
	}
	if n, err := s.Add(ctx, b); err != nil || n != 0 {
		t.Fatalf("added again %d, %v; want 0", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash == "" {
		t.Error("the stored event has no hash")
	}
	got.Seq, got.Hash = 0, "" // the store's, not the event's
	if fmt.Sprint(got) != fmt.Sprint(b) {
		t.Errorf("stored\n%+v\ngot back\n%+v", b, got)
	}
	raw, err := s.Get(ctx, bad.ID)
	if err != nil || string(raw.Body) != string(bad.Body) || raw.Malformed != bad.Malformed {
		t.Errorf("malformed event came back as %+v, %v", raw, err)
	}
	if _, err := s.Get(ctx, "01JNOPE"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get of an unknown id: %v", err)
	}
	if st, err := s.Stats(ctx); err != nil || st.Events != 3 || st.Malformed != 1 || st.Bytes <= 0 {
		t.Errorf("stats %+v, %v", st, err)
	}
}

// TestConcurrentAddsShareTransactions: many callers at once each get their
// own count back, and every row is stored.
func TestConcurrentAddsShareTransactions(t *testing.T) {
	s, _ := open(t)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for g := range 50 {
		wg.Go(func() {
			for i := range 20 {
				ev := event(g*20+i, "mesh.load.tick")
				if n, err := s.Add(context.Background(), ev, ev); err != nil || n != 1 {
					errs <- fmt.Errorf("add %d: %d, %v", g*20+i, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, err := s.Count(context.Background(), Filter{}); err != nil || n != 1000 {
		t.Errorf("count %d, %v; want 1000", n, err)
	}
}

// TestFilters: each filter alone, together (AND), as alternatives (Any),
// and pages that walk the whole selection in order.
func TestFilters(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	var all []Event
	for i := range 30 {
		typ := []string{"module.umami.site.created", "module.billing.invoice.sent", "node.anchor.joined"}[i%3]
		ev := event(i, typ)
		if i%5 == 0 {
			ev.Source, ev.Node, ev.UserID = "billing", "harbor", "svc-billing"
			ev.Headers["x-tenant"] = "globex"
		}
		if i == 7 {
			ev.CausationID = all[3].ID
			ev.Malformed = "x-time is missing"
		}
		all = append(all, ev)
	}
	if _, err := s.Add(ctx, all...); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	want := func(cond func(i int, ev Event) bool) []string {
		var ids []string
		for i, ev := range all {
			if cond(i, ev) {
				ids = append(ids, ev.ID)
			}
		}
		return ids
	}
	for name, c := range map[string]struct {
		f    Filter
		want []string
	}{
		"all":         {Filter{}, want(func(int, Event) bool { return true })},
		"time range":  {Filter{From: t0.Add(10 * time.Second), To: t0.Add(13 * time.Second)}, want(func(i int, _ Event) bool { return i >= 10 && i < 13 })},
		"type #":      {Filter{Types: []string{"module.#"}}, want(func(i int, _ Event) bool { return i%3 != 2 })},
		"type *":      {Filter{Types: []string{"*.*.site.*"}}, want(func(i int, _ Event) bool { return i%3 == 0 })},
		"two types":   {Filter{Types: []string{"node.*.joined", "module.billing.#"}}, want(func(i int, _ Event) bool { return i%3 != 0 })},
		"source":      {Filter{Sources: []string{"billing"}}, want(func(i int, _ Event) bool { return i%5 == 0 })},
		"node":        {Filter{Nodes: []string{"harbor"}}, want(func(i int, _ Event) bool { return i%5 == 0 })},
		"user":        {Filter{UserIDs: []string{"svc-billing"}}, want(func(i int, _ Event) bool { return i%5 == 0 })},
		"id":          {Filter{IDs: []string{all[4].ID, all[9].ID}}, []string{all[4].ID, all[9].ID}},
		"causation":   {Filter{CausationIDs: []string{all[3].ID}}, []string{all[7].ID}},
		"header":      {Filter{Headers: map[string]string{"x-tenant": "globex"}}, want(func(i int, _ Event) bool { return i%5 == 0 })},
		"body number": {Filter{Body: map[string]string{"n": "12"}}, []string{all[12].ID}},
		"body nested": {Filter{Body: map[string]string{"order.items.0.sku": `"a13"`}}, []string{all[13].ID}},
		"body string": {Filter{Body: map[string]string{"order.tier": `"gold"`}}, want(func(int, Event) bool { return true })},
		"malformed":   {Filter{Malformed: &yes}, []string{all[7].ID}},
		"well formed": {Filter{Malformed: &no, Sources: []string{"billing"}}, want(func(i int, _ Event) bool { return i%5 == 0 })},
		"and":         {Filter{Sources: []string{"billing"}, Types: []string{"node.#"}}, want(func(i int, _ Event) bool { return i%5 == 0 && i%3 == 2 })},
		"any":         {Filter{Any: []Filter{{Types: []string{"node.#"}}, {Sources: []string{"billing"}}}}, want(func(i int, _ Event) bool { return i%5 == 0 || i%3 == 2 })},
		"and any": {Filter{Nodes: []string{"anchor"}, Any: []Filter{{IDs: []string{all[1].ID}}, {Body: map[string]string{"n": "2"}}}},
			[]string{all[1].ID, all[2].ID}},
	} {
		// Every page, oldest first or newest first, 4 events a page.
		pageAll := func(newest bool) []string {
			var ids []string
			var after int64
			for pages := 0; ; pages++ {
				evs, next, err := s.Query(ctx, c.f, Page{After: after, Limit: 4, Newest: newest})
				if err != nil {
					t.Fatalf("%s (newest first %v): %v", name, newest, err)
				}
				for _, ev := range evs {
					ids = append(ids, ev.ID)
				}
				if next == 0 {
					return ids
				}
				if pages > 10 {
					t.Fatalf("%s (newest first %v): pages never end", name, newest)
				}
				after = next
			}
		}
		got := pageAll(false)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %d events %v, want %d %v", name, len(got), got, len(c.want), c.want)
		}
		// Newest first: the same events, the other way, paged the same.
		back := pageAll(true)
		slices.Reverse(back)
		if !slices.Equal(back, c.want) {
			t.Errorf("%s newest first, reversed: got %v, want %v", name, back, c.want)
		}
		if n, err := s.Count(ctx, c.f); err != nil || n != int64(len(c.want)) {
			t.Errorf("%s: count %d, %v; want %d", name, n, err, len(c.want))
		}
	}
	for _, bad := range []Filter{{Types: []string{"a..b"}}, {Body: map[string]string{"n": "not json"}}, {Body: map[string]string{"a..b": "1"}}} {
		if _, _, err := s.Query(ctx, bad, Page{}); !errors.Is(err, ErrBadFilter) {
			t.Errorf("filter %+v: %v, want ErrBadFilter", bad, err)
		}
	}
}

// TestMatchTopic: the store's topic matching, rule by rule, is the
// runtime's.
func TestMatchTopic(t *testing.T) {
	for _, c := range []struct {
		pattern, eventType string
		want               bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"a", "a.b", false},
		{"a.b", "a", false},
		{"a", "", false},
		{"*", "", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.*", "a.b", true},
		{"a.*", "a.b", true},
		{"a.*", "a", false},
		{"#", "", true},
		{"#", "a", true},
		{"#", "a.b.c", true},
		{"#.#", "", true},
		{"#.#.#", "a.b", true},
		{"a.#", "a", true},
		{"a.#", "a.b.c", true},
		{"a.#", "b.a", false},
		{"#.a", "a", true},
		{"#.a", "b.a", true},
		{"#.a", "a.b", false},
		{"a.#.c", "a.c", true},
		{"a.#.c", "a.b.b.c", true},
		{"a.#.c", "a.c.b", false},
		{"*.#.*", "a", false},
		{"*.#.*", "a.b", true},
		{"#.*", "", false},
		{"#.*.#", "a", true},
		{"a.#.b.#", "a.x.b.y.b", true},
		{"a.#.b.#.c", "a.b.c.b.x", false},
		{"#.a.#.a", "a.a.b.a", true},
		{"#.a.*.b", "a.a.x.b", true},
		{"#.a.*.b", "a.x.a.b", false},
		{"#.b", strings.Repeat("a.", 30) + "a", false},
		// Empty words in the type are words, as the broker splits them.
		{"*", ".", false},
		{"*.*", ".", true},
		{"a.*", "a.", true},
		{"#.b", "a..b", true},
		{"a.*.b", "a..b", true},
	} {
		if got := matchTopic(c.pattern, c.eventType); got != c.want {
			t.Errorf("matchTopic(%q, %q) = %v, want %v", c.pattern, c.eventType, got, c.want)
		}
		if rt := wire.MatchPattern(c.pattern, c.eventType); rt != c.want {
			t.Errorf("wire.MatchPattern(%q, %q) = %v, the table says %v", c.pattern, c.eventType, rt, c.want)
		}
	}
}

// TestMatchTopicIsPolynomial: patterns that made the recursive matcher
// backtrack exponentially (every way of sharing the type's words out among
// the "#"s, when the last word never matches) take at most (p+1)×(t+1)
// steps for p pattern words and t type words, and allocate nothing. Steps,
// not time, so a slow machine cannot fail it.
func TestMatchTopicIsPolynomial(t *testing.T) {
	long := strings.TrimSuffix(strings.Repeat("a.", 240), ".")
	for _, c := range []struct {
		pattern, eventType string
		want               bool
	}{
		{"#.a.#.a.#.a.#.a.#.a.#.a.#.b", long, false},
		{strings.Repeat("#.a.", 20) + "b", long, false},
		{strings.Repeat("#.*.", 20) + "b", long, false},
		{strings.Repeat("#.", 20) + "b", long, false},
		{strings.Repeat("#.#.a.", 10) + "#.b", long, false},
		{"#.a.#.a.#.a.#.a.#.a.#.a.#.b", long + ".b", true},
		{"#.a.#.a.#.a.#.a.#.a.#.a.#.a", long, true},
		{strings.Repeat("a.", 100) + "#", long, true},
		{"#." + strings.Repeat("a.", 100) + "b", long, false},
	} {
		got, steps := matchTopicSteps(c.pattern, c.eventType)
		if got != c.want {
			t.Errorf("matchTopic(%.40q..., %d words) = %v, want %v", c.pattern, countWords(c.eventType), got, c.want)
		}
		if rt := wire.MatchPattern(c.pattern, c.eventType); rt != c.want {
			t.Errorf("wire.MatchPattern(%.40q..., %d words) = %v, want %v", c.pattern, countWords(c.eventType), rt, c.want)
		}
		p, n := countWords(c.pattern), countWords(c.eventType)
		if bound := (p + 1) * (n + 1); steps > bound {
			t.Errorf("matchTopic(%.40q..., %d words) took %d steps, more than (%d+1)×(%d+1) = %d", c.pattern, n, steps, p, n, bound)
		}
		if allocs := testing.AllocsPerRun(10, func() { matchTopic(c.pattern, c.eventType) }); allocs != 0 {
			t.Errorf("matchTopic(%.40q..., %d words) allocates %v times", c.pattern, n, allocs)
		}
	}
}

// countWords counts the words of a pattern or type; "" has none.
func countWords(s string) int {
	if s == "" {
		return 0
	}
	return strings.Count(s, ".") + 1
}

// FuzzMatchTopic: the store's topic matching is the runtime's, and takes
// at most (p+1)×(t+1) steps.
func FuzzMatchTopic(f *testing.F) {
	for _, s := range [][2]string{
		{"#", "a.b"}, {"a.*", "a.b"}, {"a.#.c", "a.c"}, {"*.#.*", "a"}, {"#.#", ""}, {"a.#.b.#", "a.x.b.y.b"},
		{"#.a.#.a.#.a.#.b", "a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a"}, {"#.a.*.b", "a.x.a.b"}, {"a.*", "a."}, {"#.b", "a..b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, eventType string) {
		if len(pattern) > 256 || len(eventType) > 256 || checkPattern(pattern) != nil {
			return // the store refuses such patterns before matching
		}
		got, steps := matchTopicSteps(pattern, eventType)
		if want := wire.MatchPattern(pattern, eventType); got != want {
			t.Fatalf("matchTopic(%q, %q) = %v, the runtime says %v", pattern, eventType, got, want)
		}
		if p, n := countWords(pattern), countWords(eventType); steps > (p+1)*(n+1) {
			t.Fatalf("matchTopic(%q, %q) took %d steps, more than (%d+1)×(%d+1)", pattern, eventType, steps, p, n)
		}
	})
}

// BenchmarkAdd is the store's ingest rate with 32 concurrent writers, one
// event each per call, as the audit logger's handlers add them.
func BenchmarkAdd(b *testing.B) {
	s, _ := open(b)
	b.SetParallelism(16) // 2 cores x 16 = 32 writers
	var next sync.Mutex
	i := 0
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			next.Lock()
			i++
			ev := event(i, "module.umami.site.created")
			next.Unlock()
			if _, err := s.Add(context.Background(), ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// TestTrace: the causal tree of an event three levels deep, its causes
// above it, a cause the store does not hold, and the depth limit.
func TestTrace(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	mk := func(i int, cause string) Event {
		ev := event(i, "mesh.chain.step")
		ev.CausationID = cause
		return ev
	}
	//          0 (caused by an event not held)
	//          └─ 1
	//             ├─ 2
	//             │  └─ 4
	//             └─ 3
	e0 := mk(0, "01JGONE0000000000000000000")
	e1 := mk(1, e0.ID)
	e2, e3 := mk(2, e1.ID), mk(3, e1.ID)
	e4 := mk(4, e2.ID)
	other := mk(5, "")
	if _, err := s.Add(ctx, e0, e1, e2, e3, e4, other); err != nil {
		t.Fatal(err)
	}
	tr, err := s.Trace(ctx, e1.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Causes) != 1 || tr.Causes[0].ID != e0.ID || tr.MissingCause != e0.CausationID || tr.Truncated {
		t.Errorf("causes %+v, missing %q, truncated %v", tr.Causes, tr.MissingCause, tr.Truncated)
	}
	r := tr.Root
	if r.Event.ID != e1.ID || len(r.Caused) != 2 || r.Caused[0].Event.ID != e2.ID || r.Caused[1].Event.ID != e3.ID ||
		len(r.Caused[0].Caused) != 1 || r.Caused[0].Caused[0].Event.ID != e4.ID || len(r.Caused[1].Caused) != 0 {
		t.Errorf("tree below %s is wrong", e1.ID)
	}
	shallow, err := s.Trace(ctx, e1.ID, 1)
	if err != nil || !shallow.Truncated || len(shallow.Root.Caused) != 2 || len(shallow.Root.Caused[0].Caused) != 0 {
		t.Errorf("depth 1: %+v, %v", shallow, err)
	}
	leaf, err := s.Trace(ctx, e4.ID, 4)
	if err != nil || leaf.Truncated || len(leaf.Root.Caused) != 0 || len(leaf.Causes) != 3 || leaf.Causes[2].ID != e0.ID {
		t.Errorf("the leaf at depth 4: %+v, %v; want three causes, nothing below, not truncated", leaf, err)
	}
	if _, err := s.Trace(ctx, "01JNOPE", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("trace of an unknown id: %v", err)
	}
}

// TestPrune: retention by arrival drops exactly the events that arrived
// before the cutoff, oldest first, while another writer goes on adding;
// retention by size drops the oldest until the rows fit.
func TestPrune(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	var evs []Event
	for i := range 2500 {
		ev := event(i, "mesh.old.tick")
		ev.Arrived = t0.Add(time.Duration(i) * time.Second)
		ev.Body = []byte(fmt.Sprintf(`{"pad":"%0400d"}`, i))
		evs = append(evs, ev)
	}
	if _, err := s.Add(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	added := 0
	wg.Go(func() { // ingestion goes on during the prune
		for i := 10000; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ev := event(i, "mesh.new.tick")
			ev.Arrived = t0.Add(24 * time.Hour)
			if _, err := s.Add(ctx, ev); err != nil {
				t.Error(err)
				return
			}
			added++
		}
	})
	n, err := s.Prune(ctx, Retention{Before: t0.Add(2000 * time.Second)})
	close(stop)
	wg.Wait()
	if err != nil || n != 2000 {
		t.Fatalf("pruned %d, %v; want 2000", n, err)
	}
	old, _ := s.Count(ctx, Filter{Types: []string{"mesh.old.#"}})
	fresh, _ := s.Count(ctx, Filter{Types: []string{"mesh.new.#"}})
	if old != 500 || fresh != int64(added) {
		t.Errorf("kept %d old and %d new, want 500 and %d", old, fresh, added)
	}
	first, _, err := s.Query(ctx, Filter{}, Page{Limit: 1})
	if err != nil || len(first) != 1 || first[0].ID != evs[2000].ID {
		t.Errorf("oldest kept %+v, want %s", first, evs[2000].ID)
	}

	used, err := s.usedBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, Retention{MaxBytes: used / 2}); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.usedBytes(ctx); after > used/2 {
		t.Errorf("%d bytes in use after pruning to %d", after, used/2)
	}
	if n, _ := s.Count(ctx, Filter{}); n == 0 {
		t.Error("size retention dropped everything")
	}
	if got, err := s.Get(ctx, evs[2000].ID); err == nil {
		t.Errorf("the oldest event %s survived size retention", got.ID)
	}
}

// TestEventJSON: an event's JSON carries a JSON body as JSON and any other
// body in base64, and reads back the same.
func TestEventJSON(t *testing.T) {
	for _, body := range [][]byte{[]byte(`{"a":[1,2]}`), {0xff, '{'}, nil} {
		ev := event(1, "mesh.x.y")
		ev.Body = body
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if json.Valid(body) && !strings.Contains(string(b), `"body":{"a":[1,2]}`) {
			t.Errorf("JSON body not inline: %s", b)
		}
		var back Event
		if err := json.Unmarshal(b, &back); err != nil || string(back.Body) != string(body) || back.ID != ev.ID || back.Headers["x-tenant"] != "acme" {
			t.Errorf("%q came back as %+v, %v", body, back, err)
		}
	}
}

// TestFates: a dead letter and a replay are stored once each, however
// often they are added, with or without their event; Get, Query and the
// Dead filter see them; UpTo cuts at a Seq; retention drops an event's
// fates with it.
func TestFates(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	a, b, c := event(1, "mesh.a.x"), event(2, "mesh.a.x"), event(3, "mesh.a.x")
	a.Arrived, b.Arrived, c.Arrived = t0, t0.Add(time.Second), t0.Add(2*time.Second)
	if _, err := s.Add(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	died := Fate{EventID: a.ID, Kind: FateDead, Queue: "anchor.ledger.events", Reason: "permanent", Error: "no", Attempts: 1, Time: t0.Add(time.Minute)}
	replayed := Fate{EventID: a.ID, Kind: FateReplayed, Queue: "mesh.events", ReplayID: "r1", Time: t0.Add(time.Hour)}
	for range 2 {
		if _, err := s.AddFates(ctx, []Fate{died, replayed}, a); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AddFates(ctx, []Fate{{EventID: a.ID, Kind: "lost"}}); err == nil {
		t.Error("a fate of an unknown kind was accepted")
	}
	got, err := s.Get(ctx, a.ID)
	if err != nil || len(got.Fates) != 2 || got.Fates[0] != died || got.Fates[1] != replayed {
		t.Fatalf("fates of a: %+v, %v", got.Fates, err)
	}
	yes, no := true, false
	if evs, _, err := s.Query(ctx, Filter{Dead: &yes}, Page{}); err != nil || len(evs) != 1 || evs[0].ID != a.ID || len(evs[0].Fates) != 2 {
		t.Errorf("dead events: %+v, %v", evs, err)
	}
	if n, err := s.Count(ctx, Filter{Dead: &no}); err != nil || n != 1 {
		t.Errorf("events not dead: %d, %v", n, err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.DeadLetters != 1 || st.Replayed != 1 || st.LastSeq != got.Seq+1 {
		t.Errorf("stats %+v, %v", st, err)
	}
	cutoff := st.LastSeq
	if _, err := s.Add(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Count(ctx, Filter{UpTo: cutoff}); err != nil || n != 2 {
		t.Errorf("events up to the cutoff: %d, %v; want 2", n, err)
	}
	if n, err := s.Prune(ctx, Retention{Before: t0.Add(time.Millisecond)}); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if st, _ := s.Stats(ctx); st.DeadLetters != 0 || st.Replayed != 0 {
		t.Errorf("fates of a pruned event kept: %+v", st)
	}
}
