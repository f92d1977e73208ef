package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/schema"
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

const (
	quoteRequest  = `{"type": "object", "required": ["qty"], "properties": {"qty": {"type": "integer", "minimum": 1}}}`
	quoteResponse = `{"type": "object", "required": ["price"], "properties": {"price": {"type": "number", "minimum": 0}}}`
)

// TestToolSchemasAtServe: a served tool's request is validated against
// its current version before the handler runs (refused with a permanent
// invalid_request naming the pointer and the keyword, the handler not
// run, refused again on a repeat), its response after (a permanent
// invalid_response, stored as a repeat's answer: the handler ran once);
// the heartbeats carry the tool's versions by digest apart from the
// events' and the announcement their documents; a schema for a tool the
// module does not serve, or a Response on an event's, is refused at load;
// skip_body_validation checks neither.
func TestToolSchemasAtServe(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "depot", func(c *runtime.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	raw := rawConn(t, url)
	watch := watchQueue(t, raw, "node.*.schemas", "node.*.heartbeat")

	var runs atomic.Int32
	quoter := func(name string, schemas ...sdk.Schema) sdk.Module {
		return sdk.Module{Name: name, Emits: []string{"order.placed"}, Schemas: schemas, Setup: func(m sdk.Mesh) error {
			return m.Serve(name+".quote", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
				runs.Add(1)
				var in struct{ Qty int }
				if err := req.Decode(&in); err != nil {
					return nil, sdk.Permanent(err)
				}
				return map[string]int{"price": 10 - in.Qty}, nil
			}))
		}}
	}
	v1 := sdk.Schema{Tool: "shop.quote", Version: "1", JSON: []byte(`{"type": "object"}`)}
	v2 := sdk.Schema{Tool: "shop.quote", Version: "2", JSON: []byte(quoteRequest), Response: []byte(quoteResponse)}
	ev := sdk.Schema{Event: "order.placed", Version: "1", JSON: []byte(orderV1)}
	load(t, n, quoter("shop", ev, v1, v2), runtime.ModuleConfig{})

	ctx := callCtx(t, 30*time.Second)
	var got struct{ Price int }
	if err := n.Call(ctx, "test", "shop.quote", map[string]int{"qty": 2}, &got); err != nil || got.Price != 8 || runs.Load() != 1 {
		t.Fatalf("a conforming call: %+v %v (%d runs)", got, err, runs.Load())
	}
	toolErr := func(err error, code, says string) bool {
		var te *sdk.ToolError
		return errors.As(err, &te) && te.Code == code && te.Permanent && errors.Is(err, sdk.ErrPermanent) && strings.Contains(te.Message, says)
	}
	runs.Store(0)
	for _, c := range []struct {
		req  any
		says string
	}{
		{map[string]int{"qty": 0}, "request to shop.quote: body does not conform to its schema (version 2): /qty: minimum:"},
		{map[string]string{"qty": "two"}, "/qty: type:"},
		{map[string]int{}, "/: required:"}, // version 1 took it; version 2 is the current one
	} {
		if err := n.Call(ctx, "test", "shop.quote", c.req, nil); !toolErr(err, "invalid_request", c.says) {
			t.Errorf("request %v: %v, want a permanent invalid_request saying %q", c.req, err, c.says)
		}
	}
	if err := n.Call(ctx, "test", "shop.quote", map[string]int{"qty": 11}, nil); !toolErr(err, "invalid_response",
		"response of shop.quote: body does not conform to its schema (version 2): /price: minimum:") {
		t.Errorf("a response breaking the schema: %v, want a permanent invalid_response naming /price", err)
	}
	if runs.Load() != 1 {
		t.Errorf("the handler ran %d times, want once: never for a refused request", runs.Load())
	}

	// Calls made in a handling that fails once: the retry repeats the
	// request id. The refused response is the stored answer (the handler
	// ran once); the refused request is refused again, never run.
	runs.Store(0)
	answers := make(chan string, 4)
	load(t, n, sdk.Module{Name: "buyer", Calls: []string{"shop.quote"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.buy.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var qty int
			_ = json.Unmarshal(ev.Body, &qty)
			err := m.Call(ctx, "shop.quote", map[string]int{"qty": qty}, nil)
			var te *sdk.ToolError
			if errors.As(err, &te) {
				answers <- te.Code + ": " + te.Message
			} else {
				answers <- fmt.Sprint(err)
			}
			if ev.Attempt == 1 {
				return errors.New("once more")
			}
			return nil
		}))
	}}, runtime.ModuleConfig{})
	for _, qty := range []int{11, 0} {
		if _, err := n.Emit(emitCtx(t), "test", "mesh.buy.it", qty); err != nil {
			t.Fatal(err)
		}
		var first, second string
		for _, a := range []*string{&first, &second} {
			select {
			case *a = <-answers:
			case <-time.After(20 * time.Second):
				t.Fatalf("qty %d: the buyer's handler called %q, no more", qty, first)
			}
		}
		if first != second || !strings.HasPrefix(first, map[int]string{11: "invalid_response:", 0: "invalid_request:"}[qty]) {
			t.Errorf("qty %d: the answers %q and %q, want the same refusal twice", qty, first, second)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("the handler ran %d times for two repeated calls, want once (the refused response's)", runs.Load())
	}

	// The heartbeat: the tool's versions apart from the event's; the
	// announcement: their documents.
	var sawAnnouncement, sawHeartbeat bool
	for !sawAnnouncement || !sawHeartbeat {
		d := nextFrom(t, raw, watch)
		switch d.RoutingKey {
		case "node.depot.schemas":
			var a runtime.SchemasAnnouncement
			if err := json.Unmarshal(d.Body, &a); err != nil {
				t.Fatal(err)
			}
			if a.Module != "shop" {
				continue
			}
			if len(a.Schemas) != 3 || a.Schemas[2].Tool != "shop.quote" || a.Schemas[2].Type != "" || !a.Schemas[2].Current || a.Schemas[1].Current ||
				!strings.Contains(string(a.Schemas[2].Schema), `"minimum":1`) || !strings.Contains(string(a.Schemas[2].Response), `"price"`) ||
				a.Schemas[1].Response != nil || a.Schemas[2].ResponseDigest != schema.Digest([]byte(quoteResponse)) {
				t.Fatalf("announcement %s", d.Body)
			}
			sawAnnouncement = true
		case "node.depot.heartbeat":
			var hb runtime.Heartbeat
			if err := json.Unmarshal(d.Body, &hb); err != nil {
				t.Fatal(err)
			}
			for _, mod := range hb.Modules {
				if mod.Name != "shop" {
					continue
				}
				want := []schema.Declared{
					{Tool: "shop.quote", Version: "1", Digest: schema.Digest(v1.JSON)},
					{Tool: "shop.quote", Version: "2", Digest: schema.Digest(v2.JSON), ResponseDigest: schema.Digest(v2.Response), Current: true},
				}
				if !slices.Equal(mod.ToolSchemas, want) || len(mod.Schemas) != 1 || mod.Schemas[0].Type != "module.shop.order.placed" {
					t.Fatalf("the heartbeat's shop: schemas %+v, tool schemas %+v, want %+v", mod.Schemas, mod.ToolSchemas, want)
				}
				sawHeartbeat = true
			}
		}
	}

	// Declarations the node refuses at load.
	for _, c := range []struct {
		def  sdk.Module
		says string
	}{
		{quoter("typo", sdk.Schema{Tool: "typo.quotes", Version: "1", JSON: []byte(`true`)}), `the module does not serve the tool "typo.quotes"`},
		{quoter("both", sdk.Schema{Event: "order.placed", Tool: "both.quote", Version: "1", JSON: []byte(`true`)}), "names the event"},
		{quoter("evresp", sdk.Schema{Event: "order.placed", Version: "1", JSON: []byte(`true`), Response: []byte(`true`)}), "has a Response schema"},
		{quoter("badresp", sdk.Schema{Tool: "badresp.quote", Version: "1", Response: []byte(`{"type": 3}`)}), "its response: invalid schema"},
	} {
		lctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := n.Load(lctx, c.def, runtime.ModuleConfig{})
		cancel()
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("load %s: %v, want ErrInvalid saying %q", c.def.Name, err, c.says)
		}
	}

	// Validation off: neither checked.
	runs.Store(0)
	load(t, n, quoter("loose", sdk.Schema{Tool: "loose.quote", Version: "1", JSON: []byte(quoteRequest), Response: []byte(quoteResponse)}),
		runtime.ModuleConfig{SkipBodyValidation: true})
	for _, qty := range []int{0, 11} {
		if err := n.Call(ctx, "test", "loose.quote", map[string]int{"qty": qty}, nil); err != nil {
			t.Errorf("validation off, qty %d: %v", qty, err)
		}
	}
	if runs.Load() != 2 {
		t.Errorf("validation off: the handler ran %d times, want 2", runs.Load())
	}
}
