package meshtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// TestSettleJumpsTheClockThroughRetries: retries run at their back-off
// times on the mesh's clock, exponential from RetryMin, and Settle gets
// there without waiting.
func TestSettleJumpsTheClockThroughRetries(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mt := meshtest.New(meshtest.Config{Start: start, RetryMin: time.Second, RetryMax: time.Minute, MaxAttempts: 4})
	defer mt.Close()
	var at []time.Duration
	err := mt.Load(sdk.Module{Name: "flaky", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.x.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			at = append(at, mt.Now().Sub(start))
			return errors.New("no")
		}))
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mt.Emit(context.Background(), "test", "mesh.x.y", 1); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}
	if len(at) != len(want) {
		t.Fatalf("attempts at %v, want %v", at, want)
	}
	for i := range want {
		if at[i] != want[i] {
			t.Errorf("attempt %d at %v, want %v", i+1, at[i], want[i])
		}
	}
	if dl := mt.DeadLetters(); len(dl) != 1 || dl[0].Reason != "delivery_limit" || dl[0].Attempts != 4 || dl[0].Module != "flaky" {
		t.Errorf("dead letters %+v", dl)
	}
}

// TestAdvanceMovesTheClock: Advance moves Now, and events emitted then
// carry that time.
func TestAdvanceMovesTheClock(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	before := mt.Now()
	mt.Advance(time.Hour)
	if got := mt.Now().Sub(before); got != time.Hour {
		t.Errorf("advanced %v, want 1h", got)
	}
	if _, err := mt.Emit(context.Background(), "test", "mesh.x.y", 1); err != nil {
		t.Fatal(err)
	}
	if ev := mt.Emitted()[0]; !ev.Time.Equal(mt.Now()) || ev.Node != "test" || ev.Source != "test" {
		t.Errorf("event %+v", ev)
	}
}

// TestRefusals: the mesh refuses what a node refuses.
func TestRefusals(t *testing.T) {
	mt := meshtest.New(meshtest.Config{MaxBodyBytes: 16})
	defer mt.Close()
	ctx := context.Background()
	for name, err := range map[string]error{
		"bad type":      func() error { _, err := mt.Emit(ctx, "test", "nope", 1); return err }(),
		"too large":     func() error { _, err := mt.Emit(ctx, "test", "mesh.x.y", "a body longer than sixteen"); return err }(),
		"not json":      func() error { _, err := mt.Emit(ctx, "test", "mesh.x.y", []byte("{")); return err }(),
		"bad module":    mt.Load(sdk.Module{Name: "a.b"}, meshtest.ModuleConfig{}),
		"bad kind":      mt.Load(sdk.Module{Name: "k", Kind: "robot"}, meshtest.ModuleConfig{}),
		"bad redeliver": mt.Redeliver("01J0000000000000000000000"),
	} {
		if err == nil {
			t.Errorf("%s accepted", name)
		} else if name != "bad redeliver" && !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := mt.Call(ctx, "test", "no.server", 1, nil); !errors.Is(err, sdk.ErrNoServer) {
		t.Errorf("call without a server: %v", err)
	}
	if calls := mt.Calls(); len(calls) != 1 || calls[0].Ran || !errors.Is(calls[0].Err, sdk.ErrNoServer) {
		t.Errorf("calls %+v", calls)
	}
	mt.Close()
	if _, err := mt.Emit(ctx, "test", "mesh.x.y", 1); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("emit after close: %v, want ErrClosed", err)
	}
}

