package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

type Site struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// A module declares its name and what it emits, subscribes its handlers in
// Setup and does its own work in Run. Here it runs on the in-memory
// meshtest mesh; meshd or an embedding program runs it the same way.
func ExampleModule() {
	umami := sdk.Module{
		Name:  "umami",
		Emits: []string{"site.created"},
		Setup: func(m sdk.Mesh) error {
			return m.On("node.*.joined", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				fmt.Println("node joined:", ev.Type, "from", ev.Source)
				return nil
			}))
		},
	}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	if err := mt.Load(umami, meshtest.ModuleConfig{}); err != nil {
		fmt.Println(err)
	}
	_, _ = mt.Emit(context.Background(), "anchor", "node.anchor.joined", map[string]string{})
	mt.Settle()
	// Output: node joined: node.anchor.joined from anchor
}

// Emit publishes module.<module>.<name> and returns the event's id; inside
// a handler the handled event becomes the new event's cause.
func ExampleMesh_Emit() {
	relay := sdk.Module{Name: "umami", Emits: []string{"site.created"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.signup.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "site.created", Site{ID: 42, Name: "example.org"}, sdk.WithSchema("1"))
			return err
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(relay, meshtest.ModuleConfig{})
	cause, _ := mt.Emit(context.Background(), "web", "mesh.signup.done", map[string]string{"site": "example.org"})
	mt.Settle()
	ev := mt.Emitted()[1]
	fmt.Println(ev.Type, ev.Source, ev.Schema, string(ev.Body), ev.CausationID == cause)
	// Output: module.umami.site.created umami 1 {"id":42,"name":"example.org"} true
}

// EmitAsync lets one goroutine keep many events in flight, as an importer
// or a bridge does: it returns once the emit is under way, and done gets
// each event's id when it is confirmed (or why it was not).
func ExampleMesh_EmitAsync() {
	finished := make(chan struct{})
	importer := sdk.Module{Name: "importer", Emits: []string{"row.imported"}, Run: func(ctx context.Context, m sdk.Mesh) error {
		defer close(finished)
		var wg sync.WaitGroup
		var mu sync.Mutex
		confirmed := 0
		for row := range 1000 {
			wg.Add(1)
			err := m.EmitAsync(ctx, "row.imported", map[string]int{"row": row}, func(id string, err error) {
				defer wg.Done()
				if err == nil {
					mu.Lock()
					confirmed++
					mu.Unlock()
				}
			})
			if err != nil {
				wg.Done()
				return err // ctx ended while 256 emits were in flight
			}
		}
		wg.Wait()
		fmt.Println("confirmed:", confirmed)
		return nil
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(importer, meshtest.ModuleConfig{})
	<-finished
	mt.Settle()
	fmt.Println("emitted:", len(mt.Emitted()))
	// Output:
	// confirmed: 1000
	// emitted: 1000
}

// A handler returns nil to acknowledge, an error to be retried with
// back-off (Event.Attempt counts), or a Permanent error to dead-letter the
// event at once.
func ExampleMesh_On() {
	mod := sdk.Module{Name: "notifier", Setup: func(m sdk.Mesh) error {
		return m.On("module.umami.site.created", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var s Site
			if err := ev.Decode(&s); err != nil {
				return sdk.Permanent(err) // a body we cannot read will not get better
			}
			if ev.Attempt < 3 {
				return errors.New("mail server busy") // tried again later
			}
			fmt.Println("notified", s.Name, "on attempt", ev.Attempt)
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "umami", "module.umami.site.created", Site{ID: 1, Name: "example.org"})
	_, _ = mt.Emit(context.Background(), "umami", "module.umami.site.created", []byte(`"not a site"`))
	mt.Settle()
	for _, d := range mt.DeadLetters() {
		fmt.Println("dead letter:", d.Reason, "after", d.Attempts, "attempt")
	}
	// Output:
	// notified example.org on attempt 3
	// dead letter: permanent after 1 attempt
}

// A module serves a tool in Setup; its handler answers with a value or a
// ToolError the caller can branch on.
func ExampleMesh_Serve() {
	billing := sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
		return m.Serve("invoice.create", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			var order struct{ Total int }
			if err := req.Decode(&order); err != nil || order.Total <= 0 {
				return nil, &sdk.ToolError{Code: "bad_order", Message: "no total", Permanent: true}
			}
			return map[string]int{"invoice": 1, "total": order.Total}, nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(billing, meshtest.ModuleConfig{})
	var inv struct{ Invoice, Total int }
	err := mt.Call(context.Background(), "shop", "invoice.create", map[string]int{"total": 99}, &inv)
	fmt.Println(inv.Invoice, inv.Total, err)
	err = mt.Call(context.Background(), "shop", "invoice.create", map[string]int{}, nil)
	fmt.Println(err)
	// Output:
	// 1 99 <nil>
	// call invoice.create: tool error bad_order (permanent): no total
}

// Call returns at once with ErrNoServer when nobody serves the tool. Inside
// a handler its request id is derived from the handled event: a retry's
// repeated call is answered from the server's stored answer, and the tool
// runs once.
func ExampleMesh_Call() {
	runs := 0
	billing := sdk.Module{Name: "billing", Setup: func(m sdk.Mesh) error {
		return m.Serve("invoice.create", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
			runs++
			return map[string]int{"invoice": runs}, nil
		}))
	}}
	shop := sdk.Module{Name: "shop", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.order.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var inv struct{ Invoice int }
			if err := m.Call(ctx, "invoice.create", map[string]int{"total": 99}, &inv); err != nil {
				return err
			}
			fmt.Println("attempt", ev.Attempt, "got invoice", inv.Invoice)
			if ev.Attempt == 1 {
				return errors.New("the mail server is down") // retried: the call is made again
			}
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	err := mt.Call(context.Background(), "web", "invoice.create", map[string]int{"total": 99}, nil)
	fmt.Println("without a server:", errors.Is(err, sdk.ErrNoServer))
	_ = mt.Load(billing, meshtest.ModuleConfig{})
	_ = mt.Load(shop, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "web", "mesh.order.placed", map[string]int{"order": 8})
	mt.Settle()
	fmt.Println("the tool ran", runs, "time")
	// Output:
	// without a server: true
	// attempt 1 got invoice 1
	// attempt 2 got invoice 1
	// the tool ran 1 time
}

// By default a module is handed each event id once: a redelivery after a
// fault is acknowledged without running the handler again. A handler that
// is idempotent by itself can take every copy.
func ExampleAllowDuplicates() {
	seen := map[string]int{}
	count := func(name string) sdk.Handler {
		return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { seen[name]++; return nil })
	}
	mod := sdk.Module{Name: "counter", Setup: func(m sdk.Mesh) error {
		return errors.Join(m.On("mesh.once.#", count("once")), m.On("mesh.every.#", count("every"), sdk.AllowDuplicates()))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	a, _ := mt.Emit(context.Background(), "test", "mesh.once.x", 1)
	b, _ := mt.Emit(context.Background(), "test", "mesh.every.x", 1)
	_ = mt.Redeliver(a)
	_ = mt.Redeliver(b)
	mt.Settle()
	fmt.Println(seen["once"], seen["every"])
	// Output: 1 2
}

// A module with a DeadLetters handler receives every event any module gave
// up on, saying which queue gave up, why and after how many attempts: an
// alerting module, or the audit logger, which records each.
func ExampleModule_deadLetters() {
	ledger := sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.invoice.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			return sdk.Permanent(errors.New("ledger closed"))
		}))
	}}
	alerts := sdk.Module{Name: "alerts", DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		fmt.Printf("%s died in %s: %s after %d attempt(s): %s\n", ev.Type, ev.DeadQueue, ev.DeadReason, ev.DeadAttempts, ev.DeadError)
		return nil
	})}
	mt := meshtest.New(meshtest.Config{Node: "anchor"})
	defer mt.Close()
	_ = mt.Load(ledger, meshtest.ModuleConfig{})
	_ = mt.Load(alerts, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "web", "mesh.invoice.due", map[string]int{"cents": 100})
	mt.Settle()
	// Output: mesh.invoice.due died in anchor.ledger.events: permanent after 1 attempt(s): permanent: ledger closed
}

