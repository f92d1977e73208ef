//go:build shipped

package shipped

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// The defects of issue 60 that a user meets through a module binary of
// their own under the release's meshd: each module here is built from the
// repository as an author builds theirs, loaded by its entry in mesh.yaml,
// driven by the release's meshctl or a foreign publisher (raw amqp091-go),
// and read on the wire.

// TestACrashChargesOnlyThePoison (defect 6): a module process with eight
// events in flight is killed (SIGKILL) by one of them, every time it is
// handled; max_attempts is 1. The poison is dead-lettered at its limit
// with the crash named; the seven events beside it are each handled once
// and never dead-lettered (before the fix, the crash charged every event
// in flight, and the seven reached the dead letters with it).
func TestACrashChargesOnlyThePoison(t *testing.T) {
	url := brokertest.VHost(t)
	echo := userModule(t, "./runtime/testdata/echomodule")
	n := startNode(t, url, uniqueName("crash"), fmt.Sprintf("  - name: echo\n    path: %s\n    tools: [\"echo.upper\"]\n    max_attempts: 1\n    concurrency: 8\n", echo))
	pongs := brokertest.Tap(t, url, wire.ExchangeEvents, "module.echo.pong")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const holds = 7
	emit := func(body map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(body)
		out, err := meshctl(ctx, url, "emit", "--schema", "", "mesh.test."+body["do"].(string), string(b))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	markers := n.moduleDir("echo") // the module's own directory: its markers live there
	poison := emit(map[string]any{"do": "poison", "n": holds, "log": markers})
	held := map[string]bool{}
	for range holds {
		held[emit(map[string]any{"do": "hold", "log": markers})] = true
	}
	handled := map[string]int{}
	var d amqp.Delivery
	for len(handled) < holds || d.MessageId == "" {
		select {
		case p := <-pongs:
			var body struct{ Ping string }
			_ = json.Unmarshal(p.Body, &body)
			if !held[body.Ping] {
				t.Fatalf("a pong for %s, no held event", body.Ping)
			}
			if handled[body.Ping]++; handled[body.Ping] > 1 {
				t.Errorf("event %s handled %d times", body.Ping, handled[body.Ping])
			}
		case dl := <-dead:
			if dl.MessageId != poison || d.MessageId != "" {
				t.Fatalf("dead letter of %s (held: %v): %v after %v attempts: %v; want the poison %s alone",
					dl.MessageId, held[dl.MessageId], dl.Headers[wire.HeaderDeadReason], dl.Headers[wire.HeaderDeadAttempts], dl.Headers[wire.HeaderDeadError], poison)
			}
			d = dl
		case <-ctx.Done():
			t.Fatalf("%d of %d held events handled, the poison dead-lettered: %v; meshd's log:\n%s", len(handled), holds, d.MessageId != "", n.log.String())
		}
	}
	if errText := fmt.Sprint(d.Headers[wire.HeaderDeadError]); d.Headers[wire.HeaderDeadReason] != wire.DeadReasonDeliveryLimit ||
		d.Headers[wire.HeaderDeadAttempts] != int64(1) || !strings.Contains(errText, "alone (signal: killed) 1 time") {
		t.Errorf("the poison: %v after %v attempts: %s; want delivery_limit after 1, naming the crash", d.Headers[wire.HeaderDeadReason], d.Headers[wire.HeaderDeadAttempts], errText)
	}
}

// TestAToolWhoseCallIsNotGrantedIsRejected (defect 5): billing serves
// invoice.create, which calls tax.rate. With calls: granting it, meshctl
// call gets the invoice; without, the inner call is forbidden and the tool
// answers rejected (permanent), in the module's own words, as under
// meshtest and in-process, so a caller does not retry what can never
// succeed. (Through this path the release before the fix answered
// permanent too, but in the host's words: "permanent: tax rate: ...";
// test/conformance's ErrorKindsAreTheSameOnEveryHost holds every kind
// equal on all hosts.)
func TestAToolWhoseCallIsNotGrantedIsRejected(t *testing.T) {
	url := brokertest.VHost(t)
	billing, tax := userModule(t, "./examples/modules/billing"), userModule(t, "./examples/modules/tax")
	startNode(t, url, uniqueName("tools"), fmt.Sprintf(
		"  - name: billing\n    kind: agent\n    path: %s\n    tools: [\"invoice.create\"]\n  - name: tax\n    kind: agent\n    path: %s\n    tools: [\"tax.rate\"]\n", billing, tax))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := meshctl(ctx, url, "call", "invoice.create", `{"site":"blog","cents":100}`)
	if err == nil || !strings.Contains(err.Error(), "tool error rejected (permanent): tax rate: call tax.rate: forbidden") {
		t.Errorf("meshctl call invoice.create, its call of tax.rate not granted: %q, %v; want a permanent rejection in the module's words (tax rate: call tax.rate: forbidden)", out, err)
	}

	granted := brokertest.VHost(t)
	startNode(t, granted, uniqueName("tools"), fmt.Sprintf(
		"  - name: billing\n    kind: agent\n    path: %s\n    tools: [\"invoice.create\"]\n    calls: [\"tax.rate\"]\n  - name: tax\n    kind: agent\n    path: %s\n    tools: [\"tax.rate\"]\n", billing, tax))
	if out, err := meshctl(ctx, granted, "call", "invoice.create", `{"site":"blog","cents":100}`); err != nil || !strings.Contains(out, `"total_cents":120`) {
		t.Errorf("meshctl call invoice.create, its call granted: %q, %v; want the invoice", out, err)
	}
}

// TestTheInboxConflictUnderMeshd (defect 8): the ledger keeps its
// effects in SQLite in its own directory through the inbox, with
// allow_duplicates: true (the node keeps no record of the ids). A foreign
// publisher sends an order's id again with another body: it is
// dead-lettered with reason conflict (it was permanent), as raw
// amqp091-go reads it.
func TestTheInboxConflictUnderMeshd(t *testing.T) {
	url := brokertest.VHost(t)
	ledger := userModule(t, "./test/outbox/ledger")
	name := uniqueName("books")
	dir := "{state}/modules/ledger" // the module's own directory
	n := startNode(t, url, name, fmt.Sprintf("  - name: ledger\n    path: %s\n    args: [\"sqlite\", \"%s/ledger.db\", \"%s\"]\n    allow_duplicates: true\n", ledger, dir, dir))
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	booked := brokertest.Tap(t, url, wire.ExchangeEvents, "module.ledger.booked")
	ch := brokertest.Channel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := ulid.Make().String()
	publish := func(body string) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, "mesh.ledger.book", false, false, amqp.Publishing{
			Headers:     amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "shop", wire.HeaderNode: "till", wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish of %s not confirmed: %v", id, err)
		}
	}
	publish(`{"n":1}`)
	select {
	case <-booked:
	case <-ctx.Done():
		t.Fatalf("order %s was never booked; meshd's log:\n%s", id, n.log.String())
	}
	publish(`{"n":2}`)
	select {
	case d := <-dead:
		if d.Headers[wire.HeaderEventID] != id || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonConflict || string(d.Body) != `{"n":2}` {
			t.Errorf("dead letter: reason %v, error %v, id %v, body %s; want %s's other body with reason conflict",
				d.Headers[wire.HeaderDeadReason], d.Headers[wire.HeaderDeadError], d.Headers[wire.HeaderEventID], d.Body, id)
		}
	case <-ctx.Done():
		t.Fatalf("no dead letter of the conflicting copy; meshd's log:\n%s", n.log.String())
	}
}