// TestTTLExpiresOnTheClock: an event whose time to live runs out on the
// mesh's clock before a handler takes it is dead-lettered as expired, not
// handled; a retry past it too.
func TestTTLExpiresOnTheClock(t *testing.T) {
	mt := meshtest.New(meshtest.Config{RetryMin: time.Minute})
	defer mt.Close()
	handled := 0
	err := mt.Load(sdk.Module{Name: "slow", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.x.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			handled++
			if ev.Type == "mesh.x.retried" {
				return errors.New("not yet")
			}
			return nil
		}))
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := mt.Emit(ctx, "test", "mesh.x.late", 1, sdk.WithTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	mt.Advance(2 * time.Second)
	if _, err := mt.Emit(ctx, "test", "mesh.x.retried", 1, sdk.WithTTL(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	dl := mt.DeadLetters()
	if handled != 1 || len(dl) != 2 || dl[0].Reason != "expired" || dl[0].Event.Type != "mesh.x.late" || dl[0].Attempts != 0 ||
		dl[1].Reason != "expired" || dl[1].Event.Type != "mesh.x.retried" || dl[1].Attempts != 1 {
		t.Errorf("handled %d, dead letters %+v; want the late event expired unhandled, the retried one after 1 attempt", handled, dl)
	}
}

// TestPutHoldAndDeadline: a message put into a consumed queue waits while
// the queue is held, is handled once released, and one whose x-deadline
// passed on the mesh's clock is dead-lettered as expired, unhandled.
func TestPutHoldAndDeadline(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mt := meshtest.New(meshtest.Config{Start: start})
	defer mt.Close()
	var got []string
	var m sdk.Mesh
	if err := mt.Load(sdk.Module{Name: "taker", Setup: func(mm sdk.Mesh) error {
		m = mm
		return errors.Join(mm.Consume("legacy.orders", 1, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			got = append(got, ev.ID+"@"+ev.Queue)
			return nil
		})), mm.Hold("legacy.orders", true))
	}}, meshtest.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := mt.Put("legacy.orders", "o-1", "", []byte("raw"), nil); err != nil {
		t.Fatal(err)
	}
	late := start.Add(-time.Second).Format(time.RFC3339Nano)
	if err := mt.Put("legacy.orders", "o-2", "", []byte("raw"), map[string]string{"x-deadline": late}); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if len(got) != 0 || len(mt.DeadLetters()) != 0 {
		t.Fatalf("a held queue's messages ran: %v, %+v", got, mt.DeadLetters())
	}
	if err := m.Hold("legacy.orders", false); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if len(got) != 1 || got[0] != "o-1@legacy.orders" {
		t.Errorf("handled %v", got)
	}
	if dl := mt.DeadLetters(); len(dl) != 1 || dl[0].Event.ID != "o-2" || dl[0].Reason != "expired" || dl[0].Queue != "legacy.orders" {
		t.Errorf("dead letters %+v", dl)
	}
	if err := mt.Put("legacy.nobody", "x", "", nil, nil); err == nil {
		t.Error("a put into a queue no module consumes was accepted")
	}
	if err := m.Hold("legacy.nobody", true); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("hold of a queue not consumed: %v", err)
	}
}

// TestFailingRunStopsTheModule: WaitRun returns a failed Run's error, and
// the module handles nothing more: what it is sent waits.
func TestFailingRunStopsTheModule(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	handled := 0
	err := mt.Load(sdk.Module{Name: "fragile", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.On("mesh.fragile.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { handled++; return nil })),
			m.Serve("fragile.ping", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return "pong", nil })))
	}, Run: func(ctx context.Context, m sdk.Mesh) error { return errors.New("lost its socket") }}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mt.WaitRun(ctx, "fragile"); err == nil || err.Error() != "its Run failed: lost its socket" {
		t.Fatalf("WaitRun: %v", err)
	}
	if _, err := mt.Emit(ctx, "test", "mesh.fragile.x", 1); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if handled != 0 {
		t.Errorf("the stopped module handled %d events", handled)
	}
	if err := mt.Call(ctx, "test", "fragile.ping", nil, nil); !errors.Is(err, sdk.ErrNoServer) {
		t.Errorf("a call of the stopped module's tool: %v, want ErrNoServer", err)
	}
	if err := mt.WaitRun(ctx, "nobody"); err == nil {
		t.Error("WaitRun of a module not loaded returned nil")
	}
}

// TestCloseDrainsBeforeRunEnds: Close waits for a Settle running in
// another goroutine, so a handler in flight finishes before Run's ctx
// ends, as on a node.
func TestCloseDrainsBeforeRunEnds(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	inHandler, release := make(chan struct{}), make(chan struct{})
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	_ = mt.Load(sdk.Module{Name: "slow", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.slow.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
			close(inHandler)
			<-release
			note("handled")
			return nil
		}))
	}, Run: func(ctx context.Context, m sdk.Mesh) error { <-ctx.Done(); note("run ended"); return nil }}, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "test", "mesh.slow.x", 1)
	go mt.Settle()
	<-inHandler
	closed := make(chan struct{})
	go func() { mt.Close(); close(closed) }()
	close(release)
	<-closed
	if len(order) != 2 || order[0] != "handled" {
		t.Errorf("order %v, want the handler first", order)
	}
}

