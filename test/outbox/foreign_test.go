package outbox_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
)

// foreignPublisher publishes, with amqplib (Node.js), events of the wire
// contract to mesh.events: argv[3] is a JSON list of [id, cents] to send
// as mesh.shop.paid, in order.
const foreignPublisher = `
const amqp = require("amqplib");
(async () => {
  const conn = await amqp.connect(process.argv[2]);
  const ch = await conn.createConfirmChannel();
  for (const [id, cents] of JSON.parse(process.argv[3])) {
    ch.publish("mesh.events", "mesh.shop.paid", Buffer.from(JSON.stringify({ cents })), {
      headers: { "x-event-id": id, "x-source": "shop", "x-node": "js", "x-time": new Date().toISOString() },
      contentType: "application/json", persistent: true, mandatory: true });
  }
  await ch.waitForConfirms();
  await conn.close();
})().catch((e) => { console.error(e); process.exit(1); });
`

// TestForeignPublisherEffectsOnce: a Node.js publisher (amqplib) sends
// each payment's id twice and one id again with another body. The
// ledger, handling them through the inbox on SQLite, applies each
// payment once and emits each one's event once; the copy with another
// body is dead-lettered with reason conflict, applied never.
func TestForeignPublisherEffectsOnce(t *testing.T) {
	t.Parallel()
	nodeJS, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("this test needs Node.js (Debian's nodejs and npm): a publisher of another language")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("this test needs npm, to install amqplib")
	}
	dir := t.TempDir()
	if out, err := exec.Command(npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--silent", "amqplib@0.10.4").CombinedOutput(); err != nil {
		t.Fatalf("npm install amqplib: %v\n%s", err, out)
	}
	script := filepath.Join(dir, "publish.js")
	if err := os.WriteFile(script, []byte(foreignPublisher), 0o644); err != nil {
		t.Fatal(err)
	}

	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := startNode(t, ctx, url, sdkmetric.NewManualReader(), nil)
	dead := brokertest.Tap(t, url, "mesh.events.dead", "#")
	booked := brokertest.Tap(t, url, "mesh.events", "module.ledger.booked")

	db, err := outbox.OpenSQLite(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE balance (id INTEGER PRIMARY KEY CHECK (id = 1), cents INTEGER NOT NULL); INSERT INTO balance VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	def := sdk.Module{Name: "ledger", Emits: []string{"booked"}}
	ob, err := outbox.New(ctx, db, def)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	committed := make(chan string, 16)
	in := ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
		var p struct{ Cents int }
		if err := ev.Decode(&p); err != nil {
			return sdk.Permanent(err)
		}
		mu.Lock()
		runs[ev.ID]++
		mu.Unlock()
		if _, err := tx.ExecContext(ctx, `UPDATE balance SET cents = cents + ?`, p.Cents); err != nil {
			return err
		}
		_, err := ob.Emit(ctx, tx, "booked", map[string]int{"cents": p.Cents})
		return err
	})
	def.Setup = func(m sdk.Mesh) error {
		return m.On("mesh.shop.paid", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			err := in.HandleEvent(ctx, ev)
			if err == nil {
				committed <- ev.ID
			}
			return err
		}))
	}
	def.Run = ob.Relay
	if _, err := node.Load(ctx, def, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}

	x, y, marker := ulid.Make().String(), ulid.Make().String(), ulid.Make().String()
	sends := `[["` + x + `",10],["` + x + `",10],["` + y + `",5],["` + y + `",5],["` + x + `",99],["` + marker + `",0]]`
	cmd := exec.CommandContext(ctx, nodeJS, script, url, sends)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Node.js publisher: %v\n%s", err, out)
	}

	// The ledger handles one event at a time, in queue order: once the
	// marker is committed, every copy before it has been dealt with.
	for done := false; !done; {
		select {
		case id := <-committed:
			done = id == marker
		case <-ctx.Done():
			t.Fatal("the marker was never handled")
		}
	}
	var cents int
	if err := db.QueryRow(`SELECT cents FROM balance`).Scan(&cents); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if cents != 15 || runs[x] != 1 || runs[y] != 1 || runs[marker] != 1 {
		t.Errorf("balance %d after runs %v; want 15, each payment applied once", cents, runs)
	}
	mu.Unlock()
	select {
	case d := <-dead:
		if d.Headers["x-event-id"] != x || d.Headers["x-mesh-dead-reason"] != "conflict" || string(d.Body) != `{"cents":99}` {
			t.Errorf("dead letter %v %s, want %s's other body with reason conflict", d.Headers, d.Body, x)
		}
	case <-ctx.Done():
		t.Fatal("the conflicting copy was never dead-lettered")
	}
	ids := map[string]bool{}
	for len(ids) < 3 {
		select {
		case d := <-booked:
			id, _ := d.Headers["x-event-id"].(string)
			if ids[id] {
				t.Errorf("booked event %s published twice", id)
			}
			ids[id] = true
		case <-ctx.Done():
			t.Fatalf("the relay published %d booked events, want 3", len(ids))
		}
	}
}
