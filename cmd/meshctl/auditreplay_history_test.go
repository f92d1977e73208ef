package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// historyMesh is a node that keeps the mesh's history on a stream of its
// own virtual host, a raw connection that publishes with confirms (a
// confirmed event is in the stream), and a meshctl binary to run.
type historyMesh struct {
	ctx    context.Context
	url    string
	node   *runtime.Node
	conn   *amqp.Connection
	pub    *amqp.Channel
	bin    string
	config string // a node config naming the stream
}

const historyStreamName = "mesh.history"

func newHistoryMesh(t *testing.T) *historyMesh {
	t.Helper()
	hm := &historyMesh{url: brokertest.VHost(t), bin: build(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	hm.ctx = ctx
	var err error
	hm.node, err = runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: hm.url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), History: runtime.HistoryConfig{Stream: historyStreamName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hm.node.Close(context.Background()) })
	if hm.conn, err = amqp.Dial(hm.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hm.conn.Close() })
	if hm.pub, err = hm.conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := hm.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	hm.config = filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(hm.config, []byte("node: anchor\nhistory:\n  stream: "+historyStreamName+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return hm
}

// publish sends one message to mesh.events and waits for the confirm.
func (hm *historyMesh) publish(t *testing.T, typ string, msg amqp.Publishing) {
	t.Helper()
	dc, err := hm.pub.PublishWithDeferredConfirmWithContext(hm.ctx, "mesh.events", typ, false, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(hm.ctx); err != nil || !ok {
		t.Fatalf("publish %s: confirmed %v, %v", typ, ok, err)
	}
}

// event emits an event of type typ whose x-time says at.
func (hm *historyMesh) event(t *testing.T, typ string, at time.Time) string {
	t.Helper()
	id := ulid.Make().String()
	hm.publish(t, typ, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, UserId: "guest",
		Headers: amqp.Table{"x-event-id": id, "x-source": "legacy", "x-node": "far", "x-time": at.UTC().Format(time.RFC3339Nano)},
		Body:    []byte(fmt.Sprintf(`{"id":%q}`, id))})
	return id
}

// meshctl runs the binary against the virtual host.
func (hm *historyMesh) meshctl(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(hm.ctx, hm.bin, append([]string{"--amqp-url", hm.url}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func (hm *historyMesh) run(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := hm.meshctl(args...)
	if err != nil {
		t.Fatalf("meshctl %v: %v\n%s%s", args, err, stdout, stderr)
	}
	return stdout, stderr
}

// tap is a queue of the test's own bound to mesh.events with pattern.
func (hm *historyMesh) tap(t *testing.T, pattern string) (*amqp.Channel, string) {
	t.Helper()
	ch, err := hm.conn.Channel()
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
	return ch, q.Name
}

// drain takes the n messages the tap holds, and fails if it holds
// another number: every send was confirmed, so all are there by now.
func drainTap(t *testing.T, ch *amqp.Channel, queue string, n int) []amqp.Delivery {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	if err != nil || q.Messages != n {
		t.Fatalf("the tap holds %d messages (%v), want %d", q.Messages, err, n)
	}
	var out []amqp.Delivery
	for range n {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get from the tap: %v, %v", ok, err)
		}
		out = append(out, d)
	}
	return out
}

// listedIDs are the ids a dry run --json listed, in order.
func listedIDs(t *testing.T, out string) []string {
	t.Helper()
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.ID == "" {
			t.Fatalf("dry run --json line %q: %v", sc.Text(), err)
		}
		ids = append(ids, ev.ID)
	}
	return ids
}

// TestAuditReplayHistory: `meshctl audit replay --history` sends exactly
// the events of the window (by x-time) and type the stream held when it
// started, with their ids and bodies plus x-replay-id (on the wire, with
// raw amqp091-go), with no audit logger running; a dry run lists exactly
// them, the stream named by --config or --stream; the replay's own sends,
// in the stream after its cutoff, are never replayed; a message that
// breaks the contract is skipped; the filters the stream cannot apply are
// refused.
func TestAuditReplayHistory(t *testing.T) {
	hm := newHistoryMesh(t)
	t0 := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Second)
	from, to := t0.Add(time.Hour), t0.Add(2*time.Hour)
	window := []string{"--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339)}
	hm.event(t, "mesh.order.placed", from.Add(-time.Minute))
	want := []string{
		hm.event(t, "mesh.order.placed", from),
		hm.event(t, "mesh.order.paid", from.Add(30*time.Minute)),
	}
	hm.event(t, "mesh.stock.moved", from.Add(10*time.Minute)) // another type
	malformed := ulid.Make().String()
	hm.publish(t, "mesh.order.placed", amqp.Publishing{ContentType: "application/json", MessageId: malformed, Body: []byte(`not json`),
		Headers: amqp.Table{"x-event-id": malformed, "x-source": "legacy", "x-node": "far", "x-time": from.Add(time.Minute).Format(time.RFC3339Nano)}})
	want = append(want, hm.event(t, "mesh.order.placed", from.Add(59*time.Minute)))
	hm.event(t, "mesh.order.placed", to)

	// Refused before anything is done.
	for _, args := range [][]string{
		{"--causation", want[0]}, {"--header", "x-tenant=acme"}, {"--body", "id=1"}, {"--malformed"}, {"--dead"},
	} {
		_, stderr, err := hm.meshctl(append([]string{"audit", "replay", "--history", "--stream", historyStreamName}, args...)...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(stderr, args[0]) {
			t.Errorf("--history %v: %v\n%s", args, err, stderr)
		}
	}
	noHistory := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(noHistory, []byte("node: anchor\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--history"},                             // no stream named
		{"--history", "--config", noHistory},      // a config that keeps none
		{"--stream", historyStreamName},           // --stream without --history
		{"--history", "--stream", "bad name"},     // not a queue name
		{"--history", "--stream", "mesh.nowhere"}, // not there: fails, not a usage error
	} {
		_, stderr, err := hm.meshctl(append([]string{"audit", "replay", "--dry-run"}, args...)...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || (args[len(args)-1] != "mesh.nowhere") != (ee.ExitCode() == exitUsage) {
			t.Errorf("%v: %v\n%s", args, err, stderr)
		}
	}

	// A dry run lists the window, the stream named by the config.
	out, _ := hm.run(t, append([]string{"audit", "replay", "--history", "--config", hm.config, "--dry-run", "--json", "--type", "mesh.order.#"}, window...)...)
	if got := listedIDs(t, out); !slices.Equal(got, want) {
		t.Errorf("dry run listed %v, want %v", got, want)
	}
	out, _ = hm.run(t, append([]string{"audit", "replay", "--history", "--stream", historyStreamName, "--dry-run", "--type", "mesh.order.#"}, window...)...)
	if !strings.Contains(out, "would replay 3 events to mesh.events (cutoff: offset ") || !strings.Contains(out, "of stream mesh.history); nothing sent") {
		t.Errorf("dry run:\n%s", out)
	}
	for _, id := range want {
		if !strings.Contains(out, id) {
			t.Errorf("dry run does not list %s:\n%s", id, out)
		}
	}

	// The replay, a page at a time: what it sent on the first page is in
	// the stream before it reads the second.
	tap, q := hm.tap(t, "mesh.order.#")
	out, stderr := hm.run(t, append([]string{"audit", "replay", "--history", "--config", hm.config, "--json", "--page", "1", "--rate", "200", "--type", "mesh.order.#"}, window...)...)
	var res struct {
		ReplayID    string `json:"replay_id"`
		Destination string `json:"destination"`
		Stream      string `json:"stream"`
		Sent        int    `json:"sent"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Sent != 3 || res.Destination != "mesh.events" || res.Stream != historyStreamName {
		t.Fatalf("replay --json: %+v, %v\n%s", res, err, out)
	}
	if !strings.Contains(stderr, "no audit logger answers") {
		t.Errorf("stderr without an audit logger: %s", stderr)
	}
	got := map[string]amqp.Delivery{}
	for _, d := range drainTap(t, tap, q, 3) {
		got[d.MessageId] = d
	}
	for _, id := range want {
		d, ok := got[id]
		if !ok || d.Headers["x-event-id"] != id || d.Headers["x-replay-id"] != res.ReplayID || string(d.Body) != fmt.Sprintf(`{"id":%q}`, id) ||
			d.Headers["x-mesh-history-marker"] != nil {
			t.Errorf("replay of %s on the wire: %v %+v", id, ok, d)
		}
	}

	// The stream now holds the replay's copies too, after its cutoff: a
	// new replay's selection is the same events, once each.
	out, _ = hm.run(t, append([]string{"audit", "replay", "--history", "--stream", historyStreamName, "--dry-run", "--json", "--type", "mesh.order.#"}, window...)...)
	if got := listedIDs(t, out); !slices.Equal(got, want) {
		t.Errorf("dry run after the replay listed %v, want %v", got, want)
	}
}

// TestAuditReplayHistoryRecordsAndTargets: with an audit logger running,
// a replay from the history records each send as a fate of the event;
// --target sends to one module's queue only.
func TestAuditReplayHistoryRecordsAndTargets(t *testing.T) {
	hm := newHistoryMesh(t)
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	billing, other := newSeen(), newSeen()
	for _, def := range []sdk.Module{l.Module(),
		{Name: "billing", Setup: func(m sdk.Mesh) error { return m.On("mesh.order.#", billing, sdk.AllowDuplicates()) }},
		{Name: "other", Setup: func(m sdk.Mesh) error { return m.On("mesh.order.#", other, sdk.AllowDuplicates()) }},
	} {
		mod, err := hm.node.Load(hm.ctx, def, runtime.ModuleConfig{Concurrency: 4, Prefetch: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mod.Stop(context.Background()) })
	}
	at := time.Now().UTC().Add(-time.Hour)
	ids := []string{hm.event(t, "mesh.order.placed", at), hm.event(t, "mesh.order.placed", at.Add(time.Second))}
	// The logger records a replay as a fate of an event it stored.
	(&replayMesh{ctx: hm.ctx, logger: l}).waitStored(t, ids...)

	out, stderr := hm.run(t, "audit", "replay", "--history", "--stream", historyStreamName, "--json", "--from", "2h", "--to", "30m", "--type", "mesh.order.#", "--target", "anchor.billing")
	var res struct {
		ReplayID    string `json:"replay_id"`
		Destination string `json:"destination"`
		Sent        int    `json:"sent"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Sent != 2 || res.Destination != "anchor.billing.events" {
		t.Fatalf("replay --json: %+v, %v\n%s%s", res, err, out, stderr)
	}
	if strings.Contains(stderr, "no audit logger") {
		t.Errorf("the audit logger answers, but: %s", stderr)
	}
	var gotIDs []string
	for _, ev := range billing.waitReplayed(hm.ctx, t, res.ReplayID, 2) {
		gotIDs = append(gotIDs, ev.ID)
	}
	if slices.Sort(gotIDs); !slices.Equal(gotIDs, slices.Sorted(slices.Values(ids))) {
		t.Errorf("billing got %v, want %v", gotIDs, ids)
	}
	if got := other.replayed(res.ReplayID); len(got) != 0 {
		t.Errorf("another module got the replay to billing: %+v", got)
	}
	for _, id := range ids {
		ev, err := l.Store().Get(hm.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range ev.Fates {
			if f.Kind == store.FateReplayed && f.ReplayID == res.ReplayID {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d fates of replay %s, want 1: %+v", id, n, res.ReplayID, ev.Fates)
		}
	}
}