// TestStubRules: a bad key or a nil handler is refused; a later stub of a
// key replaces the earlier; a stub answers ahead of a loaded server.
func TestStubRules(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	if err := mt.Stub("bad..key", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return 1, nil })); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("bad key: %v", err)
	}
	if err := mt.Stub("a.b", nil); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("nil handler: %v", err)
	}
	_ = mt.Load(sdk.Module{Name: "real", Setup: func(m sdk.Mesh) error {
		return m.Serve("a.b", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return "real", nil }))
	}}, meshtest.ModuleConfig{})
	ctx := context.Background()
	var got string
	_ = mt.StubAnswer("a.b", "first", nil)
	_ = mt.StubAnswer("a.b", "second", nil)
	if err := mt.Call(ctx, "test", "a.b", nil, &got); err != nil || got != "second" {
		t.Errorf("answer %q, %v; want the later stub's", got, err)
	}
}

// TestDelayedEventsWaitOnTheClock: a delayed event waits on the mesh's
// clock (Settle does not jump to it), is delivered once the clock reaches
// its delay rounded up to the second, to the modules subscribed then, with
// its id and x-due; At works on the mesh's clock; what the cascade cannot
// carry is refused as a node refuses it.
func TestDelayedEventsWaitOnTheClock(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	start := mt.Now()
	var got []sdk.Event
	var at []time.Duration
	err := mt.Load(sdk.Module{Name: "early", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.x.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			got, at = append(got, ev), append(at, mt.Now().Sub(start))
			return nil
		}))
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	later, err := mt.Emit(ctx, "test", "mesh.x.later", 1, sdk.After(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mt.Emit(ctx, "test", "mesh.x.at", 2, sdk.At(start.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := mt.Emit(ctx, "test", "mesh.x.now", 3); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if len(got) != 1 || got[0].Type != "mesh.x.now" {
		t.Fatalf("before anything is due: handled %+v, want only mesh.x.now", got)
	}
	if waiting := mt.Delayed(); len(waiting) != 2 || waiting[0].ID != later || waiting[1].Type != "mesh.x.at" {
		t.Errorf("waiting %+v, want mesh.x.later then mesh.x.at", waiting)
	}
	mt.Advance(1500 * time.Millisecond) // due, but the cascade's resolution is a second
	mt.Settle()
	if len(got) != 1 {
		t.Errorf("handled %d events at 1.5s, want the delayed one still waiting until 2s", len(got))
	}
	mt.Advance(500 * time.Millisecond)
	mt.Settle()
	if len(got) != 2 || got[1].ID != later || at[1] != 2*time.Second || got[1].Headers["x-due"] != start.Add(1500*time.Millisecond).Format(time.RFC3339Nano) {
		t.Fatalf("handled %+v at %v, want mesh.x.later at 2s with x-due 1.5s after the start", got, at)
	}
	// A module loaded before it is due gets it; the clock moves to 1h.
	var late []string
	err = mt.Load(sdk.Module{Name: "late", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.x.at", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			late = append(late, ev.Type)
			return nil
		}))
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	mt.Advance(time.Hour)
	mt.Settle()
	if len(got) != 3 || len(late) != 1 || len(mt.Delayed()) != 0 {
		t.Errorf("after 1h: early handled %d, late %v, still waiting %d; want 3, [mesh.x.at], 0", len(got), late, len(mt.Delayed()))
	}
	for name, opts := range map[string][]sdk.EmitOption{
		"too long":       {sdk.After(9 * 365 * 24 * time.Hour)},
		"At too far":     {sdk.At(mt.Now().Add(9 * 365 * 24 * time.Hour))},
		"at most once":   {sdk.After(time.Second), sdk.AtMostOnce()},
		"After and At":   {sdk.After(time.Second), sdk.At(mt.Now().Add(time.Minute))},
		"negative delay": {sdk.After(-time.Second)},
	} {
		if _, err := mt.Emit(ctx, "test", "mesh.x.y", 1, opts...); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// orderSchemaV1 and orderSchemaV2 are two versions of a body's schema.
var (
	orderSchemaV1 = []byte(`{"type": "object", "required": ["total"]}`)
	orderSchemaV2 = []byte(`{
		"type": "object",
		"properties": {
			"total": {"type": "number", "minimum": 0},
			"currency": {"enum": ["EUR", "USD"]},
			"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}
		},
		"required": ["total", "currency"],
		"additionalProperties": false
	}`)
)

// schemaEmitter emits, in Run, each body of emits (with its options) as
// order.placed, declared in versions 1 and 2, and records each outcome.
func schemaEmitter(emits []schemaEmit, got []error) sdk.Module {
	return sdk.Module{Name: "shop", Emits: []string{"order.placed"},
		Schemas: []sdk.Schema{{Event: "order.placed", Version: "1", JSON: orderSchemaV1}, {Event: "order.placed", Version: "2", JSON: orderSchemaV2}},
		Run: func(ctx context.Context, m sdk.Mesh) error {
			for i, e := range emits {
				_, got[i] = m.Emit(ctx, "order.placed", e.body, e.opts...)
			}
			return nil
		}}
}

type schemaEmit struct {
	body any
	opts []sdk.EmitOption
	want string // what the refusal says, or "" for none
}

// TestSchemasCheckEmits: an emit of a declared event is validated against
// its current version, refused with ErrInvalid naming the JSON pointer and
// the keyword, and carries that version as x-schema; an emit asking for
// another version is refused. With SkipBodyValidation, bodies are not
// validated but still carry x-schema.
func TestSchemasCheckEmits(t *testing.T) {
	good := map[string]any{"total": 12.5, "currency": "EUR", "sku": "ABC-12"}
	emits := []schemaEmit{
		{body: good},
		{body: good, opts: []sdk.EmitOption{sdk.WithSchema("2")}},
		{body: map[string]any{"total": "ten", "currency": "EUR"}, want: "/total: type:"},
		{body: map[string]any{"total": 1}, want: "/: required:"},
		{body: map[string]any{"total": -1, "currency": "EUR"}, want: "/total: minimum:"},
		{body: map[string]any{"total": 1, "currency": "GBP"}, want: "/currency: enum:"},
		{body: map[string]any{"total": 1, "currency": "EUR", "colour": "red"}, want: "/: additionalProperties:"},
		{body: map[string]any{"total": 1, "currency": "EUR", "sku": "abc"}, want: "/sku: pattern:"},
		{body: good, opts: []sdk.EmitOption{sdk.WithSchema("1")}, want: `x-schema "1" asked for`},
	}
	for _, skip := range []bool{false, true} {
		mt := meshtest.New(meshtest.Config{})
		got := make([]error, len(emits))
		if err := mt.Load(schemaEmitter(emits, got), meshtest.ModuleConfig{SkipBodyValidation: skip}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := mt.WaitRun(ctx, "shop"); err != nil {
			t.Fatal(err)
		}
		cancel()
		accepted := 0
		for i, e := range emits {
			want := e.want
			if skip && !strings.Contains(want, "x-schema") {
				want = "" // not validated
			}
			switch err := got[i]; {
			case want == "" && err != nil:
				t.Errorf("skip %v: emit %d (%v) refused: %v", skip, i, e.body, err)
			case want == "":
				accepted++
			case !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), want):
				t.Errorf("skip %v: emit %d (%v): %v, want ErrInvalid saying %q", skip, i, e.body, err, want)
			}
		}
		emitted := mt.Emitted()
		if len(emitted) != accepted {
			t.Errorf("skip %v: %d events emitted, want %d", skip, len(emitted), accepted)
		}
		for _, ev := range emitted {
			if ev.Schema != "2" || ev.Type != "module.shop.order.placed" {
				t.Errorf("skip %v: emitted %s with x-schema %q, want 2", skip, ev.Type, ev.Schema)
			}
		}
		mt.Close()
	}
}

// TestSchemaReadsDeadLetterOtherVersions: an event whose x-schema is not
// a version its handler reads is dead-lettered with reason "schema",
// without the handler running, and reaches DeadLetters handlers so; a
// pattern without reads takes any version; "" reads an event without
// x-schema.
func TestSchemaReadsDeadLetterOtherVersions(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	var handled []string
	var dead []sdk.Event
	h := func(ev sdk.Event) error { handled = append(handled, ev.Type+"@"+ev.Schema); return nil }
	err := mt.Load(sdk.Module{Name: "books",
		Reads: map[string][]string{"mesh.order.#": {"1", ""}, "mesh.any.#": {"*"}},
		Setup: func(m sdk.Mesh) error {
			hf := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { return h(ev) })
			return errors.Join(m.On("mesh.order.#", hf), m.On("mesh.any.#", hf), m.On("mesh.free.#", hf))
		},
		DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { dead = append(dead, ev); return nil }),
	}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range []struct {
		typ, version string
	}{{"mesh.order.placed", "1"}, {"mesh.order.placed", ""}, {"mesh.order.placed", "2"}, {"mesh.any.x", "7"}, {"mesh.free.x", "3"}} {
		var opts []sdk.EmitOption
		if e.version != "" {
			opts = append(opts, sdk.WithSchema(e.version))
		}
		if _, err := mt.Emit(ctx, "test", e.typ, map[string]int{"n": 1}, opts...); err != nil {
			t.Fatal(err)
		}
	}
	mt.Settle()
	want := []string{"mesh.order.placed@1", "mesh.order.placed@", "mesh.any.x@7", "mesh.free.x@3"}
	if !slices.Equal(handled, want) {
		t.Errorf("handled %v, want %v", handled, want)
	}
	dl := mt.DeadLetters()
	if len(dl) != 1 || dl[0].Reason != "schema" || dl[0].Event.Schema != "2" || dl[0].Attempts != 1 || dl[0].Module != "books" ||
		!strings.Contains(dl[0].Err, `reads versions ["1" ""], the event has 2`) {
		t.Fatalf("dead letters %+v, want the version 2 event, reason schema", dl)
	}
	if len(dead) != 1 || dead[0].ID != dl[0].Event.ID || dead[0].DeadReason != "schema" || dead[0].DeadQueue != "test.books.events" || dead[0].DeadError != dl[0].Err {
		t.Errorf("the DeadLetters handler got %+v", dead)
	}
}

// TestSchemaDeclarationsRefusedAtLoad: a module whose declarations a node
// refuses is refused at Load with ErrInvalid, saying why.
func TestSchemaDeclarationsRefusedAtLoad(t *testing.T) {
	on := func(patterns ...string) func(sdk.Mesh) error {
		return func(m sdk.Mesh) error {
			for _, p := range patterns {
				if err := m.On(p, sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })); err != nil {
					return err
				}
			}
			return nil
		}
	}
	v := func(event, version, doc string) sdk.Schema {
		return sdk.Schema{Event: event, Version: version, JSON: []byte(doc)}
	}
	for name, c := range map[string]struct {
		def  sdk.Module
		says string
	}{
		"undeclared event": {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("b", "1", `{}`)}}, `event "b" is not in the module's Emits`},
		"not JSON":         {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("a", "1", `{`)}}, "not JSON"},
		"not a schema":     {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("a", "1", `{"type": 12}`)}}, "invalid schema"},
		"remote ref":       {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("a", "1", `{"$ref": "https://example.org/s.json"}`)}}, "may refer only to itself"},
		"twice":            {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("a", "1", `{}`), v("a", "1", `{}`)}}, "declared twice"},
		"empty version":    {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{v("a", "", `{}`)}}, "schema version is empty"},
		"reads nothing":    {sdk.Module{Reads: map[string][]string{"mesh.x.#": {}}, Setup: on("mesh.x.#")}, "lists no version"},
		"reads bad":        {sdk.Module{Reads: map[string][]string{"mesh..x": {"1"}}, Setup: on("mesh.x.#")}, "reads:"},
		"reads unsubscribed": {sdk.Module{Reads: map[string][]string{"mesh.y.#": {"1"}}, Setup: on("mesh.x.#")},
			`the module does not subscribe "mesh.y.#"`},
		"tool not served": {sdk.Module{Schemas: []sdk.Schema{{Tool: "shop.quote", Version: "1", JSON: []byte(`{}`)}}, Setup: on("mesh.x.#")},
			`the module does not serve the tool "shop.quote"`},
		"event and tool": {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{{Event: "a", Tool: "shop.quote", Version: "1", JSON: []byte(`{}`)}}},
			`names the event "a" and the tool "shop.quote"`},
		"response on an event": {sdk.Module{Emits: []string{"a"}, Schemas: []sdk.Schema{{Event: "a", Version: "1", JSON: []byte(`{}`), Response: []byte(`{}`)}}},
			"has a Response schema"},
	} {
		mt := meshtest.New(meshtest.Config{})
		c.def.Name = "decl"
		err := mt.Load(c.def, meshtest.ModuleConfig{})
		if !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), c.says) || !strings.HasPrefix(err.Error(), "load module decl: ") {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, c.says)
		}
		mt.Close()
	}
}