// WithFreshID gives an event emitted in a handler its own id instead of
// one derived from the handled event: each attempt's emit is then a
// distinct event.
func ExampleWithFreshID() {
	mod := sdk.Module{Name: "probe", Emits: []string{"attempted", "derived"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.check.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, _ = m.Emit(ctx, "attempted", ev.Attempt%1, sdk.WithFreshID()) // same body each time
			_, _ = m.Emit(ctx, "derived", ev.Attempt%1)
			if ev.Attempt == 1 {
				return errors.New("try again")
			}
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "test", "mesh.check.now", 1)
	mt.Settle()
	ids := map[string]map[string]bool{}
	for _, ev := range mt.Emitted()[1:] {
		if ids[ev.Type] == nil {
			ids[ev.Type] = map[string]bool{}
		}
		ids[ev.Type][ev.ID] = true
	}
	fmt.Println("fresh:", len(ids["module.probe.attempted"]), "derived:", len(ids["module.probe.derived"]))
	// Output: fresh: 2 derived: 1
}

// Options refuse bad values with ErrInvalid, and Emit sends nothing.
func ExampleWithPriority() {
	mod := sdk.Module{Name: "jobs", Emits: []string{"job.queued"}, Setup: func(m sdk.Mesh) error {
		return m.On("mesh.job.requested", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "job.queued", 1, sdk.WithPriority(12), sdk.WithTTL(time.Minute))
			fmt.Println(errors.Is(err, sdk.ErrInvalid), err)
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "test", "mesh.job.requested", 1)
	mt.Settle()
	fmt.Println(len(mt.Emitted()), "emitted")
	// Output:
	// true emit option: invalid: priority 12 is over 9
	// 1 emitted
}

// A module emits under its own name; AsFullType emits elsewhere only
// where its node config grants it (emit_grants).
func ExampleAsFullType() {
	mod := sdk.Module{Name: "deployer", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.release.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "mesh.delivery.deployed", 1, sdk.AsFullType())
			fmt.Println("granted:", err)
			_, err = m.Emit(ctx, "node.anchor.drained", 1, sdk.AsFullType())
			fmt.Println("not granted:", errors.Is(err, sdk.ErrForbidden))
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{EmitGrants: []string{"mesh.delivery.#"}})
	_, _ = mt.Emit(context.Background(), "test", "mesh.release.cut", 1)
	mt.Settle()
	// Output:
	// granted: <nil>
	// not granted: true
}

// Setup subscribes and serves; Emit and Call are for once the module runs,
// and are refused in Setup with the reason.
func ExampleModule_setup() {
	mod := sdk.Module{Name: "early", Setup: func(m sdk.Mesh) error {
		_, err := m.Emit(context.Background(), "too.soon", 1)
		fmt.Println(errors.Is(err, sdk.ErrInvalid))
		fmt.Println(err)
		return nil
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	// Output:
	// true
	// emit too.soon: invalid: the module has not started yet (Emit and Call are for Run and handlers, not Setup)
}

func ExamplePermanent() {
	err := sdk.Permanent(errors.New("order 12 does not exist"))
	fmt.Println(errors.Is(err, sdk.ErrPermanent), err)
	// Output: true permanent: order 12 does not exist
}

func ExampleEvent_Decode() {
	ev := sdk.Event{Type: "module.umami.site.created", ID: "01J0000000000000000000000", Body: []byte(`{"id":42,"name":"example.org"}`)}
	var s Site
	if err := ev.Decode(&s); err != nil {
		fmt.Println(err)
	}
	fmt.Println(s.ID, s.Name)
	// Output: 42 example.org
}

func ExampleHandlerFunc() {
	h := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		fmt.Println("handling", ev.Type, "attempt", ev.Attempt)
		return nil
	})
	_ = h.HandleEvent(context.Background(), sdk.Event{Type: "node.anchor.joined", Attempt: 1})
	// Output: handling node.anchor.joined attempt 1
}

func ExampleToolError() {
	err := fmt.Errorf("call invoice.create: %w", &sdk.ToolError{Code: "not_found", Message: "no order 12", Permanent: true})
	var te *sdk.ToolError
	fmt.Println(errors.As(err, &te), te.Code, errors.Is(err, sdk.ErrPermanent))
	// Output: true not_found true
}

// A module logs through its Mesh's Logger: under meshd its lines reach the
// node's log at their level, tagged with the module.
func ExampleMesh_Logger() {
	mod := sdk.Module{Name: "notifier", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.mail.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			m.Logger().Warn("mail server slow", "attempt", ev.Attempt)
			return nil
		}))
	}}
	noTime := func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	mt := meshtest.New(meshtest.Config{Logger: slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: noTime}))})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "test", "mesh.mail.queued", 1)
	mt.Settle()
	// Output: level=WARN msg="mail server slow" module=notifier attempt=1
}

