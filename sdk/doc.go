// Package sdk is what a mesh module imports: emit events, handle events,
// call and serve tools, and declare what the module emits and consumes. It never shows an
// exchange, a queue, an AMQP type or a header key.
//
// # Emitting
//
// A module emits under its own name: Emit(ctx, "site.created", body) from
// module "umami" publishes the event type module.umami.site.created. Emit
// returns the event's id once the broker has confirmed it.
//
//	id, err := mesh.Emit(ctx, "site.created", Site{ID: 42})
//
// # Handling
//
// A module consumes with AMQP topic patterns ("module.umami.#",
// "node.*.joined", "#"). A handler returns nil to acknowledge the event, an
// error to have it retried with back-off, or an error wrapped by Permanent to
// have it dead-lettered at once. A panic or a timeout counts as an error.
// Past the redelivery limit the event is dead-lettered, never looped
// forever.
//
//	mesh.On("module.umami.site.*", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
//		var s Site
//		if err := ev.Decode(&s); err != nil {
//			return sdk.Permanent(err)
//		}
//		return nil
//	}))
//
// # Tools
//
// A module serves a tool ("invoice.create") with Serve and calls one with
// Call. Servers of one tool compete: each call is answered once. A call to
// a tool nobody serves fails at once with ErrNoServer; a call that gets no
// answer before its deadline fails with ErrDeadlineExceeded; a tool's error
// arrives as a *ToolError with a code, a message and whether it is
// permanent.
//
//	var inv Invoice
//	err := mesh.Call(ctx, "invoice.create", order, &inv)
//
// # Causation
//
// Anything emitted or called with the context a handler received carries
// the handled event's (or request's) id as its causation id, with nothing
// for the author to do.
//
// # Running
//
// The same Module runs in-process, in a Go program that embeds the runtime,
// or as its own process under meshd, whose whole main is Run:
//
//	func main() {
//		if err := sdk.Run(notifier.Module()); err != nil {
//			log.Fatal(err)
//		}
//	}
//
// A module logs through Mesh.Logger; under meshd its lines reach the
// node's log at their level, tagged with the module.
//
// # Delivery
//
// Delivery is at least once: a handler can see an event again after a crash
// between its work and the acknowledgement. Event.ID stays the same across
// retries, redeliveries and replays, so handlers can be made idempotent by it.
package sdk