// TestToolSchemasCheckRequestsAndResponses: a request that breaks the
// served tool's request schema is answered invalid_request (permanent)
// without running the handler, and is not remembered; a response that
// breaks its response schema reaches the caller as invalid_response
// (permanent), is logged, and is the stored answer of a repeat;
// skip_body_validation checks neither.
func TestToolSchemasCheckRequestsAndResponses(t *testing.T) {
	for _, skip := range []bool{false, true} {
		var logs strings.Builder
		mt := meshtest.New(meshtest.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		runs := 0
		err := mt.Load(sdk.Module{Name: "shop",
			Schemas: []sdk.Schema{{Tool: "shop.quote", Version: "1",
				JSON:     []byte(`{"type": "object", "required": ["qty"], "properties": {"qty": {"type": "integer", "minimum": 1}}}`),
				Response: []byte(`{"type": "object", "required": ["price"], "properties": {"price": {"type": "number", "minimum": 0}}}`)}},
			Setup: func(m sdk.Mesh) error {
				return m.Serve("shop.quote", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					runs++
					var in struct{ Qty int }
					_ = req.Decode(&in)
					return map[string]int{"price": 10 - in.Qty}, nil
				}))
			}}, meshtest.ModuleConfig{SkipBodyValidation: skip})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var got struct{ Price int }
		if err := mt.Call(ctx, "test", "shop.quote", map[string]int{"qty": 2}, &got); err != nil || got.Price != 8 {
			t.Errorf("skip %v: a conforming call: %+v %v", skip, got, err)
		}
		code := func(err error) string {
			var te *sdk.ToolError
			if !errors.As(err, &te) || !errors.Is(err, sdk.ErrPermanent) {
				return fmt.Sprint(err)
			}
			return te.Code + ": " + te.Message
		}
		runs = 0
		err = mt.Call(ctx, "test", "shop.quote", map[string]int{"qty": 0}, nil)
		switch {
		case skip && (err != nil || runs != 1):
			t.Errorf("validation off: a request breaking the schema: %v, %d runs", err, runs)
		case !skip && (!strings.HasPrefix(code(err), "invalid_request: request to shop.quote: body does not conform to its schema (version 1): /qty: minimum:") || runs != 0):
			t.Errorf("a request breaking the schema: %v, %d runs; want invalid_request naming /qty, the handler not run", err, runs)
		}
		runs = 0
		err = mt.Call(ctx, "test", "shop.quote", map[string]int{"qty": 11}, nil)
		switch {
		case skip && err != nil:
			t.Errorf("validation off: a response breaking the schema: %v", err)
		case !skip && (!strings.HasPrefix(code(err), "invalid_response: response of shop.quote: body does not conform to its schema (version 1): /price: minimum:") || runs != 1):
			t.Errorf("a response breaking the schema: %v, %d runs; want invalid_response naming /price", err, runs)
		case !skip && !strings.Contains(logs.String(), "level=WARN msg=\"response not sent: it does not conform to the tool's schema\""):
			t.Errorf("no warning logged: %s", logs.String())
		}
		if !skip {
			calls := mt.Calls()
			if c := calls[1]; c.Ran || c.Response != nil {
				t.Errorf("the refused request's call: %+v, want not run", c)
			}
			// Made in a handling that fails once: the retry repeats the
			// request id. The invalid response is its stored answer; the
			// refused request is refused again.
			runs = 0
			var answers []string
			err := mt.Load(sdk.Module{Name: "buyer", Calls: []string{"shop.quote"}, Setup: func(m sdk.Mesh) error {
				return m.On("mesh.buy.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
					var qty int
					_ = json.Unmarshal(ev.Body, &qty)
					answers = append(answers, code(m.Call(ctx, "shop.quote", map[string]int{"qty": qty}, nil)))
					if ev.Attempt == 1 {
						return errors.New("once more")
					}
					return nil
				}))
			}}, meshtest.ModuleConfig{})
			if err != nil {
				t.Fatal(err)
			}
			for _, qty := range []int{11, 0} {
				mt.Emit(ctx, "outside", "mesh.buy.it", qty)
				mt.Settle()
			}
			if len(answers) != 4 || answers[0] != answers[1] || !strings.HasPrefix(answers[0], "invalid_response:") ||
				answers[2] != answers[3] || !strings.HasPrefix(answers[2], "invalid_request:") || runs != 1 {
				t.Errorf("repeated calls: %q, %d runs; want invalid_response twice from one run, invalid_request twice", answers, runs)
			}
		}
		mt.Close()
	}
}