// WithTTL bounds how long an event may wait for its handler: past it, it
// is set aside in the dead letters as expired, not handled late.
func ExampleWithTTL() {
	mod := sdk.Module{Name: "pager", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.alert.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			fmt.Println("paged for", ev.Type)
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "monitor", "mesh.alert.disk", 1, sdk.WithTTL(time.Minute))
	_, _ = mt.Emit(context.Background(), "monitor", "mesh.alert.cpu", 1, sdk.WithTTL(time.Hour))
	mt.Advance(10 * time.Minute) // the pager was away
	mt.Settle()
	for _, d := range mt.DeadLetters() {
		fmt.Println(d.Event.Type, d.Reason)
	}
	// Output:
	// paged for mesh.alert.cpu
	// mesh.alert.disk expired
}

// Kind tells operators what a module is; the shipped dispatcher and agent
// say so, a plain module leaves it empty. Any other value is refused.
func ExampleModule_kind() {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	fmt.Println(mt.Load(sdk.Module{Name: "runner", Kind: "agent"}, meshtest.ModuleConfig{}))
	err := mt.Load(sdk.Module{Name: "robot", Kind: "robot"}, meshtest.ModuleConfig{})
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// <nil>
	// true
}

type Order struct {
	ID    string  `json:"id"`
	Total float64 `json:"total"`
}

