package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAudit runs `meshctl audit` against an audit logger on a node:
// query (table, --json, pages), count, get, trace (drawn) and stats.
func TestAudit(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	logger, err := node.Load(ctx, l.Module(), runtime.ModuleConfig{Concurrency: 8, Prefetch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Stop(context.Background())
	shop, err := node.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"order.accepted"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.order.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "order.accepted", map[string]string{"tier": "gold"})
			return err
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Stop(context.Background())
	order, err := node.Emit(ctx, "web", "mesh.order.placed", map[string]int{"order": 7})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if n, _ := l.Store().Count(ctx, store.Filter{Types: []string{"mesh.order.#", "module.shop.#"}}); n == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the audit logger never stored the order and its consequence")
		case <-time.After(20 * time.Millisecond):
		}
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("meshctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	trace := run("audit", "trace", order)
	lines := strings.Split(strings.TrimSpace(trace), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], order) || !strings.Contains(lines[0], "mesh.order.placed") ||
		!strings.HasPrefix(lines[1], "└─ ") || !strings.Contains(lines[1], "module.shop.order.accepted  shop@anchor") {
		t.Errorf("trace:\n%s", trace)
	}
	// A key's events, in the order the broker received them.
	for i, key := range []string{"cart-9", "cart-1", "cart-9", "cart-9"} {
		if _, err := node.Emit(ctx, "web", "mesh.cart.changed", map[string]int{"step": i}, sdk.WithKey(key)); err != nil {
			t.Fatal(err)
		}
	}
	for {
		if n, _ := l.Store().Count(ctx, store.Filter{Types: []string{"mesh.cart.#"}}); n == 4 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the audit logger never stored the carts' events")
		case <-time.After(20 * time.Millisecond):
		}
	}
	byKey := strings.Split(strings.TrimSpace(run("audit", "trace", "--key", "cart-9")), "\n")
	if len(byKey) != 4 || !strings.HasPrefix(byKey[0], "#") || !strings.HasPrefix(byKey[1], "1 ") || !strings.HasPrefix(byKey[3], "3 ") {
		t.Fatalf("trace --key cart-9:\n%s", strings.Join(byKey, "\n"))
	}
	var steps []int
	for _, line := range strings.Split(strings.TrimSpace(run("audit", "trace", "--key", "cart-9", "--json")), "\n") {
		var ev store.Event
		var b struct{ Step int }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("trace --key --json line %q: %v", line, err)
		}
		ev, err := l.Store().Get(ctx, ev.ID)
		if err != nil || json.Unmarshal(ev.Body, &b) != nil {
			t.Fatalf("event %s: %v", ev.ID, err)
		}
		steps = append(steps, b.Step)
	}
	if fmt.Sprint(steps) != "[0 2 3]" {
		t.Errorf("trace --key cart-9 --json lists steps %v, want [0 2 3]: the key's own, in order", steps)
	}
	if got := run("audit", "trace", "--key", "cart-404"); !strings.Contains(got, "no events of key cart-404") {
		t.Errorf("trace --key of a key never seen: %q", got)
	}
	if out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "audit", "trace", "--key", "cart-9", "some-id").CombinedOutput(); err == nil || !strings.Contains(string(out), "wants no ID") {
		t.Errorf("trace --key with an ID: %v\n%s", err, out)
	}
	table := run("audit", "query", "--type", "mesh.order.#")
	if !strings.Contains(table, "SEQ") || !strings.Contains(table, order) || strings.Contains(table, "module.shop") {
		t.Errorf("query table:\n%s", table)
	}
	var ev store.Event
	out := run("audit", "query", "--json", "--type", "module.shop.#", "--body", `tier="gold"`, "--causation", order)
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Type != "module.shop.order.accepted" || ev.UserID != "guest" {
		t.Errorf("query --json: %s (%v)", out, err)
	}
	if got := strings.TrimSpace(run("audit", "count", "--type", "mesh.order.#", "--type", "module.shop.#")); got != "2" {
		t.Errorf("count %q, want 2", got)
	}
	if got := strings.TrimSpace(run("audit", "count", "--type", "mesh.order.#", "--json")); got != `{"count":1}` {
		t.Errorf("count --json %q, want {\"count\":1}", got)
	}
	got := run("audit", "get", order)
	for _, want := range []string{"id         " + order + "\n", "type       mesh.order.placed\n", "source     web\n", "node       anchor\n",
		"user       guest\n", "fates      -\n", "  x-source: web\n", "body\n  {\n    \"order\": 7\n  }\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("get lacks %q:\n%s", want, got)
		}
	}
	got = run("audit", "get", order, "--json") // the flag after the ID, as people type it
	var one store.Event
	if err := json.Unmarshal([]byte(got), &one); err != nil || one.ID != order || string(one.Body) != `{"order":7}` || strings.Count(got, "\n") != 1 {
		t.Errorf("get --json: %s (%v)", got, err)
	}
	paged := run("audit", "query", "--limit", "1", "--type", "mesh.order.#", "--type", "module.shop.#")
	if !strings.Contains(paged, "more: --after ") {
		t.Errorf("a first page of 1 does not say where the next starts:\n%s", paged)
	}
	lines = strings.Split(strings.TrimSpace(run("audit", "export", "--type", "mesh.order.#", "--type", "module.shop.#")), "\n")
	exported := map[string]store.Event{} // in order of arrival, which concurrent handlers may swap
	for _, line := range lines {
		var ev store.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("export jsonl line %q: %v", line, err)
		}
		exported[ev.ID] = ev
	}
	if len(lines) != 2 || string(exported[order].Body) != `{"order":7}` {
		t.Errorf("export jsonl:\n%s", strings.Join(lines, "\n"))
	}
	csvFile := filepath.Join(t.TempDir(), "audit.csv")
	run("audit", "export", "--format", "csv", "--out", csvFile, "--id", order)
	rows, err := csv.NewReader(mustOpen(t, csvFile)).ReadAll()
	if err != nil || len(rows) != 2 || rows[0][1] != "id" || rows[1][1] != order || rows[1][13] != `{"order":7}` || !strings.Contains(rows[1][12], `"x-source":"web"`) {
		t.Errorf("export csv: %v, %v", rows, err)
	}
	// A formula in what a publisher wrote (the id, the source, a body
	// of -1) is a cell a spreadsheet shows, not one it runs.
	evil := `=HYPERLINK("http://evil.example")` // no comma: --id takes a list
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, wire.ExchangeEvents, "mesh.order.evil", false, false, amqp.Publishing{MessageId: evil,
		ContentType: wire.ContentTypeJSON, Headers: amqp.Table{wire.HeaderSource: "@SUM(A1)"}, Body: []byte(`-1`)}); err != nil {
		t.Fatal(err)
	}
	for {
		if n, _ := l.Store().Count(ctx, store.Filter{IDs: []string{evil}}); n == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the audit logger never stored the event of a formula")
		case <-time.After(20 * time.Millisecond):
		}
	}
	run("audit", "export", "--format", "csv", "--out", csvFile, "--type", "mesh.order.evil") // --id would split the id at its comma
	rows, err = csv.NewReader(mustOpen(t, csvFile)).ReadAll()
	if err != nil || len(rows) != 2 || rows[1][1] != "'"+evil || rows[1][3] != "'@SUM(A1)" || rows[1][13] != "'-1" || rows[1][2] != "mesh.order.evil" {
		t.Errorf("export csv of a formula: %q, %v", rows, err)
	}
	var ce map[string]any
	if err := json.Unmarshal([]byte(run("audit", "export", "--format", "cloudevents", "--id", order)), &ce); err != nil ||
		ce["specversion"] != "1.0" || ce["id"] != order || ce["type"] != "mesh.order.placed" || ce["source"] != "mesh://anchor/web" || ce["data"] == nil {
		t.Errorf("export cloudevents: %v, %v", ce, err)
	}
	var st store.Stats
	if err := json.Unmarshal([]byte(run("audit", "stats", "--json")), &st); err != nil || st.Events < 2 {
		t.Errorf("stats %+v, %v", st, err)
	}
	if out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "audit", "query", "--from", "yesterday").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--from") {
		t.Errorf("a bad --from: %v\n%s", err, out)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestPrintAuditEvent: `audit get` prints an event a field a line, what
