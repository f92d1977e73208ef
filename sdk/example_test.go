package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshkit/mesh/sdk"
)

type Site struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// A module declares its name and what it emits, subscribes its handlers in
// Setup and does its own work in Run. The node gives it its sdk.Mesh.
func ExampleModule() {
	_ = sdk.Module{
		Name:  "umami",
		Emits: []string{"site.created"},
		Setup: func(m sdk.Mesh) error {
			return m.On("node.*.joined", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				fmt.Println("node joined:", ev.Node)
				return nil
			}))
		},
		Run: func(ctx context.Context, m sdk.Mesh) error {
			_, err := m.Emit(ctx, "site.created", Site{ID: 1, Name: "example.org"})
			return err
		},
	}
}

// Emit publishes module.<module>.site.created and returns once the broker
// confirmed it.
func ExampleMesh_Emit() {
	run := func(ctx context.Context, m sdk.Mesh) error {
		id, err := m.Emit(ctx, "site.created", Site{ID: 42, Name: "example.org"},
			sdk.WithSchema("1"), sdk.WithTTL(time.Hour))
		if err != nil {
			return fmt.Errorf("announce site: %w", err)
		}
		fmt.Println("emitted", id)
		return nil
	}
	_ = run
}

// A handler that emits with the context it received records the handled
// event as the cause, with nothing more to do.
func ExampleMesh_On() {
	setup := func(m sdk.Mesh) error {
		return m.On("module.umami.site.created", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var s Site
			if err := ev.Decode(&s); err != nil {
				return sdk.Permanent(err) // a body we cannot read will not get better
			}
			_, err := m.Emit(ctx, "welcome.sent", map[string]string{"site": s.Name})
			return err // non-nil: retried with back-off, then dead-lettered
		}))
	}
	_ = setup
}

// Permanent marks an error that retrying cannot fix.
func ExamplePermanent() {
	errBadOrder := errors.New("order has no lines")
	err := sdk.Permanent(errBadOrder)
	fmt.Println(err)
	fmt.Println(errors.Is(err, sdk.ErrPermanent), errors.Is(err, errBadOrder))
	// Output:
	// permanent: order has no lines
	// true true
}

func ExampleEvent_Decode() {
	ev := sdk.Event{Type: "module.umami.site.created", Body: json.RawMessage(`{"id":7,"name":"example.org"}`)}
	var s Site
	if err := ev.Decode(&s); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.ID, s.Name)
	// Output: 7 example.org
}

func ExampleHandlerFunc() {
	var h sdk.Handler = sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		fmt.Println("handling", ev.Type, "attempt", ev.Attempt)
		return nil
	})
	_ = h.HandleEvent(context.Background(), sdk.Event{Type: "node.anchor.joined", Attempt: 1})
	// Output: handling node.anchor.joined attempt 1
}

// A module serves a tool in Setup; its handler answers with a value or a
// ToolError the caller can branch on.
func ExampleMesh_Serve() {
	setup := func(m sdk.Mesh) error {
		return m.Serve("invoice.create", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			var order struct{ Total int }
			if err := req.Decode(&order); err != nil {
				return nil, &sdk.ToolError{Code: "bad_order", Message: err.Error(), Permanent: true}
			}
			return map[string]int{"invoice": 1, "total": order.Total}, nil
		}))
	}
	_ = setup
}

// Call returns at once with ErrNoServer when nobody serves the tool, and a
// ToolError with the server's code otherwise.
func ExampleMesh_Call() {
	call := func(ctx context.Context, m sdk.Mesh) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var invoice struct{ Invoice, Total int }
		err := m.Call(ctx, "invoice.create", map[string]int{"total": 99}, &invoice)
		var te *sdk.ToolError
		switch {
		case errors.Is(err, sdk.ErrNoServer):
			return fmt.Errorf("billing is not running: %w", err)
		case errors.As(err, &te) && te.Permanent:
			return sdk.Permanent(err) // the order is bad: retrying will not help
		case err != nil:
			return err // transient: deadline, connection, a failing server
		}
		fmt.Println("invoice", invoice.Invoice)
		return nil
	}
	_ = call
}

func ExampleToolError() {
	err := fmt.Errorf("call invoice.create: %w", &sdk.ToolError{Code: "not_found", Message: "no order 12", Permanent: true})
	var te *sdk.ToolError
	fmt.Println(errors.As(err, &te), te.Code, errors.Is(err, sdk.ErrPermanent))
	// Output:
	// true not_found true
}