// Filter hands a handler only the events it wants; the host acknowledges
// the others without running it. Here the first handler takes large
// orders from billing, and the second what the first does not take.
func ExampleFilter() {
	mod := sdk.Module{Name: "orders", Setup: func(m sdk.Mesh) error {
		show := func(who string) sdk.Handler {
			return sdk.Typed(func(ctx context.Context, ev sdk.Event, o Order) error {
				fmt.Println(who, o.ID)
				return nil
			})
		}
		return errors.Join(
			m.On("module.billing.order.#", show("large:"), sdk.Filter("source = 'billing' and body.total >= 1000")),
			m.On("module.billing.#", show("other:"), sdk.Filter("not body.total < 10")),
		)
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	for _, o := range []Order{{"a", 1500}, {"b", 20}, {"c", 5}} {
		_, _ = mt.Emit(context.Background(), "billing", "module.billing.order.placed", o)
	}
	mt.Settle()
	fmt.Println("filtered:", len(mt.Filtered()))
	// Output:
	// large: a
	// other: b
	// filtered: 1
}

// Typed decodes each event's body for the handler; a body that does not
// decode is dead-lettered at once, with the reason, and the handler never
// sees it.
func ExampleTyped() {
	mod := sdk.Module{Name: "shipping", Setup: func(m sdk.Mesh) error {
		return m.On("module.billing.order.#", sdk.Typed(func(ctx context.Context, ev sdk.Event, o Order) error {
			fmt.Printf("ship %s (%.2f)\n", o.ID, o.Total)
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "billing", "module.billing.order.placed", Order{ID: "a", Total: 12.5})
	_, _ = mt.Emit(context.Background(), "billing", "module.billing.order.placed", map[string]any{"id": 7})
	mt.Settle()
	d := mt.DeadLetters()[0]
	fmt.Println(d.Reason, d.Attempts)
	// Output:
	// ship a (12.50)
	// permanent 1
}

// TypedTool serves a tool of request and response types; TypedCall calls
// it and returns the response's type. A request that does not decode is
// answered with a permanent "invalid_request".
func ExampleTypedTool() {
	type quote struct {
		Net float64 `json:"net"`
	}
	type taxed struct {
		Gross float64 `json:"gross"`
	}
	tax := sdk.Module{Name: "tax", Setup: func(m sdk.Mesh) error {
		return m.Serve("tax.apply", sdk.TypedTool(func(ctx context.Context, req sdk.Request, q quote) (taxed, error) {
			return taxed{Gross: q.Net * 1.2}, nil
		}))
	}}
	shop := sdk.Module{Name: "shop", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.cart.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			t, err := sdk.TypedCall[taxed](ctx, m, "tax.apply", quote{Net: 100})
			fmt.Println(t.Gross, err)
			_, err = sdk.TypedCall[taxed](ctx, m, "tax.apply", "not a quote")
			var te *sdk.ToolError
			fmt.Println(errors.As(err, &te) && te.Code == "invalid_request", errors.Is(err, sdk.ErrPermanent))
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(tax, meshtest.ModuleConfig{})
	_ = mt.Load(shop, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "web", "mesh.cart.checked_out", map[string]int{"items": 2})
	mt.Settle()
	// Output:
	// 120 <nil>
	// true true
}

// Logger(ctx) in a handler is the module's logger tagged with the event
// (and its trace, when it is traced), on every host.
func ExampleLogger() {
	lines := &strings.Builder{}
	log := slog.New(slog.NewTextHandler(lines, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == "event_id" {
			return slog.Attr{} // vary from run to run
		}
		return a
	}}))
	mod := sdk.Module{Name: "audit", Setup: func(m sdk.Mesh) error {
		return m.On("module.billing.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			sdk.Logger(ctx).Info("checked")
			return nil
		}))
	}}
	mt := meshtest.New(meshtest.Config{Logger: log})
	defer mt.Close()
	_ = mt.Load(mod, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "billing", "module.billing.invoice.paid", map[string]int{"cents": 100})
	mt.Settle()
	fmt.Print(lines.String())
	// Output: level=INFO msg=checked module=audit event_type=module.billing.invoice.paid
}

// A module that reads the mesh's history keeps the offset after the last
// batch it stored, and says it in From when it is loaded again: it
// resumes there (the audit logger keeps it in its database, with the
// rows).
func ExampleHistory() {
	var next int64 = -1 // nothing stored yet: the start
	indexer := sdk.Module{Name: "indexer", History: &sdk.History{
		From: func(context.Context) (int64, error) { return next, nil },
		Handle: func(ctx context.Context, events []sdk.Event) error {
			for _, ev := range events {
				fmt.Println(ev.Offset, ev.Type)
			}
			next = events[len(events)-1].Offset + 1 // stored with the batch
			return nil
		},
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(indexer, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "shop", "mesh.order.placed", map[string]int{"order": 7})
	_, _ = mt.Emit(context.Background(), "shop", "mesh.order.paid", map[string]int{"order": 7})
	mt.Settle()
	fmt.Println("next", next)
	// Output:
	// 0 mesh.order.placed
	// 1 mesh.order.paid
	// next 2
}

// WithKey gives an event a key: a module group that keeps order by key
// (partitions: in meshd's config) handles one key's events one at a time,
// in order, and other keys' beside them. The handler finds the key in the
// event's headers.
func ExampleWithKey() {
	ledger := sdk.Module{Name: "ledger", Emits: []string{"entry.booked"}, Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("mesh.payment.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				var p struct{ Account string }
				if err := ev.Decode(&p); err != nil {
					return sdk.Permanent(err)
				}
				_, err := m.Emit(ctx, "entry.booked", ev.Body, sdk.WithKey(p.Account))
				return err
			})),
			m.On("module.ledger.entry.booked", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				fmt.Println("booked for", ev.Headers["x-partition-key"])
				return nil
			})),
		)
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	_ = mt.Load(ledger, meshtest.ModuleConfig{})
	_, _ = mt.Emit(context.Background(), "bank", "mesh.payment.received", map[string]any{"account": "account-7", "cents": 1250})
	mt.Settle()
	_, err := mt.Emit(context.Background(), "bank", "mesh.payment.received", 1, sdk.WithKey(strings.Repeat("k", 257)))
	fmt.Println(errors.Is(err, sdk.ErrInvalid))
	// Output:
	// booked for account-7
	// true
}