// TestHistory: a History handler gets every event routed, in order with
// its offset, from where From says, in Settle; a failed batch comes again
// at the next Settle, whole, and nothing after it before; what the handler
// emits is routed (and so in the history too).
func TestHistory(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	ctx := context.Background()
	for i := range 3 {
		if _, err := mt.Emit(ctx, "test", "mesh.x.y", i); err != nil {
			t.Fatal(err)
		}
	}
	var got []sdk.Event
	fail := true
	err := mt.Load(sdk.Module{Name: "indexer", Emits: []string{"seen"}, History: &sdk.History{
		From: func(context.Context) (int64, error) { return 1, nil }, // it stored offset 0 before
		Handle: func(ctx context.Context, evs []sdk.Event) error {
			if fail {
				fail = false
				return errors.New("the store is away")
			}
			got = append(got, evs...)
			return nil
		},
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if len(got) != 0 {
		t.Fatalf("a failed batch was taken as handled: %+v", got)
	}
	mt.Settle()
	if len(got) != 2 || got[0].Offset != 1 || got[1].Offset != 2 || string(got[0].Body) != "1" || got[1].Type != "mesh.x.y" {
		t.Fatalf("got %+v, want the events at offsets 1 and 2", got)
	}
	if _, err := mt.Emit(ctx, "test", "mesh.x.z", 3); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if len(got) != 3 || got[2].Offset != 3 || got[2].Type != "mesh.x.z" {
		t.Fatalf("got %+v after another emit", got)
	}
	if err := mt.Load(sdk.Module{Name: "half", History: &sdk.History{Handle: func(context.Context, []sdk.Event) error { return nil }}},
		meshtest.ModuleConfig{}); !errors.Is(err, sdk.ErrInvalid) {
		t.Fatalf("a History without From: %v, want ErrInvalid", err)
	}
}

// TestRedeliverWithIsAConflict: a copy of a handled event id with another
// body is dead-lettered with reason conflict, not handled and not dropped;
// the same copy again is a duplicate; a handler that allows duplicates
// runs every copy.
func TestRedeliverWithIsAConflict(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	var bodies, every []string
	err := mt.Load(sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		if err := m.On("mesh.orders.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			bodies = append(bodies, string(ev.Body))
			return nil
		})); err != nil {
			return err
		}
		return m.On("mesh.audit.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			every = append(every, string(ev.Body))
			return nil
		}), sdk.AllowDuplicates())
	}}, meshtest.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, err := mt.Emit(ctx, "shop", "mesh.orders.placed", map[string]int{"amount": 10})
	if err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if err := mt.Redeliver(id); err != nil {
		t.Fatal(err)
	}
	if err := mt.RedeliverWith(id, map[string]int{"amount": 99}); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if want := []string{`{"amount":10}`}; !slices.Equal(bodies, want) {
		t.Errorf("handled %q, want %q", bodies, want)
	}
	dl := mt.DeadLetters()
	if len(dl) != 1 || dl[0].Reason != "conflict" || dl[0].Module != "ledger" || string(dl[0].Event.Body) != `{"amount":99}` ||
		!strings.Contains(dl[0].Err, "this copy's digest is") {
		t.Fatalf("dead letters %+v, want the copy with amount 99 as a conflict", dl)
	}
	aid, err := mt.Emit(ctx, "shop", "mesh.audit.x", 1)
	if err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if err := mt.RedeliverWith(aid, 2); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if want := []string{"1", "2"}; !slices.Equal(every, want) {
		t.Errorf("allowing duplicates, handled %q, want %q", every, want)
	}
	if err := mt.RedeliverWith("01J0000000000000000000000A", 1); err == nil {
		t.Error("RedeliverWith of an id never emitted: no error")
	}
}

