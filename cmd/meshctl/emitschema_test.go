package main

import (
	"context"
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

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestMain gives the package's tests a cache directory of their own
// (meshctl emit keeps the declared schemas there), so that neither they
// nor the meshctl binaries they run write to the user's.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshctl-test-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_CACHE_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// meshTap is a queue of the test's own on mesh.events, read with raw
// amqp091-go: it sees every roll call, every schemas announcement and
// every event of the types it binds, in the order the broker routed
// them.
type meshTap struct {
	t          *testing.T
	ch         *amqp.Channel
	queue      string
	deliveries <-chan amqp.Delivery
	markers    int
}

func newMeshTap(t *testing.T, url string, keys ...string) *meshTap {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range append([]string{runtime.RollCall, "node.*.schemas"}, keys...) {
		if err := ch.QueueBind(q.Name, key, wire.ExchangeEvents, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &meshTap{t: t, ch: ch, queue: q.Name, deliveries: deliveries}
}

// since returns what the tap received since the last call: it puts a
// marker in its queue (after everything the broker routed to it so far,
// which includes whatever a meshctl that exited published with
// confirms) and reads up to it. Each is "KEY" or "KEY x-schema=V".
func (tp *meshTap) since() []string {
	tp.t.Helper()
	tp.markers++
	marker := fmt.Sprintf("marker-%d", tp.markers)
	if err := tp.ch.Publish("", tp.queue, false, false, amqp.Publishing{MessageId: marker}); err != nil {
		tp.t.Fatal(err)
	}
	var got []string
	timeout := time.After(time.Minute)
	for {
		select {
		case d, ok := <-tp.deliveries:
			if !ok {
				tp.t.Fatal("the tap's channel closed")
			}
			if d.MessageId == marker {
				return got
			}
			s := d.RoutingKey
			if v, ok := d.Headers["x-schema"].(string); ok {
				s += " x-schema=" + v
			}
			got = append(got, s)
		case <-timeout:
			tp.t.Fatalf("the tap did not read its marker in a minute (got %q)", got)
		}
	}
}

// await reads until an event whose routing key matches pattern, and
// drops what it read.
func (tp *meshTap) await(pattern string) {
	tp.t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case d, ok := <-tp.deliveries:
			if !ok {
				tp.t.Fatal("the tap's channel closed")
			}
			if wire.MatchPattern(pattern, d.RoutingKey) {
				return
			}
		case <-timeout:
			tp.t.Fatalf("the tap got no %s in a minute", pattern)
		}
	}
}

// count is how many of got have the routing key key (or match the
// pattern).
func count(got []string, pattern string) int {
	n := 0
	for _, s := range got {
		if wire.MatchPattern(pattern, strings.Fields(s)[0]) {
			n++
		}
	}
	return n
}

// TestEmitFindsSchemasWithoutARollCallEachTime runs the meshctl binary
// against a mesh whose module "shop" declares the schema of its
// order.placed, with a tap on the roll call's routing key, the schemas
// announcements and the events:
//   - --schema 1 and an empty --schema send at once, calling no roll;
//   - the first emit without --schema calls the roll, the second of the
//     same type does not (no announcements either, so no audit rows);
//   - a body the kept schema refuses is refused only on a fresh roll
//     call's answer;
//   - after the module moves to version 2, a body of version 2 is sent as
//     version 2 (the kept version 1 does not refuse it), and after a
//     rollback to version 1, a kept answer older than --schema-max-age
//     lets no body of version 2 through.
func TestEmitFindsSchemasWithoutARollCallEachTime(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	cache := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const (
		v1 = `{"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}`
		v2 = `{"type": "object", "required": ["code"], "properties": {"code": {"type": "integer"}}}`
	)
	var tap *meshTap // made on the first node's exchanges
	// shop starts on a node of its own with the versions given (the node
	// before it closed), and announces them.
	var node *runtime.Node
	shop := func(name string, versions ...string) {
		t.Helper()
		if node != nil {
			node.Close(context.Background())
		}
		var err error
		node, err = runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(), HeartbeatInterval: time.Hour,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if tap == nil {
			tap = newMeshTap(t, url, "module.shop.#")
		}
		var schemas []sdk.Schema
		for i, doc := range versions {
			schemas = append(schemas, sdk.Schema{Event: "order.placed", Version: fmt.Sprint(i + 1), JSON: []byte(doc)})
		}
		if _, err := node.Load(ctx, sdk.Module{Name: "shop", Emits: []string{"order.placed"}, Schemas: schemas,
			Setup: func(sdk.Mesh) error { return nil }}, runtime.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
		tap.await(runtime.SchemasEvent(name))
	}
	defer func() { node.Close(context.Background()) }()
	shop("alpha", v1)
	emit := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "emit"}, args...)...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache, "MESH_SCHEMA_MAX_AGE=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	const typ = "module.shop.order.placed"

	// --schema VERSION and --schema '': no lookup at all.
	if out, err := emit("--schema", "1", typ, `{"sku": "a"}`); err != nil {
		t.Fatalf("emit --schema 1: %v\n%s", err, out)
	}
	if out, err := emit("--schema", "", typ, `{}`); err != nil {
		t.Fatalf("emit --schema '': %v\n%s", err, out)
	}
	if got := tap.since(); count(got, runtime.RollCall) != 0 || count(got, "node.*.schemas") != 0 || len(got) != 2 ||
		got[0] != typ+" x-schema=1" || got[1] != typ {
		t.Errorf("emit with --schema 1, then --schema '': the tap got %q, want the two events and no roll call", got)
	}
	if entries, _ := os.ReadDir(filepath.Join(cache, "mesh", "schemas")); len(entries) != 0 {
		t.Errorf("emit with --schema kept schemas: %v", entries)
	}

	// The first emit without --schema calls the roll; the second does not.
	for i, want := range []int{1, 0} {
		if out, err := emit(typ, `{"sku": "a"}`); err != nil {
			t.Fatalf("emit %d without --schema: %v\n%s", i+1, err, out)
		}
		got := tap.since()
		if count(got, runtime.RollCall) != want || count(got, typ) != 1 || !strings.Contains(strings.Join(got, ","), typ+" x-schema=1") {
			t.Errorf("emit %d without --schema: the tap got %q, want %d roll call(s) and the event as version 1", i+1, got, want)
		}
		if want == 0 && count(got, "node.*.schemas") != 0 {
			t.Errorf("emit %d without --schema: the nodes announced their schemas again: %q", i+1, got)
		}
	}

	// A body the kept schema refuses is refused on the mesh's answer.
	if out, err := emit(typ, `{"sku": 5}`); err == nil || !strings.Contains(out, "(version 1): /sku: type:") {
		t.Errorf("emit of a number for sku: %v, want it refused naming the rule\n%s", err, out)
	}
	if got := tap.since(); count(got, runtime.RollCall) != 1 || count(got, typ) != 0 {
		t.Errorf("a refused emit: the tap got %q, want one roll call and no event", got)
	}

	// shop moves to version 2: the kept version 1 would refuse its body.
	shop("beta", v1, v2)
	if out, err := emit(typ, `{"code": 7}`); err != nil {
		t.Errorf("emit of a version 2 body after shop moved to it: %v\n%s", err, out)
	}
	if got := tap.since(); count(got, runtime.RollCall) != 1 || count(got, typ) != 1 || !strings.Contains(strings.Join(got, ","), typ+" x-schema=2") {
		t.Errorf("emit after shop moved to version 2: the tap got %q, want one roll call and the event as version 2", got)
	}

	// shop rolls back to version 1: the kept version 2 would let its
	// body through, but it is older than --schema-max-age (the roll call
	// that found it listened rollCallQuiet after it began).
	shop("gamma", v1)
	if out, err := emit("--schema-max-age", (rollCallQuiet / 2).String(), typ, `{"code": 7}`); err == nil || !strings.Contains(out, "(version 1): /: required: missing property 'sku'") {
		t.Errorf("emit of a version 2 body after shop rolled back, the kept schemas older than --schema-max-age: %v, want it refused\n%s", err, out)
	}
	if got := tap.since(); count(got, runtime.RollCall) != 1 || count(got, typ) != 0 {
		t.Errorf("emit after shop rolled back: the tap got %q, want one roll call and no event", got)
	}
}

