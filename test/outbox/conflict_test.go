package outbox_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/pgtest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestTheInboxConflictIsDeadLetteredAsConflict: a publisher outside the
// mesh (raw amqp091-go) sends an order's id again with another body. The
// ledger module process, whose inbox holds the id with the first body,
// has the copy dead-lettered with reason conflict even where its node's
// own de-duplication has no record of the id: a module with
// allow_duplicates, and a second node whose ledger shares the first's
// PostgreSQL. The dead letters are read with raw amqp091-go.
func TestTheInboxConflictIsDeadLetteredAsConflict(t *testing.T) {
	t.Parallel()
	bin := ledger(t)
	for _, kind := range []string{"allow_duplicates", "two-nodes-one-postgres"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			url := brokertest.VHost(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args, cfg := []string{"sqlite", filepath.Join(dir, "ledger.db"), dir}, runtime.ModuleConfig{AllowDuplicates: true}
			if kind != "allow_duplicates" {
				args, cfg = []string{"postgres", pgtest.Start(t), dir}, runtime.ModuleConfig{}
			}
			load := func(node *runtime.Node, name string) {
				t.Helper()
				lifecycle := make(events, 16)
				if _, err := node.Load(ctx, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error {
					return m.On("node."+name+".module.#", lifecycle)
				}}, runtime.ModuleConfig{}); err != nil {
					t.Fatal(err)
				}
				pm, err := node.LoadPlugin(ctx, bin, args, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_ = pm.Stop(ctx)
				})
				for ev := lifecycle.next(t, "the ledger's start"); ev.Type != "node."+name+".module.started"; ev = lifecycle.next(t, "the ledger's start") {
				}
			}
			ch := brokertest.Channel(t, url)
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			id := ulid.Make().String()
			publish := func(body string) {
				t.Helper()
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh.events", "mesh.ledger.book", false, false, amqp.Publishing{
					Headers:     amqp.Table{"x-event-id": id, "x-source": "shop", "x-node": "till", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
					ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(body)})
				if err != nil {
					t.Fatal(err)
				}
				if ok, err := dc.WaitContext(ctx); !ok || err != nil {
					t.Fatalf("publish of %s not confirmed: %v", id, err)
				}
			}

			anchor := startNodeNamed(t, ctx, "anchor", url, sdkmetric.NewManualReader(), nil)
			dead := brokertest.Tap(t, url, "mesh.events.dead", "#")
			booked := brokertest.Tap(t, url, "mesh.events", "module.ledger.booked")
			load(anchor, "anchor")
			publish(`{"n":1}`)
			select {
			case <-booked: // the inbox holds the id: its effect committed, its event relayed
			case <-ctx.Done():
				t.Fatal("order 1 was never booked")
			}
			want := 1 // dead letters: the anchor's ledger's
			if kind != "allow_duplicates" {
				// Bravo's node never saw the id; its ledger's inbox has it.
				load(startNodeNamed(t, ctx, "bravo", url, sdkmetric.NewManualReader(), nil), "bravo")
				want = 2 // the anchor's (its node's record) and bravo's (the inbox's)
			}
			publish(`{"n":2}`)
			queues := map[string]bool{}
			for len(queues) < want {
				select {
				case d := <-dead:
					q, _ := d.Headers["x-mesh-dead-queue"].(string)
					queues[q] = true
					if d.Headers["x-event-id"] != id || d.Headers["x-mesh-dead-reason"] != "conflict" || string(d.Body) != `{"n":2}` {
						t.Errorf("dead letter from %s: reason %v, error %v, id %v, body %s; want %s's other body with reason conflict",
							q, d.Headers["x-mesh-dead-reason"], d.Headers["x-mesh-dead-error"], d.Headers["x-event-id"], d.Body, id)
					}
				case <-ctx.Done():
					t.Fatalf("dead letters from %v, want %d", queues, want)
				}
			}
			if kind != "allow_duplicates" && !strings.Contains(strings.Join(keys(queues), " "), "bravo") {
				t.Errorf("dead letters from %v, want one from bravo's ledger", queues)
			}
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
