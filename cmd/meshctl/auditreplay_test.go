package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/replay"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// seen records the events a module handles, duplicates included.
type seen struct {
	mu  sync.Mutex
	evs []sdk.Event
	ch  chan struct{}
}

func newSeen() *seen { return &seen{ch: make(chan struct{}, 1)} }

func (s *seen) HandleEvent(_ context.Context, ev sdk.Event) error {
	s.mu.Lock()
	s.evs = append(s.evs, ev)
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
	return nil
}

// replayed returns the events handled that carry replay id.
func (s *seen) replayed(id string) []sdk.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sdk.Event
	for _, ev := range s.evs {
		if ev.Headers["x-replay-id"] == id {
			out = append(out, ev)
		}
	}
	return out
}

// waitReplayed waits until n events of replay id were handled.
func (s *seen) waitReplayed(ctx context.Context, t *testing.T, id string, n int) []sdk.Event {
	t.Helper()
	for {
		if got := s.replayed(id); len(got) >= n {
			return got
		}
		select {
		case <-s.ch:
		case <-ctx.Done():
			t.Fatalf("%d events of replay %s handled, want %d", len(s.replayed(id)), id, n)
		}
	}
}

// replayMesh is a node with an audit logger and two modules that take
// every mesh.order.# copy (duplicates allowed, to see replays).
type replayMesh struct {
	ctx            context.Context
	url            string
	node           *runtime.Node
	logger         *auditlogger.Logger
	billing, other *seen
	conn           *amqp.Connection
}

func newReplayMesh(t *testing.T) *replayMesh {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(context.Background()) })
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	rm := &replayMesh{ctx: ctx, url: url, node: node, logger: l, billing: newSeen(), other: newSeen()}
	for _, def := range []sdk.Module{l.Module(),
		{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("mesh.order.#", rm.billing, sdk.AllowDuplicates()) }},
		{Name: "other", Setup: func(m sdk.Mesh) error { return m.On("mesh.order.#", rm.other, sdk.AllowDuplicates()) }},
	} {
		mod, err := node.Load(ctx, def, runtime.ModuleConfig{Concurrency: 8, Prefetch: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mod.Stop(context.Background()) })
	}
	if rm.conn, err = amqp.Dial(url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rm.conn.Close() })
	return rm
}

