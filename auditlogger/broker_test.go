package auditlogger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

var buildLogger = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "mesh-audit-logger-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "audit-logger")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/audit-logger").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the audit logger: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := buildLogger(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// TestCompleteAcrossDuplicatesAndAKill: events from a module and from a
// raw amqp091-go publisher (each id published twice) are stored once
// each, also when the logger's module process is SIGKILLed mid-stream
// (meshd restarts it; what it had not acknowledged comes back).
func TestCompleteAcrossDuplicatesAndAKill(t *testing.T) {
	t.Parallel()
	bin, err := buildLogger()
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	db := filepath.Join(t.TempDir(), "audit.db")
	pm, err := node.LoadPlugin(ctx, bin, []string{"--db", db}, runtime.ModuleConfig{Concurrency: 32, ToolGrants: []string{"audit.*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Stop(context.Background())

	raw := brokertest.Channel(t, url)
	const perSource = 300
	publishRaw := func(i int, id string) {
		err := raw.PublishWithContext(ctx, "mesh.events", "mesh.raw.tick", false, false, amqp.Publishing{
			Headers:     amqp.Table{"x-event-id": id, "x-source": "legacy", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, UserId: "guest", Body: []byte(fmt.Sprintf(`{"i":%d}`, i)),
		})
		if err != nil {
			t.Error(err)
		}
	}
	count := func() int64 {
		var n int64
		// The node's own events (node.anchor.module.crashed, ...) are
		// recorded too: count the test's.
		mine := store.Filter{Types: []string{"mesh.raw.#", "mesh.emitted.#"}}
		if err := node.Call(ctx, "meshctl", auditlogger.ToolCount, mine, &n); err != nil {
			return -1 // the logger is restarting
		}
		return n
	}
	killed := false
	for i := range perSource {
		id := ulid.Make().String()
		publishRaw(i, id)
		publishRaw(i, id) // a resend: the same id
		if _, err := node.Emit(ctx, "test", "mesh.emitted.tick", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
		if i == perSource/2 && !killed {
			for count() < 50 {
				time.Sleep(20 * time.Millisecond)
			}
			if err := syscall.Kill(pm.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	want := int64(2 * perSource)
	deadline := time.Now().Add(60 * time.Second)
	var n int64
	for n = count(); n != want; n = count() {
		if n > want {
			t.Fatalf("%d rows for %d events: some stored twice", n, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows after 60s, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every delivery is settled (the queue is empty and nothing unacked),
	// so no late copy can add a row after this point.
	for {
		q, err := raw.QueueDeclarePassive("anchor.audit-logger.events", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still in the logger's queue", q.Messages)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := count(); n != want {
		t.Errorf("%d rows once the queue drained, want %d", n, want)
	}
	var byGuest int64 // the raw publisher set user-id; the node sets it on what it emits
	if err := node.Call(ctx, "meshctl", auditlogger.ToolCount, store.Filter{UserIDs: []string{"guest"}, Types: []string{"mesh.raw.#", "mesh.emitted.#"}}, &byGuest); err != nil || byGuest != want {
		t.Errorf("%d rows published by guest (%v), want %d", byGuest, err, want)
	}
	var crashes int64
	if err := node.Call(ctx, "meshctl", auditlogger.ToolCount, store.Filter{Types: []string{"node.anchor.module.crashed"}}, &crashes); err != nil || crashes != 1 {
		t.Errorf("the logger recorded %d crashes of itself (%v), want 1", crashes, err)
	}
	t.Logf("summary TestCompleteAcrossDuplicatesAndAKill: published=%d (raw, each twice) emitted=%d rows=%d lost=0", perSource, perSource, n)
}

// TestMalformedAndDeadLettersRecorded: with the logger as a module
// process, a message that breaks the contract (published with raw
// amqp091-go) is stored flagged with why, byte for byte, never skipped;
// and an event another module dead-letters shows where it died.
func TestMalformedAndDeadLettersRecorded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, node := nodeWithLogger(ctx, t)
	ledger, err := node.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.bill.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return sdk.Permanent(errors.New("ledger closed")) }))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Stop(context.Background())

	raw := brokertest.Channel(t, url)
	body := []byte("\x00not json")
	if err := raw.PublishWithContext(ctx, "mesh.events", "mesh.raw.bad", false, false, amqp.Publishing{
		Headers: amqp.Table{"x-source": "forged", "x-time": int64(7)}, ContentType: "text/plain", DeliveryMode: amqp.Persistent, Body: body,
	}); err != nil {
		t.Fatal(err)
	}
	bill, err := node.Emit(ctx, "test", "mesh.bill.due", map[string]int{"amount": 3})
	if err != nil {
		t.Fatal(err)
	}

	yes := true
	var page auditlogger.QueryResponse
	for {
		page = auditlogger.QueryResponse{}
		q := auditlogger.QueryRequest{Filter: store.Filter{Any: []store.Filter{{Malformed: &yes}, {Dead: &yes}}}}
		if err := node.Call(ctx, "meshctl", auditlogger.ToolQuery, q, &page); err != nil && ctx.Err() != nil {
			t.Fatal(err)
		}
		if len(page.Events) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("recorded %+v, want the malformed message and the dead letter", page.Events)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, ev := range page.Events {
		switch ev.Type {
		case "mesh.raw.bad":
			if ev.Malformed == "" || string(ev.Body) != string(body) || ev.Headers["x-source"] != "forged" || ev.Headers["x-time"] != "7" ||
				ev.Headers["content-type"] != "text/plain" || len(ev.Fates) != 1 || ev.Fates[0].Queue != "anchor.audit-logger.events" ||
				ev.Fates[0].Reason != "malformed" {
				t.Errorf("malformed message stored as %+v", ev)
			}
		case "mesh.bill.due":
			if ev.ID != bill || ev.Malformed != "" || len(ev.Fates) != 1 || ev.Fates[0].Queue != "anchor.ledger.events" ||
				ev.Fates[0].Reason != "permanent" || ev.Fates[0].Error == "" {
				t.Errorf("dead-lettered event stored as %+v", ev)
			}
		default:
			t.Errorf("unexpected event %+v", ev)
		}
	}
	var tr store.Trace
	if err := node.Call(ctx, "meshctl", auditlogger.ToolTrace, auditlogger.TraceRequest{ID: bill}, &tr); err != nil ||
		tr.Root == nil || len(tr.Root.Event.Fates) != 1 {
		t.Errorf("trace of the dead-lettered event: %+v, %v", tr, err)
	}
}

// TestConflictRecordedAsAFate: an outside publisher (raw amqp091-go)
// sends an event id, then the same id with another body. The ledger
// module handles the first and dead-letters the second as a conflict; the
// audit logger (a module process) keeps the event and the conflict as a
// fate of it, with both digests in its error.
func TestConflictRecordedAsAFate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, node := nodeWithLogger(ctx, t)
	ledger, err := node.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.orders.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
	}}, runtime.ModuleConfig{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Stop(context.Background())

	raw := brokertest.Channel(t, url)
	id := ulid.Make().String()
	for _, body := range []string{`{"amount":10}`, `{"amount":99}`} {
		if err := raw.PublishWithContext(ctx, "mesh.events", "mesh.orders.placed", false, false, amqp.Publishing{
			Headers:     amqp.Table{"x-event-id": id, "x-source": "shop", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(body),
		}); err != nil {
			t.Fatal(err)
		}
	}
	yes := true
	var page auditlogger.QueryResponse
	poll(t, 30*time.Second, "the event with its conflict recorded", func() bool {
		page = auditlogger.QueryResponse{}
		q := auditlogger.QueryRequest{Filter: store.Filter{Dead: &yes}}
		err := node.Call(ctx, "meshctl", auditlogger.ToolQuery, q, &page)
		return err == nil && len(page.Events) == 1
	})
	// The logger's own queue takes both copies (it allows duplicates and
	// keeps each id once): which body it keeps is whichever it stored
	// first, at its concurrency.
	ev := page.Events[0]
	if ev.ID != id || (string(ev.Body) != `{"amount":10}` && string(ev.Body) != `{"amount":99}`) || len(ev.Fates) != 1 {
		t.Fatalf("stored %+v, want %s with one of its bodies and one fate", ev, id)
	}
	if f := ev.Fates[0]; f.Reason != "conflict" || f.Queue != "anchor.ledger.events" || !strings.Contains(f.Error, "this copy's digest is") {
		t.Errorf("fate %+v, want the ledger's conflict naming both digests", f)
	}
}

// nodeWithLogger starts a node "anchor" on a virtual host of its own with
// the audit logger as a module process (its tools granted), both stopped
// when the test ends, and returns the host's URL and the node.
func nodeWithLogger(ctx context.Context, t *testing.T) (string, *runtime.Node) {
	t.Helper()
	bin, err := buildLogger()
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(context.Background()) })
	pm, err := node.LoadPlugin(ctx, bin, []string{"--db", filepath.Join(t.TempDir(), "audit.db")}, runtime.ModuleConfig{Concurrency: 8, ToolGrants: []string{"audit.*"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Stop(context.Background()) })
	return url, node
}