// TestSchemaCachePath: emit keeps one file per broker and virtual host,
// whoever logs in, and the URL's defaults are the client's.
func TestSchemaCachePath(t *testing.T) {
	path := func(urls ...string) string {
		t.Helper()
		p, err := schemaCachePath(urls)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	same := [][2][]string{
		{{"amqp://guest:guest@127.0.0.1:5672/"}, {"amqp://ops:secret@127.0.0.1"}},
		{{"amqp://h/%2f"}, {"amqp://h:5672"}},
		{{"amqp://a/v", "amqp://b/v"}, {"amqp://b/v", "amqp://a/v"}},
		{{"amqps://H/v"}, {"amqps://h:5671/v"}},
	}
	for _, c := range same {
		if path(c[0]...) != path(c[1]...) {
			t.Errorf("%q and %q are kept apart", c[0], c[1])
		}
	}
	other := [][2][]string{
		{{"amqp://h/a"}, {"amqp://h/b"}},
		{{"amqp://h:5672/a"}, {"amqp://h:5673/a"}},
		{{"amqp://h/a"}, {"amqps://h/a"}},
		{{"amqp://h/a"}, {"amqp://g/a"}},
	}
	for _, c := range other {
		if path(c[0]...) == path(c[1]...) {
			t.Errorf("%q and %q share a file", c[0], c[1])
		}
	}
	if p := path("amqp://guest:guest@127.0.0.1/"); !strings.HasPrefix(p, filepath.Join(os.Getenv("XDG_CACHE_HOME"), "mesh", "schemas")+"/") || strings.Contains(p, "guest") {
		t.Errorf("the cache file is %s", p)
	}
	if _, err := schemaCachePath([]string{"http://h/"}); err == nil {
		t.Error("a URL that is not AMQP has a cache file")
	}
}