// became of it as a trace marks it, a header a line and the body indented
// when it is JSON; what came from the wire is escaped, so no control,
// bidi or separator character reaches the terminal as it is.
func TestPrintAuditEvent(t *testing.T) {
	at := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		ev   store.Event
		want string
	}{{
		name: "plain",
		ev: store.Event{Seq: 7, ID: "01JORDER", Type: "mesh.order.placed", Source: "web", Node: "anchor", UserID: "guest", Time: at,
			CausationID: "01JCAUSE", Schema: "2", Headers: map[string]string{"x-source": "web", "x-event-id": "01JORDER"},
			Body: []byte(`{"order":7,"items":[1,2]}`), Arrived: at.Add(time.Second), Redelivered: true,
			Fates: []store.Fate{{Kind: store.FateDead, Queue: "anchor.shop.events", Reason: "rejected", Attempts: 3, Error: "boom"},
				{Kind: store.FateReplayed, Queue: "mesh.events"}, {Kind: store.FateReplayed, Queue: "mesh.events"}}},
		want: `seq        7
id         01JORDER
type       mesh.order.placed
source     web
node       anchor
user       guest
time       2026-03-01T09:30:00.000Z
causation  01JCAUSE
schema     2
arrived    2026-03-01T09:30:01.000Z (redelivered)
fates      ✗ dead-lettered by anchor.shop.events (rejected after 3 attempts: boom)
           ↻ replayed 2 times
headers
  x-event-id: 01JORDER
  x-source: web
body
  {
    "order": 7,
    "items": [
      1,
      2
    ]
  }
`,
	}, {
		name: "bare",
		ev:   store.Event{Seq: 1, ID: "01JBARE", Type: "mesh.x", Malformed: "no x-time header"},
		want: `seq        1
id         01JBARE
type       mesh.x
source     -
node       -
user       -
time       -
causation  -
schema     -
arrived    -
malformed  no x-time header
fates      -
headers
body
  (empty)
`,
	}, {
		name: "not JSON",
		ev:   store.Event{Seq: 2, ID: "01JTEXT", Type: "mesh.x", Body: []byte("two\nlines")},
		want: `seq        2
id         01JTEXT
type       mesh.x
source     -
node       -
user       -
time       -
causation  -
schema     -
arrived    -
fates      -
headers
body
  (not JSON, 9 bytes)
  two
  lines
`,
	}} {
		var b strings.Builder
		if err := printAuditEvent(&b, c.ev); err != nil {
			t.Fatal(err)
		}
		if b.String() != c.want {
			t.Errorf("%s:\n got\n%s\n want\n%s", c.name, b.String(), c.want)
		}
	}

	const nasty = "\x1b]52;c;cm0gLXJmIH4=\x07\rok \u202eexe.txt \u009b2J \u2028 \xff"
	hostile := store.Event{Seq: 3, ID: "01J" + nasty, Type: "mesh." + nasty, Source: nasty, Node: nasty, UserID: nasty, CausationID: nasty,
		Schema: nasty, Malformed: nasty, Headers: map[string]string{"x-" + nasty: nasty},
		Body:  []byte(`{"v":"` + "\u202e\u0085\x7f" + `"}`),
		Fates: []store.Fate{{Kind: store.FateDead, Queue: nasty, Reason: nasty, Error: nasty}}}
	var b strings.Builder
	if err := printAuditEvent(&b, hostile); err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "a hostile event", b.String(), true, false)
	if !strings.Contains(b.String(), `"v": "\u202e\u0085\u007f"`) {
		t.Errorf("the JSON body is not escaped JSON:\n%s", b.String())
	}
	hostile.Body = []byte(nasty)
	b.Reset()
	if err := printAuditEvent(&b, hostile); err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "a hostile event with a body not JSON", b.String(), true, false)
}
