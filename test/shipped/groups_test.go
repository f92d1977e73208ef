//go:build shipped

package shipped

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// TestAGroupSharesItsEventsUnderMeshd (issue 61, groups): a module binary
// of the user's, its entry saying group: echoes on two nodes of the
// release's meshd (each as the unit runs it, its module as a user of its
// own), shares the events: forty events from a foreign publisher (raw
// amqp091-go) and the release's meshctl are each handled once by the
// group (a pong each), both nodes handle some (the pongs' x-node), and
// meshctl groups lists the group with both members and its queue's two
// consumers.
func TestAGroupSharesItsEventsUnderMeshd(t *testing.T) {
	url := brokertest.VHost(t)
	echo := userModule(t, "./runtime/testdata/echomodule")
	entry := fmt.Sprintf("  - name: echo\n    path: %s\n    tools: [\"echo.upper\"]\n    group: echoes\n    prefetch: 1\n", echo)
	names := []string{uniqueName("east"), uniqueName("west")}
	for _, name := range names {
		startNode(t, url, name, entry)
	}
	pongs := brokertest.Tap(t, url, wire.ExchangeEvents, "module.echo.pong")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	raw := brokertest.Channel(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	sent := map[string]bool{}
	for i := range 40 {
		if i%8 == 0 {
			out, err := meshctl(ctx, url, "emit", "--schema", "", "mesh.test.ping", `{"do":"pong"}`)
			if err != nil {
				t.Fatal(err)
			}
			sent[strings.TrimSpace(out)] = true
			continue
		}
		id := ulid.Make().String()
		conf, err := raw.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, "mesh.test.ping", true, false, amqp.Publishing{
			MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, Timestamp: time.Now(),
			Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "foreign", wire.HeaderNode: "outside", wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)},
			Body:    []byte(`{"do":"pong"}`)})
		if err != nil || !conf.Wait() {
			t.Fatalf("publish %d: %v", i, err)
		}
		sent[id] = true
	}
	handled, by := map[string]int{}, map[string]int{}
	for len(handled) < len(sent) {
		select {
		case p := <-pongs:
			var body struct{ Ping string }
			_ = json.Unmarshal(p.Body, &body)
			if !sent[body.Ping] {
				t.Fatalf("a pong for %s, which was not sent", body.Ping)
			}
			if handled[body.Ping]++; handled[body.Ping] > 1 {
				t.Errorf("event %s handled %d times by the group", body.Ping, handled[body.Ping])
			}
			node, _ := p.Headers[wire.HeaderNode].(string)
			by[node]++
		case <-ctx.Done():
			t.Fatalf("%d of %d events handled", len(handled), len(sent))
		}
	}
	if by[names[0]] == 0 || by[names[1]] == 0 || len(by) != 2 {
		t.Errorf("events handled by node: %v; want both members to share them", by)
	}
	out, err := meshctl(ctx, url, "groups", "--within", "20s")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("echoes echo %s 0 2 %s, %s", wire.GroupQueue("echoes", "echo"), names[0], names[1])
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || strings.Join(strings.Fields(lines[1]), " ") != want {
		t.Errorf("meshctl groups printed:\n%s\nwant a line %q", out, want)
	}
}

// TestAGroupKeepsOrderUnderMeshd (issue 61, per-key order): the user's
// module binary in group ordered with 4 partitions on two nodes of the
// release's meshd (each as the unit runs it) handles each key's events in
// the order they were published: keys the release's meshctl gives
// (--key), keys a foreign publisher (raw amqp091-go) gives without a slot
// (through the group's intake), and one it gives with the slot it
// computed. Between two such batches the operator doubles the partitions
// live (meshctl groups repartition ordered echo 8), while the first is
// being handled. The pongs the handler emits, one per event, reach a tap
// in the order of their pings, key by key, across the change; each event
// is handled once.
func TestAGroupKeepsOrderUnderMeshd(t *testing.T) {
	url := brokertest.VHost(t)
	echo := userModule(t, "./runtime/testdata/echomodule")
	entry := fmt.Sprintf("  - name: echo\n    path: %s\n    tools: [\"echo.upper\"]\n    group: ordered\n    partitions: 4\n    concurrency: 4\n", echo)
	for _, name := range []string{uniqueName("east"), uniqueName("west")} {
		startNode(t, url, name, entry)
	}
	pongs := brokertest.Tap(t, url, wire.ExchangeEvents, "module.echo.pong")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	raw := brokertest.Channel(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	order := map[string][]string{} // key → ids in publish order
	keyOf := map[string]string{}
	publish := func(key string, slot bool) {
		t.Helper()
		id := ulid.Make().String()
		h := amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "foreign", wire.HeaderNode: "outside",
			wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano), wire.HeaderPartitionKey: key}
		if slot {
			h[wire.SlotHeader(key)] = wire.SlotMark
		}
		conf, err := raw.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, "mesh.test.ping", true, false, amqp.Publishing{
			MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, Headers: h, Body: []byte(`{"do":"pong"}`)})
		if err != nil || !conf.Wait() {
			t.Fatalf("publish: %v", err)
		}
		order[key] = append(order[key], id)
		keyOf[id] = key
	}
	batch := func() {
		t.Helper()
		for i := range 10 {
			if i < 5 {
				for _, key := range []string{"cli-a", "cli-b"} {
					out, err := meshctl(ctx, url, "emit", "--schema", "", "--key", key, "mesh.test.ping", `{"do":"pong"}`)
					if err != nil {
						t.Fatal(err)
					}
					id := strings.TrimSpace(out)
					order[key] = append(order[key], id)
					keyOf[id] = key
				}
			}
			publish("raw-c", false)
			publish("raw-d", false)
			publish("raw-e", true)
		}
	}
	batch()
	// The operator doubles the partitions live, while the first batch is
	// being handled; the second comes over the new count.
	out, err := meshctl(ctx, url, "groups", "repartition", "ordered", "echo", "8")
	if err != nil || !strings.Contains(out, "done in") || !strings.Contains(out, "group.ordered.echo.e1p000..p007") {
		t.Fatalf("meshctl groups repartition ordered echo 8: %v\n%s", err, out)
	}
	t.Logf("meshctl groups repartition ordered echo 8:\n%s", out)
	batch()
	seen := map[string][]string{}
	total := 0
	for total < len(keyOf) {
		select {
		case p := <-pongs:
			var body struct{ Ping string }
			_ = json.Unmarshal(p.Body, &body)
			key, ok := keyOf[body.Ping]
			if !ok {
				t.Fatalf("a pong for %s, which was not sent", body.Ping)
			}
			seen[key] = append(seen[key], body.Ping)
			total++
		case <-ctx.Done():
			t.Fatalf("%d of %d events handled", total, len(keyOf))
		}
	}
	for key, want := range order {
		if got := seen[key]; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("key %s: handled in the order\n%v\nwant\n%v", key, got, want)
		}
	}
}
