package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

const orderV1 = `{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}`
const orderV2 = `{"type": "object", "required": ["id", "price"], "properties": {"id": {"type": "string"}, "price": {"type": "number", "minimum": 0}}}`

func shop(schemas ...sdk.Schema) sdk.Module {
	return sdk.Module{Name: "shop", Emits: []string{"order.placed"}, Schemas: schemas}
}

// TestSchemasAtEmitAndDelivery: an emit of a declared type is validated
// against the current version (refused with the pointer and the keyword,
// or with another WithSchema) and carries x-schema on the wire; a handler
// that reads version 1 gets version 2 dead-lettered with reason schema
// (checked with raw amqp091-go), one that reads both gets it; the node's
// heartbeats carry the versions by digest and its announcement the
// documents; skip_body_validation keeps x-schema and validates nothing.
func TestSchemasAtEmitAndDelivery(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "depot", func(c *runtime.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	raw := rawConn(t, url)
	watch := watchQueue(t, raw, "module.shop.#", "node.*.schemas", "node.*.heartbeat")

	old, both := newRecorder(nil), newRecorder(nil)
	load(t, n, sdk.Module{Name: "ledger", Reads: map[string][]string{"module.shop.order.placed": {"1"}},
		Setup: func(m sdk.Mesh) error { return m.On("module.shop.order.placed", old) }}, runtime.ModuleConfig{})
	load(t, n, sdk.Module{Name: "books", Reads: map[string][]string{"module.shop.#": {"1", "2"}},
		Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", both) }}, runtime.ModuleConfig{})
	v1 := sdk.Schema{Event: "order.placed", Version: "1", JSON: []byte(orderV1)}
	v2 := sdk.Schema{Event: "order.placed", Version: "2", JSON: []byte(orderV2)}
	m := load(t, n, shop(v1, v2), runtime.ModuleConfig{}).Mesh()

	ctx := emitCtx(t)
	for _, c := range []struct {
		body any
		opts []sdk.EmitOption
		says string
	}{
		{map[string]any{"id": "o-1", "price": -1}, nil, "/price: minimum:"},
		{map[string]any{"id": 7, "price": 1}, nil, "/id: type:"},
		{map[string]any{"id": "o-1"}, nil, "/: required:"},
		{map[string]any{"id": "o-1", "price": 1}, []sdk.EmitOption{sdk.WithSchema("1")}, `x-schema "1" asked for`},
	} {
		if _, err := m.Emit(ctx, "order.placed", c.body, c.opts...); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("emit %v: %v, want ErrInvalid saying %q", c.body, err, c.says)
		}
	}
	id, err := m.Emit(ctx, "order.placed", map[string]any{"id": "o-2", "price": 3})
	if err != nil {
		t.Fatal(err)
	}

	// On the wire: the one event that passed, with its version; the
	// announcement with both documents; a heartbeat naming both digests.
	var sawEvent, sawAnnouncement, sawHeartbeat bool
	for !sawEvent || !sawAnnouncement || !sawHeartbeat {
		d := nextFrom(t, raw, watch)
		switch {
		case d.RoutingKey == "module.shop.order.placed":
			if d.Headers[wire.HeaderEventID] != id || d.Headers[wire.HeaderSchema] != "2" {
				t.Fatalf("on the wire: %v %s, want only %s with x-schema 2", d.Headers, d.Body, id)
			}
			sawEvent = true
		case d.RoutingKey == "node.depot.schemas":
			var a runtime.SchemasAnnouncement
			if err := json.Unmarshal(d.Body, &a); err != nil {
				t.Fatal(err)
			}
			if a.Module != "shop" || len(a.Schemas) != 2 || a.Schemas[0].Current || !a.Schemas[1].Current ||
				a.Schemas[1].Type != "module.shop.order.placed" || a.Schemas[1].Version != "2" || !strings.Contains(string(a.Schemas[1].Schema), `"minimum":0`) {
				t.Fatalf("announcement %s", d.Body)
			}
			sawAnnouncement = true
		case d.RoutingKey == "node.depot.heartbeat":
			var hb runtime.Heartbeat
			if err := json.Unmarshal(d.Body, &hb); err != nil {
				t.Fatal(err)
			}
			for _, mod := range hb.Modules {
				switch mod.Name {
				case "shop":
					sawHeartbeat = len(mod.Schemas) == 2 && mod.Schemas[1].Version == "2" && len(mod.Schemas[1].Digest) == 64
				case "ledger":
					if fmt.Sprint(mod.Reads) != "map[module.shop.order.placed:[1]]" {
						t.Errorf("ledger's reads in the heartbeat: %v", mod.Reads)
					}
				}
			}
		}
	}

	// Version 2 to a reader of 1: dead-lettered, never handled.
	d := nextDead(t, raw)
	if d.Headers[wire.HeaderEventID] != id || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonSchema ||
		!strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadError]), `reads versions ["1"], the event has 2`) {
		t.Fatalf("dead letter %v", d.Headers)
	}
	if ev := both.next(t); ev.ID != id || ev.Schema != "2" {
		t.Errorf("the reader of 1 and 2 got %+v", ev)
	}
	if old.count() != 0 {
		t.Errorf("the reader of version 1 handled version 2")
	}

	// Declarations the node refuses at load.
	for _, c := range []struct {
		def  sdk.Module
		says string
	}{
		{shop(sdk.Schema{Event: "order.shipped", Version: "1", JSON: []byte(`true`)}), "not in the module's Emits"},
		{shop(v1, v1), "declared twice"},
		{shop(sdk.Schema{Event: "order.placed", Version: "1", JSON: []byte(`{"type": 3}`)}), "invalid schema"},
		{shop(sdk.Schema{Event: "order.placed", Version: "", JSON: []byte(`true`)}), "schema version is empty"},
		{sdk.Module{Name: "typo", Reads: map[string][]string{"module.shop.orders": {"1"}},
			Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", both) }}, "does not subscribe"},
		{sdk.Module{Name: "empty", Reads: map[string][]string{"module.shop.#": {}},
			Setup: func(m sdk.Mesh) error { return m.On("module.shop.#", both) }}, "lists no version"},
	} {
		c.def.Name += "x"
		lctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := n.Load(lctx, c.def, runtime.ModuleConfig{})
		cancel()
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("load %s: %v, want ErrInvalid saying %q", c.def.Name, err, c.says)
		}
	}

	// Validation off: the version still set, the body not checked.
	loose := shop(v1, v2)
	loose.Name = "loose"
	lm := load(t, n, loose, runtime.ModuleConfig{SkipBodyValidation: true}).Mesh()
	if _, err := lm.Emit(ctx, "order.placed", map[string]any{"id": 1}); err != nil {
		t.Fatalf("an emit with validation off: %v", err)
	}
}