// TestARestartedRelayTakesOverAtOnce (defect 7): the ledger's relay is
// killed (SIGKILL, by a marker the test leaves in the module's directory)
// right after the mesh confirmed its row, before it marked it sent, so it
// dies holding the outbox's lease. meshd restarts the module, whose new
// relay sends the row again: it takes the lease over at once, the holder
// being provably gone ("outbox relay: holder gone" in meshd's log, which
// carries the module's), rather than waiting out the dead one's lease
// (15 s, before the fix, and no such line).
func TestARestartedRelayTakesOverAtOnce(t *testing.T) {
	url := brokertest.VHost(t)
	ledger := userModule(t, "./test/outbox/ledger")
	dir := "{state}/modules/ledger"
	n := startNode(t, url, uniqueName("relay"), fmt.Sprintf("  - name: ledger\n    path: %s\n    args: [\"sqlite\", \"%s/ledger.db\", \"%s\"]\n", ledger, dir, dir))
	if err := os.WriteFile(filepath.Join(n.moduleDir("ledger"), "kill-after-publish-7"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	booked := brokertest.Tap(t, url, wire.ExchangeEvents, "module.ledger.booked")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := meshctl(ctx, url, "emit", "--schema", "", "mesh.ledger.book", `{"n":7}`); err != nil {
		t.Fatal(err)
	}
	// The row, sent by the relay that was then killed, and sent again by
	// the restarted one: the same id twice.
	var first string
	for copies := 0; copies < 2; {
		select {
		case d := <-booked:
			if first == "" {
				first = d.MessageId
			}
			if d.MessageId == first {
				copies++
			}
		case <-ctx.Done():
			t.Fatalf("the booked row did not come twice (sent, the relay killed, sent again); meshd's log:\n%s", n.log.String())
		}
	}
	if !strings.Contains(n.log.String(), "outbox relay: holder gone") {
		t.Errorf("the restarted relay sent the row without taking the dead relay's lease over at once (no 'outbox relay: holder gone'); meshd's log:\n%s", n.log.String())
	}
}
