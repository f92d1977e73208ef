package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// keeperMesh is a virtual host with the mesh's topology, declared with raw
// amqp091-go as runtime/topology.go declares it, and a publishing channel.
type keeperMesh struct {
	t    *testing.T
	url  string
	conn *amqp.Connection
	ch   *amqp.Channel // confirm mode; the test goroutine's only
}

func newKeeperMesh(t *testing.T) *keeperMesh {
	t.Helper()
	url := brokertest.VHost(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name, kind string
		args       amqp.Table
	}{
		{wire.ExchangeUnrouted, amqp.ExchangeFanout, nil},
		{wire.ExchangeEvents, amqp.ExchangeTopic, amqp.Table{"alternate-exchange": wire.ExchangeUnrouted}},
		{wire.ExchangeDead, amqp.ExchangeTopic, nil},
	} {
		if err := ch.ExchangeDeclare(x.name, x.kind, true, false, false, false, x.args); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []struct{ queue, exchange, key string }{
		{wire.QueueUnrouted, wire.ExchangeUnrouted, ""},
		{wire.QueueDead, wire.ExchangeDead, "#"},
	} {
		if _, err := ch.QueueDeclare(k.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(k.queue, k.key, k.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return &keeperMesh{t: t, url: url, conn: conn, ch: ch}
}

func (m *keeperMesh) moduleQueue(node, module, pattern string) string {
	m.t.Helper()
	name := wire.ModuleQueue(node, module)
	if _, err := m.ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": wire.ExchangeDead}); err != nil {
		m.t.Fatal(err)
	}
	if err := m.ch.QueueBind(name, pattern, wire.ExchangeEvents, false, nil); err != nil {
		m.t.Fatal(err)
	}
	return name
}

// publish publishes a conforming event of typ with body and more headers,
// waits for the confirm and returns its id.
func (m *keeperMesh) publish(exchange, typ, body string, more amqp.Table) string {
	m.t.Helper()
	now := time.Now().UTC()
	id := ulid.Make().String()
	h := amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "n0", wire.HeaderTime: now.Format(time.RFC3339Nano)}
	for k, v := range more {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := m.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, typ, false, false, amqp.Publishing{
		Headers: h, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, Timestamp: now, Body: []byte(body),
	})
	if err != nil {
		m.t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		m.t.Fatalf("publish: acked=%v, %v", ok, err)
	}
	return id
}

// deadLetter puts an event in the dead letters as the runtime does.
func (m *keeperMesh) deadLetter(typ, body, queue, reason, errText string) string {
	m.t.Helper()
	return m.publish(wire.ExchangeDead, typ, body, amqp.Table{
		wire.HeaderDeadQueue: queue, wire.HeaderDeadAttempts: int64(3), wire.HeaderDeadReason: reason,
		wire.HeaderDeadError: errText, wire.HeaderDeadTime: time.Now().UTC().Add(-5 * time.Minute).Format(time.RFC3339Nano),
	})
}

// get takes one message from queue, waiting up to 5 s.
func (m *keeperMesh) get(queue string) (amqp.Delivery, bool) {
	m.t.Helper()
	ch, err := m.conn.Channel()
	if err != nil {
		m.t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			m.t.Fatal(err)
		}
		if ok || time.Now().After(deadline) {
			return d, ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// meshctl runs the binary against url and returns its stdout, stderr and
// exit code.
func meshctl(t *testing.T, bin, url string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("meshctl %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// want runs meshctl and fails unless it exits with code and its stdout
// contains every string of contains.
func want(t *testing.T, bin, url string, code int, args []string, contains ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, got := meshctl(t, bin, url, args...)
	if got != code {
		t.Fatalf("meshctl %s exited %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), got, code, stdout, stderr)
	}
	for _, s := range contains {
		if !strings.Contains(stdout, s) {
			t.Errorf("meshctl %s printed\n%s\nwithout %q (stderr: %s)", strings.Join(args, " "), stdout, s, stderr)
		}
	}
	return stdout, stderr
}

// TestDLQCommands runs `meshctl dlq ls/show/replay/purge` as a separate
// process against dead letters of two module queues and of a queue that is
// gone.
func TestDLQCommands(t *testing.T) {
	m := newKeeperMesh(t)
	bin := build(t)
	billing := m.moduleQueue("n1", "billing", "module.shop.#")
	mailer := m.moduleQueue("n1", "mailer", "module.shop.#")
	a := m.deadLetter("module.shop.order.created", `{"order":42}`, billing, wire.DeadReasonPermanent, "card declined\nby the bank")
	b := m.deadLetter("module.shop.order.paid", `{"order":43}`, mailer, wire.DeadReasonDeliveryLimit, "smtp down")
	c := m.deadLetter("module.shop.order.paid", `{"order":44}`, "n1.retired.events", wire.DeadReasonPermanent, "x")

	out, _ := want(t, bin, m.url, 0, []string{"dlq", "ls"}, "ID", "AGE", "ATTEMPTS", a, b, c, "card declined by the bank", "billing", "5m")
	if n := strings.Count(out, "\n"); n != 4 {
		t.Errorf("ls printed %d lines:\n%s", n, out)
	}
	out, _ = want(t, bin, m.url, 0, []string{"dlq", "ls", "--module", "billing", "--json"})
	var line struct {
		ID, Type, Queue, Node, Module, Reason, Error string
		Attempts                                     int
		Headers                                      map[string]any
		Body                                         json.RawMessage
	}
	if err := json.Unmarshal([]byte(out), &line); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("ls --json printed %q: %v", out, err)
	}
	if line.ID != a || line.Type != "module.shop.order.created" || line.Queue != billing || line.Node != "n1" || line.Module != "billing" ||
		line.Reason != "permanent" || line.Attempts != 3 || string(line.Body) != `{"order":42}` || line.Headers[wire.HeaderEventID] != a {
		t.Errorf("ls --json: %+v", line)
	}
	out, _ = want(t, bin, m.url, 0, []string{"dlq", "ls", "--type", "*.*.*.paid", "--node", "n1"}, b, c)
	if strings.Contains(out, a) {
		t.Errorf("ls --type printed %s", a)
	}
	want(t, bin, m.url, 0, []string{"dlq", "ls", "--newer-than", "1m"}, "no dead letters")
	out, stderr := want(t, bin, m.url, 0, []string{"dlq", "ls", "--limit", "2"}, a, b)
	if strings.Contains(out, c) || !strings.Contains(stderr, "the first 2 matching dead letters; more may match") {
		t.Errorf("ls --limit 2 printed\n%s\nand said %q", out, stderr)
	}

	want(t, bin, m.url, 0, []string{"dlq", "show", a}, "id         "+a, "queue      "+billing+" (node n1, module billing)",
		"reason     permanent after 3 attempts", "error      card declined\n           by the bank\n", "x-mesh-dead-error: card declined\n    by the bank\n", "\"order\": 42")
	_, stderr = want(t, bin, m.url, 1, []string{"dlq", "show", b, "01MISSING000000000000000000"}, b)
	if !strings.Contains(stderr, "01MISSING000000000000000000") {
		t.Errorf("show of a missing id said %q", stderr)
	}

	_, stderr = want(t, bin, m.url, 0, []string{"dlq", "replay", "--dry-run"},
		"dry run: would replay 2 dead letters to 2 queues (1 would be left: queue gone)")
	if !strings.Contains(stderr, "would be left "+c) {
		t.Errorf("dry run stderr %q", stderr)
	}
	if _, ok := m.get(billing); ok {
		t.Fatal("the dry run replayed")
	}

	want(t, bin, m.url, 0, []string{"dlq", "replay", "--module", "billing"}, "replayed 1 dead letter to 1 queue\n")
	if d, ok := m.get(billing); !ok || d.MessageId != a || d.Headers[wire.HeaderDeadQueue] != nil {
		t.Fatalf("billing got %v, %+v", ok, d)
	}
	_, stderr = want(t, bin, m.url, 1, []string{"dlq", "replay"}, "replayed 1 dead letter to 1 queue (1 left: queue gone)")
	if !strings.Contains(stderr, "left "+c) || !strings.Contains(stderr, "n1.retired.events") {
		t.Errorf("replay stderr %q", stderr)
	}
	if d, ok := m.get(mailer); !ok || d.MessageId != b {
		t.Fatalf("mailer got %v, %+v", ok, d)
	}
	if _, ok := m.get(billing); ok {
		t.Error("billing got a second replay")
	}

	_, stderr = want(t, bin, m.url, 2, []string{"dlq", "purge"})
	if !strings.Contains(stderr, "--all") {
		t.Errorf("purge without a filter said %q", stderr)
	}
	want(t, bin, m.url, 0, []string{"dlq", "purge", "--all", "--dry-run"}, "dry run: would purge 1 dead letter\n")
	want(t, bin, m.url, 0, []string{"dlq", "purge", "--id", "01MISSING000000000000000000"}, "no dead letters match")
	want(t, bin, m.url, 0, []string{"dlq", "purge", "--id", c}, "purged 1 dead letter\n")
	want(t, bin, m.url, 0, []string{"dlq", "ls"}, "no dead letters")
}

// TestUnroutedCommands runs `meshctl unrouted`: a replay with no queue for
// the event comes back, one after a binding appears routes it.
func TestUnroutedCommands(t *testing.T) {
	m := newKeeperMesh(t)
	bin := build(t)
	id := m.publish(wire.ExchangeEvents, "module.shop.order.created", `{"order":1}`, nil)
	other := m.publish(wire.ExchangeEvents, "module.blog.post.published", `{}`, amqp.Table{wire.HeaderSource: "blog"})

	out, _ := want(t, bin, m.url, 0, []string{"unrouted", "ls"}, "SOURCE", id, other, "module.shop.order.created", "shop", "blog")
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("ls printed %d lines:\n%s", n, out)
	}
	out, _ = want(t, bin, m.url, 0, []string{"unrouted", "ls", "--module", "blog"}, other)
	if strings.Contains(out, id) {
		t.Errorf("ls --module blog printed %s", id)
	}
	want(t, bin, m.url, 0, []string{"unrouted", "show", id}, "arrived", "source     shop on node n0", `"order": 1`)
	want(t, bin, m.url, 0, []string{"unrouted", "replay", "--module", "shop"},
		"replayed 1 unrouted event to mesh.events (1 came back: still no queue for them)")

	billing := m.moduleQueue("n1", "billing", "module.shop.#")
	want(t, bin, m.url, 0, []string{"unrouted", "replay", "--type", "module.shop.#"}, "replayed 1 unrouted event to mesh.events\n")
	if d, ok := m.get(billing); !ok || d.MessageId != id || d.RoutingKey != "module.shop.order.created" {
		t.Fatalf("billing got %v, %+v", ok, d)
	}
	out, _ = want(t, bin, m.url, 0, []string{"unrouted", "ls"}, other)
	if strings.Contains(out, id) {
		t.Errorf("%s is still unrouted:\n%s", id, out)
	}
	want(t, bin, m.url, 0, []string{"unrouted", "purge", "--all"}, "purged 1 unrouted event\n")
	want(t, bin, m.url, 0, []string{"unrouted", "ls"}, "no unrouted events")
}

// TestKeeperProgress: a purge shows the progress bar on stderr when asked
// with --progress, and not otherwise when stderr is no terminal.
func TestKeeperProgress(t *testing.T) {
	m := newKeeperMesh(t)
	bin := build(t)
	for range 60 {
		m.deadLetter("module.shop.order.created", `{}`, "n1.billing.events", wire.DeadReasonPermanent, "x")
	}
	_, stderr := want(t, bin, m.url, 0, []string{"dlq", "purge", "--type", "module.#", "--dry-run"}, "dry run: would purge 60 dead letters")
	if stderr != "" {
		t.Errorf("stderr without a terminal or --progress: %q", stderr)
	}
	_, stderr = want(t, bin, m.url, 0, []string{"dlq", "purge", "--all", "--progress"}, "purged 60 dead letters\n")
	if !strings.HasPrefix(stderr, "\r[..............................] 0/60") ||
		!strings.HasSuffix(stderr, "\r[##############################] 60/60\n") {
		t.Errorf("progress bar %q", stderr)
	}
}

// TestKeeperRefusals: bad filters and stray arguments are clear usage
// errors (exit 2), a virtual host without the topology a clear failure
// (exit 1).
func TestKeeperRefusals(t *testing.T) {
	m := newKeeperMesh(t)
	bin := build(t)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"dlq", "ls", "--type", "module..x"}, "pattern"},
		{[]string{"dlq", "ls", "--module", "a.b"}, "module name"},
		{[]string{"dlq", "ls", "--older-than", "1h", "--newer-than", "1m"}, "NewerThan"},
		{[]string{"dlq", "ls", "extra"}, "takes no arguments"},
		{[]string{"dlq", "replay", "mesh.ops.x", "--dry-run"}, "takes no arguments"},
		{[]string{"dlq", "show"}, "ID"},
		{[]string{"unrouted", "purge", "--node", "has space"}, "node name"},
	} {
		stdout, stderr, code := meshctl(t, bin, m.url, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.says) {
			t.Errorf("meshctl %v: exit %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, stdout, stderr, tc.says)
		}
	}
	bare := brokertest.VHost(t)
	_, stderr, code := meshctl(t, bin, bare, "dlq", "ls")
	if code != 1 || !strings.Contains(stderr, "mesh.dead-letters") || !strings.Contains(stderr, "does not exist") {
		t.Errorf("ls without the topology: exit %d, %q", code, stderr)
	}
	_, stderr, code = meshctl(t, bin, "amqp://guest:secret@127.0.0.1:1/", "dlq", "ls")
	if code != 1 || strings.Contains(stderr, "secret") || !strings.Contains(stderr, "connect to broker") {
		t.Errorf("ls with no broker: exit %d, %q", code, stderr)
	}
}
