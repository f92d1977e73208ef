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

// TestAGroupByRuleAndItsDeadLettersUnderMeshd (issue 61): the user's module
// binary in group books, ordered by order_key body.acct over 4 partitions
// on two nodes of the release's meshd, handles each account's events in
// the order they were published: events the release's meshctl emits with
// no key, and a foreign publisher's (raw amqp091-go) with none either,
// every one keyed by its body's acct through the group's intake. An event
// whose handling fails is dead-lettered after its max_attempts, naming the
// group's partition; the release's meshctl dlq replay sends it back there,
// and the group handles it again (and dead-letters it again: it fails for
// good). meshctl topology print shows the ordered group's queues.
func TestAGroupByRuleAndItsDeadLettersUnderMeshd(t *testing.T) {
	url := brokertest.VHost(t)
	echo := userModule(t, "./runtime/testdata/echomodule")
	entry := fmt.Sprintf("  - name: echo\n    path: %s\n    tools: [\"echo.upper\"]\n    group: books\n    partitions: 4\n    order_key: body.acct\n    concurrency: 4\n    max_attempts: 2\n", echo)
	var first *node
	for _, name := range []string{uniqueName("east"), uniqueName("west")} {
		n := startNode(t, url, name, entry)
		if first == nil {
			first = n
		}
	}
	pongs := brokertest.Tap(t, url, wire.ExchangeEvents, "module.echo.pong")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	raw := brokertest.Channel(t, url)
	if err := raw.Confirm(false); err != nil {
		t.Fatal(err)
	}
	order := map[string][]string{} // account → ids in publish order
	accountOf := map[string]string{}
	for i := range 8 {
		for _, acct := range []string{"a1", "a2", "a3"} {
			body := fmt.Sprintf(`{"do":"pong","acct":%q}`, acct)
			var id string
			if i%2 == 0 {
				out, err := meshctl(ctx, url, "emit", "--schema", "", "mesh.test.ping", body)
				if err != nil {
					t.Fatal(err)
				}
				id = strings.TrimSpace(out)
			} else {
				id = ulid.Make().String()
				conf, err := raw.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, "mesh.test.ping", true, false, amqp.Publishing{
					MessageId: id, ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, Body: []byte(body),
					Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "foreign", wire.HeaderNode: "outside", wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)}})
				if err != nil || !conf.Wait() {
					t.Fatalf("publish: %v", err)
				}
			}
			order[acct] = append(order[acct], id)
			accountOf[id] = acct
		}
	}
	seen := map[string][]string{}
	for total := 0; total < len(accountOf); total++ {
		select {
		case p := <-pongs:
			var body struct{ Ping string }
			_ = json.Unmarshal(p.Body, &body)
			acct, ok := accountOf[body.Ping]
			if !ok {
				t.Fatalf("a pong for %s, which was not sent", body.Ping)
			}
			seen[acct] = append(seen[acct], body.Ping)
		case <-ctx.Done():
			t.Fatalf("%d of %d events handled", total, len(accountOf))
		}
	}
	for acct, want := range order {
		if got := seen[acct]; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("account %s: handled in the order\n%v\nwant\n%v", acct, got, want)
		}
	}

	// A failing event: dead-lettered from the group's partition, replayed
	// there by meshctl, handled and dead-lettered again.
	out, err := meshctl(ctx, url, "emit", "--schema", "", "mesh.test.ping", `{"do":"fail","acct":"a9"}`)
	if err != nil {
		t.Fatal(err)
	}
	failing := strings.TrimSpace(out)
	partition := wire.PartitionQueue("books", "echo", wire.Slot("a9")%4)
	deadOnce := func(what string) {
		t.Helper()
		for {
			select {
			case d := <-dead:
				if d.MessageId != failing {
					continue
				}
				if q := d.Headers[wire.HeaderDeadQueue]; q != partition {
					t.Errorf("%s: dead-lettered from %v, want the group's partition %s", what, q, partition)
				}
				return
			case <-ctx.Done():
				t.Fatalf("%s: the failing event was not dead-lettered", what)
			}
		}
	}
	deadOnce("first")
	if out, err := meshctl(ctx, url, "dlq", "replay", "--id", failing); err != nil {
		t.Fatalf("meshctl dlq replay: %v\n%s", err, out)
	}
	deadOnce("after the replay")

	out, err = meshctl(ctx, url, "topology", "print", "--config", first.config)
	if err != nil {
		t.Fatalf("meshctl topology print: %v\n%s", err, out)
	}
	for _, want := range []string{"exchange  group.books.echo ", "queue     group.books.echo.intake", "queue     group.books.echo.p003", "x-single-active-consumer=true"} {
		if !strings.Contains(out, want) {
			t.Errorf("meshctl topology print lacks %q:\n%s", want, out)
		}
	}
}