// TestGrantsRefuseAsANode: with Grants, what a module's entry does not
// grant is refused at Load with ErrForbidden naming the key to add, and a
// DeadLetters handler gets only the dead letters of its patterns.
func TestGrantsRefuseAsANode(t *testing.T) {
	noop := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	for _, c := range []struct {
		name string
		def  sdk.Module
		want string
	}{
		{"consume", sdk.Module{Name: "taker", Setup: func(m sdk.Mesh) error { return m.Consume("shop.orders", 1, noop) }},
			`add "shop.orders" to its consumes:`},
		{"dead letters", sdk.Module{Name: "undertaker", DeadLetters: noop}, "to its dead_letters:"},
		{"history", sdk.Module{Name: "reader", History: &sdk.History{
			From:   func(context.Context) (int64, error) { return 0, nil },
			Handle: func(context.Context, []sdk.Event) error { return nil }}}, "set history: true"},
		{"serve", sdk.Module{Name: "server", Setup: func(m sdk.Mesh) error {
			return m.Serve("tax.rate", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return nil, nil }))
		}}, `add "tax.rate" to its tools:`},
	} {
		t.Run(c.name, func(t *testing.T) {
			mt := meshtest.New(meshtest.Config{})
			defer mt.Close()
			err := mt.Load(c.def, meshtest.ModuleConfig{Grants: &meshtest.Grants{}})
			if !errors.Is(err, sdk.ErrForbidden) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("load: %v, want ErrForbidden saying %q", err, c.want)
			}
			if err := mt.Load(c.def, meshtest.ModuleConfig{}); err != nil {
				t.Errorf("without Grants: %v", err)
			}
		})
	}

	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	var got []string
	undertaker := sdk.Module{Name: "undertaker", DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		got = append(got, ev.Type)
		return nil
	})}
	failing := sdk.Module{Name: "failing", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return sdk.Permanent(errors.New("no")) }))
	}}
	if err := mt.Load(undertaker, meshtest.ModuleConfig{Grants: &meshtest.Grants{DeadLetters: []string{"mesh.billing.#"}}}); err != nil {
		t.Fatal(err)
	}
	if err := mt.Load(failing, meshtest.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"mesh.billing.paid", "mesh.shop.sold"} {
		if _, err := mt.Emit(context.Background(), "test", typ, map[string]int{}); err != nil {
			t.Fatal(err)
		}
	}
	mt.Settle()
	if len(mt.DeadLetters()) != 2 || !slices.Equal(got, []string{"mesh.billing.paid"}) {
		t.Errorf("dead letters %d, the undertaker got %v; want 2, and only mesh.billing.paid", len(mt.DeadLetters()), got)
	}
}