// emit emits n orders and waits until the logger stored them.
func (rm *replayMesh) emit(t *testing.T, n int, typ string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id, err := rm.node.Emit(rm.ctx, "web", typ, map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rm.waitStored(t, ids...)
	return ids
}

// waitStored waits until the logger holds every id.
func (rm *replayMesh) waitStored(t *testing.T, ids ...string) {
	t.Helper()
	for {
		n, err := rm.logger.Store().Count(rm.ctx, store.Filter{IDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		if n == int64(len(ids)) {
			return
		}
		select {
		case <-rm.ctx.Done():
			t.Fatalf("the logger stored %d of %d events", n, len(ids))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (rm *replayMesh) log(f store.Filter, page int) *auditLog {
	return &auditLog{f: f, page: page, call: func(tool string, req, resp any) error { return rm.node.Call(rm.ctx, "meshctl", tool, req, resp) }}
}

// sentTimes are the send times the logger recorded for replay id, in
// the order of the events' arrival.
func (rm *replayMesh) sentTimes(t *testing.T, id string, ids []string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, eid := range ids {
		ev, err := rm.logger.Store().Get(rm.ctx, eid)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range ev.Fates {
			if f.Kind == store.FateReplayed && f.ReplayID == id {
				out = append(out, f.Time)
			}
		}
	}
	if len(out) != len(ids) {
		t.Fatalf("replay %s recorded %d sends of %d events", id, len(out), len(ids))
	}
	return out
}

// tap is a queue of the test's own, bound to mesh.events with pattern,
// read with raw amqp091-go.
func (rm *replayMesh) tap(t *testing.T, pattern string) (*amqp.Channel, amqp.Queue) {
	t.Helper()
	ch, err := rm.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, pattern, "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	return ch, q
}

// hookLog runs before before the log's second page is read.
type hookLog struct {
	replay.Log
	pages  int
	before func()
}

func (h *hookLog) Page(ctx context.Context, after, upTo int64) ([]replay.Event, int64, error) {
	if h.pages++; h.pages == 2 {
		h.before()
	}
	return h.Log.Page(ctx, after, upTo)
}

// TestReplayUpToItsCutoff: a replay sends exactly what the filter
// selected when it started, with the original ids, headers and bodies
// plus x-replay-id (read on the wire with raw amqp091-go); events stored
// while it runs, on pages it has yet to read, are not included; the
// logger stores no second row and records each send.
func TestReplayUpToItsCutoff(t *testing.T) {
	rm := newReplayMesh(t)
	tap, q := rm.tap(t, "mesh.order.#")
	originals := rm.emit(t, 6, "mesh.order.placed")
	var during []string
	log := &hookLog{Log: rm.log(store.Filter{Types: []string{"mesh.order.#"}}, 2), before: func() {
		during = rm.emit(t, 3, "mesh.order.placed") // stored before the second page is read
	}}
	res, err := replay.Run(rm.ctx, rm.conn, log, replay.Options{ID: ulid.Make().String()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 6 || res.Selected != 6 || len(during) != 3 {
		t.Fatalf("replay %+v with %d emitted during it; want the 6 before it", res, len(during))
	}
	got := rm.billing.waitReplayed(rm.ctx, t, res.ID, 6)
	var gotIDs []string
	for _, ev := range got {
		gotIDs = append(gotIDs, ev.ID)
		if ev.Source != "web" || ev.Node != "anchor" || ev.Type != "mesh.order.placed" {
			t.Errorf("replayed event %+v", ev)
		}
	}
	slices.Sort(gotIDs)
	if want := slices.Sorted(slices.Values(originals)); !slices.Equal(gotIDs, want) {
		t.Errorf("replayed %v, want %v", gotIDs, want)
	}

	// On the wire: 6 originals, 3 emitted during the replay, 6 replays.
	byID := map[string][]amqp.Delivery{}
	for range 15 {
		d := nextDelivery(t, rm.ctx, tap, q.Name)
		byID[d.MessageId] = append(byID[d.MessageId], d)
	}
	for i, id := range originals {
		copies := byID[id]
		if len(copies) != 2 {
			t.Fatalf("%s went %d times on the wire, want 2", id, len(copies))
		}
		first, again := copies[0], copies[1]
		if again.Headers["x-replay-id"] != res.ID || again.DeliveryMode != amqp.Persistent || again.ContentType != "application/json" ||
			string(again.Body) != fmt.Sprintf(`{"n":%d}`, i) || again.RoutingKey != "mesh.order.placed" {
			t.Errorf("replay of %s on the wire: %+v", id, again)
		}
		for _, h := range []string{"x-event-id", "x-source", "x-node", "x-time"} {
			if first.Headers[h] != again.Headers[h] {
				t.Errorf("replay of %s: %s %v, originally %v", id, h, again.Headers[h], first.Headers[h])
			}
		}
	}
	for _, id := range during {
		if len(byID[id]) != 1 {
			t.Errorf("%s, emitted during the replay, went %d times", id, len(byID[id]))
		}
	}
	rm.sentTimes(t, res.ID, originals) // each send recorded once
	if n, _ := rm.logger.Store().Count(rm.ctx, store.Filter{Types: []string{"mesh.order.#"}}); n != 9 {
		t.Errorf("%d rows, want 9: a replay is never a second row", n)
	}
	for _, id := range during {
		if ev, _ := rm.logger.Store().Get(rm.ctx, id); len(ev.Fates) != 0 {
			t.Errorf("%s, emitted during the replay, has fates %+v", id, ev.Fates)
		}
	}
}

func nextDelivery(t *testing.T, ctx context.Context, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nothing more in %s", queue)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestReplayPaces: each pace holds, read from the send times the logger
// recorded (lower bounds only: a busy machine may send later, never
// sooner). The original spacing is that of the events' x-time.
func TestReplayPaces(t *testing.T) {
	rm := newReplayMesh(t)
	ch, err := rm.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Add(-time.Hour)
	var spaced []string // emitted 200ms apart, by x-time
	for i := range 4 {
		id := ulid.Make().String()
		spaced = append(spaced, id)
		if err := ch.PublishWithContext(rm.ctx, "mesh.events", "mesh.order.spaced", false, false, amqp.Publishing{
			Headers:     amqp.Table{"x-event-id": id, "x-source": "legacy", "x-node": "far", "x-time": t0.Add(time.Duration(i) * 200 * time.Millisecond).Format(time.RFC3339Nano)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(`{}`),
		}); err != nil {
			t.Fatal(err)
		}
		rm.waitStored(t, id) // stored in this order: a replay goes in order of arrival
	}
	for _, c := range []struct {
		pace replay.Pace
		gap  time.Duration // at least, from the first send to each next
	}{
		{replay.Pace{Factor: 4}, 50 * time.Millisecond},
		{replay.Pace{Factor: 1}, 200 * time.Millisecond},
		{replay.Pace{Delay: 60 * time.Millisecond}, 60 * time.Millisecond},
		{replay.Pace{Rate: 25}, 40 * time.Millisecond},
	} {
		res, err := replay.Run(rm.ctx, rm.conn, rm.log(store.Filter{IDs: spaced}, 1000), replay.Options{ID: ulid.Make().String(), Pace: c.pace})
		if err != nil || res.Sent != 4 {
			t.Fatalf("replay at %+v: %+v, %v", c.pace, res, err)
		}
		sent := rm.sentTimes(t, res.ID, spaced)
		for i := 1; i < len(sent); i++ {
			if d := sent[i].Sub(sent[0]); d < time.Duration(i)*c.gap {
				t.Errorf("pace %+v: event %d sent %v after the first, want at least %v", c.pace, i, d, time.Duration(i)*c.gap)
			}
		}
	}
}

// TestReplayToOneModule: a replay to one module's queue reaches that
// module only, nothing through mesh.events; a queue that is not there is
// refused before anything is sent. Then `meshctl audit replay` itself:
// a dry run lists and sends nothing, a real one reports what it sent.
func TestReplayToOneModule(t *testing.T) {
	rm := newReplayMesh(t)
	ids := rm.emit(t, 2, "mesh.order.placed")
	tap, q := rm.tap(t, "#")
	res, err := replay.Run(rm.ctx, rm.conn, rm.log(store.Filter{IDs: ids}, 1000), replay.Options{ID: ulid.Make().String(), Queue: "anchor.billing.events"})
	if err != nil || res.Sent != 2 || res.Destination != "anchor.billing.events" {
		t.Fatalf("replay to billing: %+v, %v", res, err)
	}
	for _, ev := range rm.billing.waitReplayed(rm.ctx, t, res.ID, 2) {
		if ev.Type != "mesh.order.placed" || !slices.Contains(ids, ev.ID) {
			t.Errorf("billing got %+v", ev)
		}
	}
	// Every send was confirmed, so anything routed through mesh.events
	// would be in the tap by now.
	if got, err := tap.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil || got.Messages != 0 {
		t.Errorf("the tap on mesh.events holds %d (%v): the replay went through the exchange", got.Messages, err)
	}
	if got := rm.other.replayed(res.ID); len(got) != 0 {
		t.Errorf("another module got the replay: %+v", got)
	}
	if _, err := replay.Run(rm.ctx, rm.conn, rm.log(store.Filter{IDs: ids}, 1000), replay.Options{ID: ulid.Make().String(), Queue: "anchor.nobody.events"}); err == nil ||
		!strings.Contains(err.Error(), "does not exist") {
		t.Errorf("replay to a missing queue: %v", err)
	}

	bin := build(t)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(rm.ctx, bin, append([]string{"--amqp-url", rm.url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("meshctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	dry := run("audit", "replay", "--dry-run", "--type", "mesh.order.#")
	if !strings.Contains(dry, ids[0]) || !strings.Contains(dry, ids[1]) || !strings.Contains(dry, "would replay 2 events to mesh.events") {
		t.Errorf("dry run:\n%s", dry)
	}
	var out struct {
		ReplayID    string `json:"replay_id"`
		Destination string `json:"destination"`
		Sent        int    `json:"sent"`
	}
	if err := json.Unmarshal([]byte(run("audit", "replay", "--json", "--rate", "100", "--id", ids[0], "--target", "anchor.other")), &out); err != nil ||
		out.Sent != 1 || out.Destination != "anchor.other.events" {
		t.Fatalf("replay --json: %+v, %v", out, err)
	}
	if got := rm.other.waitReplayed(rm.ctx, t, out.ReplayID, 1); got[0].ID != ids[0] {
		t.Errorf("other got %+v", got)
	}
	if got := rm.billing.replayed(out.ReplayID); len(got) != 0 {
		t.Errorf("billing got the replay to other: %+v", got)
	}
	if _, err := exec.CommandContext(rm.ctx, bin, "--amqp-url", rm.url, "audit", "replay", "--delay", "1s", "--rate", "3").CombinedOutput(); err == nil {
		t.Error("two paces at once were accepted")
	}
}
