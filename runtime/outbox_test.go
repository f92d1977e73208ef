package runtime_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
)

// TestOutboxBacklogMetrics: a module's outbox relay reports its backlog
// to the node: mesh_outbox_unsent falls to 0 once its rows are published,
// and a row the node refuses (a type the module may not emit) counts in
// mesh_outbox_set_aside.
func TestOutboxBacklogMetrics(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	reader := sdkmetric.NewManualReader()
	n := testNode(t, url, "anchor", func(c *runtime.Config) {
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		c.HeartbeatInterval = 200 * time.Millisecond
	})
	heartbeats := brokertest.Tap(t, url, "mesh.events", "node.anchor.heartbeat")
	db, err := outbox.OpenSQLite(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	def := sdk.Module{Name: "ledger", Emits: []string{"booked"}}
	ob, err := outbox.New(context.Background(), db, def)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"booked", "mesh.billing.paid", "booked"} {
		var opts []sdk.EmitOption
		if name != "booked" {
			opts = append(opts, sdk.AsFullType())
		}
		if _, err := ob.Emit(ctx, tx, name, map[string]int{}, opts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	def.Run = ob.Relay
	load(t, n, def, runtime.ModuleConfig{})
	waitFor(t, 30*time.Second, func() bool {
		v, _ := collect(t, reader)
		return v["mesh.outbox.set_aside module=ledger"] == 1 && v["mesh.outbox.unsent module=ledger"] == 0 &&
			v["mesh.outbox.oldest_age_seconds module=ledger"] == 0
	})
	if v, _ := collect(t, reader); v["mesh.events.emitted module=ledger"] != 2 {
		t.Errorf("emitted %d, want the 2 rows of its own type", v["mesh.events.emitted module=ledger"])
	}
	// The heartbeat carries it to the console's overview.
	deadline := time.After(30 * time.Second)
	for {
		select {
		case d := <-heartbeats:
			var hb runtime.Heartbeat
			if err := json.Unmarshal(d.Body, &hb); err != nil {
				t.Fatal(err)
			}
			for _, m := range hb.Modules {
				if m.Name == "ledger" && m.Outbox != nil && m.Outbox.SetAside == 1 && m.Outbox.Unsent == 0 && m.Outbox.Oldest == nil {
					return
				}
			}
		case <-deadline:
			t.Fatal("no heartbeat carried the ledger's outbox")
		}
	}
}