// TestExplain: Explain says what became of an event: routed nowhere
// (naming the patterns there are), filtered, retried then dead-lettered
// with the reason, a handler's refused call, and what it caused.
func TestExplain(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	receipts := sdk.Module{Name: "receipts", Emits: []string{"receipt.sent"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.order.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var o struct{ Cents int }
			if err := ev.Decode(&o); err != nil {
				return err
			}
			if o.Cents < 0 {
				return m.Call(ctx, "tax.rate", nil, nil)
			}
			if o.Cents == 0 {
				return errors.New("nothing to bill")
			}
			_, err := m.Emit(ctx, "receipt.sent", o)
			return err
		}), sdk.Filter(`body.cents != 1`))
	}}
	if err := mt.Load(receipts, meshtest.ModuleConfig{MaxAttempts: 2, Grants: &meshtest.Grants{}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	emit := func(typ string, cents int) string {
		id, err := mt.Emit(ctx, "shop", typ, map[string]int{"cents": cents})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	nowhere, filtered, failing, forbidden, fine := emit("module.shop.cart.placed", 5), emit("module.shop.order.placed", 1),
		emit("module.shop.order.placed", 0), emit("module.shop.order.placed", -1), emit("module.shop.order.placed", 7)
	mt.Settle()
	for id, want := range map[string][]string{
		nowhere:   {"emitted as module.shop.cart.placed by shop", "routed to no module: no pattern matches module.shop.cart.placed (receipts on module.shop.order.#)"},
		filtered:  {"routed to receipts", "module receipts: its handler's filter rejected it"},
		failing:   {"module receipts: attempt 1 failed: nothing to bill; retried after", "module receipts dead-lettered it after 2 attempt(s), reason delivery_limit: nothing to bill"},
		forbidden: {"while handling it, module receipts's call of tax.rate failed: call tax.rate: forbidden", "dead-lettered it after 1 attempt(s), reason forbidden"},
		fine:      {"module receipts handled it (attempt 1)", "caused module.receipts.receipt.sent "},
	} {
		got := mt.Explain(id)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("Explain(%s) lacks %q:\n%s", id, w, got)
			}
		}
	}
	if got := mt.Explain("nosuchid"); !strings.Contains(got, `knows no event "nosuchid"`) {
		t.Errorf("Explain of an unknown id: %s", got)
	}
}
