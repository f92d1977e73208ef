package meshtest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// A unit test of a module: load it, emit what it consumes, Settle, and
// read what it emitted and what was dead-lettered. Retries take no time:
// Settle moves the mesh's clock to each one.
func ExampleMesh() {
	greeter := sdk.Module{Name: "greeter", Emits: []string{"greeted"}, Setup: func(m sdk.Mesh) error {
		return m.On("node.*.joined", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if ev.Attempt == 1 {
				return errors.New("the greeting service is warming up")
			}
			_, err := m.Emit(ctx, "greeted", map[string]string{"node": ev.Source})
			return err
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	if err := mt.Load(greeter, meshtest.ModuleConfig{}); err != nil {
		fmt.Println(err)
		return
	}
	start := mt.Now()
	joined, _ := mt.Emit(context.Background(), "anchor", "node.anchor.joined", map[string]string{})
	mt.Settle()
	for _, ev := range mt.Emitted() {
		fmt.Println(ev.Type, string(ev.Body), ev.CausationID == joined)
	}
	fmt.Println("dead letters:", len(mt.DeadLetters()), "clock moved:", mt.Now().Sub(start))
	// Output:
	// node.anchor.joined {} false
	// module.greeter.greeted {"node":"anchor"} true
	// dead letters: 0 clock moved: 200ms
}

// Stub stands in for a tool another module serves; StubAnswer gives a
// canned answer or error. Calls records what each call sent.
func ExampleMesh_Stub() {
	type quote struct {
		Cents int `json:"cents"`
	}
	shop := sdk.Module{Name: "shop", Emits: []string{"priced"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.cart.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			q, err := sdk.TypedCall[quote](ctx, m, "tax.quote", ev.Body)
			if err != nil {
				return sdk.Permanent(err)
			}
			_, err = m.Emit(ctx, "priced", q)
			return err
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(shop, meshtest.ModuleConfig{})
	_ = mt.Stub("tax.quote", sdk.TypedTool(func(_ context.Context, _ sdk.Request, in quote) (quote, error) {
		return quote{Cents: in.Cents * 120 / 100}, nil
	}))
	_, _ = mt.Emit(context.Background(), "web", "mesh.cart.done", quote{Cents: 1000})
	mt.Settle()
	fmt.Println(string(mt.Emitted()[1].Body), string(mt.Calls()[0].Request))

	_ = mt.StubAnswer("tax.quote", nil, &sdk.ToolError{Code: "no_region", Message: "unknown region", Permanent: true})
	_, _ = mt.Emit(context.Background(), "web", "mesh.cart.done", quote{Cents: 5})
	mt.Settle()
	fmt.Println(mt.DeadLetters()[0].Err)
	// Output:
	// {"cents":1200} {"cents":1000}
	// permanent: call tax.quote: tool error no_region (permanent): unknown region
}

// A delayed emit is one option: sdk.After (or sdk.At). In a test it waits
// on the mesh's clock, so Advance decides when it comes due.
func ExampleMesh_Delayed() {
	reminders := sdk.Module{Name: "reminders", Emits: []string{"due"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.order.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "due", ev.Body, sdk.After(24*time.Hour))
			return err
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	if err := mt.Load(reminders, meshtest.ModuleConfig{}); err != nil {
		fmt.Println(err)
		return
	}
	mt.Emit(context.Background(), "shop", "module.shop.order.placed", map[string]int{"order": 7})
	mt.Settle()
	for _, ev := range mt.Delayed() {
		fmt.Println("waiting:", ev.Type, "due", ev.Headers["x-due"])
	}
	mt.Advance(24 * time.Hour)
	mt.Settle()
	fmt.Println("waiting after a day:", len(mt.Delayed()))
	// Output:
	// waiting: module.reminders.due due 2026-01-02T00:00:00Z
	// waiting after a day: 0
}

// Grants hold a module to the grants of its entry in meshd's config: a
// call they do not name fails as on a node, and the handling that made it
// is dead-lettered at once as "forbidden" (no retry could succeed), with
// the words that name the key to add.
func ExampleGrants() {
	billing := sdk.Module{Name: "billing", Calls: []string{"tax.rate"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.order.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			return m.Call(ctx, "tax.rate", map[string]string{"country": "FR"}, nil)
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	// As in mesh.yaml: - name: billing, with no calls: entry.
	if err := mt.Load(billing, meshtest.ModuleConfig{Grants: &meshtest.Grants{}}); err != nil {
		fmt.Println(err)
		return
	}
	_, _ = mt.Emit(context.Background(), "shop", "mesh.order.placed", map[string]int{"cents": 100})
	mt.Settle()
	for _, d := range mt.DeadLetters() {
		fmt.Println(d.Reason, d.Attempts)
		fmt.Println(d.Err)
	}
	// Output:
	// forbidden 1
	// call tax.rate: forbidden: module billing's entry in mesh.yaml does not grant it (it has no calls:): add "tax.rate" to its calls:
}
