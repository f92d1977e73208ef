// Package sdk is what a mesh module imports: emit events, handle events,
// call and serve tools, and declare what the module emits and consumes. It
// never shows an exchange, a queue, an AMQP type or a header key.
//
// The same Module runs three ways, by the same rules: in-process in a Go
// program that embeds the runtime (runtime.Node.Load), as its own process
// under meshd (package [github.com/meshkit/mesh/sdk/process]), and in unit
// tests on an in-memory mesh (package [github.com/meshkit/mesh/sdk/meshtest]).
//
// # Emitting
//
// A module emits under its own name: Emit(ctx, "site.created", body) from
// module "umami" publishes the event type module.umami.site.created. Emit
// returns the event's id once the broker has confirmed it (or the node
// has it on local disk to send once the broker is back).
//
//	id, err := mesh.Emit(ctx, "site.created", Site{ID: 42})
//
// An emit can wait: After(d) or At(t) has the broker hold the event,
// durably, and the node deliver it when it is due, to the queues bound then
// (never early; resolution one second; up to about 8.5 years). AtMostOnce
// trades the guarantee for cost: not persistent, not confirmed, not
// spooled.
//
//	mesh.Emit(ctx, "reminder.due", r, sdk.After(24*time.Hour))
//
// # Handling
//
// A module consumes with AMQP topic patterns ("module.umami.#",
// "node.*.joined", "#"). A handler returns nil to acknowledge the event, an
// error to have it retried with back-off, or an error wrapped by Permanent to
// have it dead-lettered at once. Typed decodes the body for it (a body that
// does not decode is dead-lettered at once, naming why); Handler and
// HandlerFunc take the raw event.
//
//	mesh.On("module.umami.site.*", sdk.Typed(func(ctx context.Context, ev sdk.Event, s Site) error {
//		return nil
//	}))
//
// Options beside the handler say how the host runs it: Filter hands it
// only the events an expression accepts (the host acknowledges the
// others), AllowDuplicates hands it every copy of an event.
//
//	mesh.On("module.billing.#", h, sdk.Filter("source = 'billing' and body.total >= 100"))
//
// # Tools
//
// A module serves a tool ("invoice.create") with Serve and calls one with
// Call. Servers of one tool compete: each call is answered once. A call to
// a tool nobody serves fails at once with ErrNoServer; a tool's error
// arrives as a *ToolError with a code, a message and whether it is
// permanent.
//
//	var inv Invoice
//	err := mesh.Call(ctx, "invoice.create", order, &inv)
//
// # What a module can rely on
//
// These rules hold on every host; the conformance suite (test/conformance)
// runs each of them against meshtest, the runtime in-process on RabbitMQ
// and a module process, and fails when one host differs.
//
// Lifecycle. Setup runs once, before the module consumes: it subscribes
// with On and serves with Serve, and may do nothing else on the mesh: Emit
// and Call are refused there with ErrInvalid. Once Setup returns, the
// module's patterns and tools are fixed: On and Serve are refused with
// ErrInvalid. A nil handler, a pattern or tool subscribed twice, a bad
// pattern, tool key or handler option is refused with ErrInvalid too,
// each naming the fix; a tool the node config does not grant (the
// module's tools in meshd's config) with ErrForbidden. Run, if
// set, starts once the module consumes; its ctx is cancelled when the
// module stops, after the handlers in flight have finished, and it should
// return then. A Run that fails while the module runs stops the module
// (in-process: the node is not ready until it is loaded again) or
// restarts its process (under meshd); see Module.Run.
//
// Concurrency and order. A module handles as many events at once as its
// concurrency (the node's module config, default 1). At 1, events are
// handled one at a time in queue order; a failed event goes back for its
// retry while the next ones are handled. Tool calls are served
// concurrently, up to the prefetch (default 32), whatever the concurrency.
// Handlers and tool handlers must be safe to run concurrently with each
// other and with Run.
//
// Filters. An event goes to the handler of the first of the module's
// patterns that matches it and whose filter, if any, accepts it. An event
// some patterns match and no filter accepts is acknowledged without a
// handler: it costs no attempt, is never dead-lettered, and is counted
// (mesh.events.filtered). Under meshd the node evaluates the filters of a
// module process, so such an event never reaches the process.
//
// Schemas. An emit of an event the module declares a schema for
// (Module.Schemas) is validated against the version it emits now before
// it is published: a body that breaks it fails with ErrInvalid naming the
// JSON pointer and the keyword, and is not sent; x-schema is that
// version's (WithSchema naming another is refused). The host validates,
// so a module process cannot send past it. An event of a version the
// handler of its pattern does not read (Module.Reads) is dead-lettered at
// once with the reason "schema", never handed to the handler.
//
// Outcomes. A handler returning nil acknowledges the event. A handler
// returning an error, panicking, or running past the handler timeout
// (default 30s; its ctx ends then with context.DeadlineExceeded) fails
// the attempt: the event is tried again after an exponential back-off
// (from 200ms to 30s by default), and after the attempt limit (default 5)
// it is dead-lettered with the reason "delivery_limit" and the last error.
// An error wrapped by Permanent dead-letters it at once with the reason
// "permanent"; so does a refused grant (an error that is ErrForbidden,
// returned by an Emit or Call the node config does not grant), with the
// reason "forbidden", as no retry could succeed. Event.Attempt counts the
// attempts from 1.
//
// Dead letters. A module that sets Module.DeadLetters receives the dead
// letters its node config grants it (dead_letters:, patterns of event
// types; under meshd, none unless granted), from any module's queue, with
// Event's Dead
// fields set; events that break the wire contract reach it too, read as
// far as they can be (DeadReason "malformed"). It is retried like any
// handler, but never dead-letters a dead letter again: past the attempt
// limit, or on a Permanent error, the dead letter is dropped and logged
// (the operator's queue mesh.dead-letters keeps its own copy).
//
// Queues of other systems. Consume takes an existing broker queue as it
// is (never declared); its messages reach the handler read as far as they
// can be, with Event.Queue set, and are settled like events (acked,
// retried, dead-lettered naming the queue), except that they are not
// de-duplicated (they need not carry an id) and one whose x-deadline
// passed is dead-lettered as "expired" unhandled. Hold stops and restarts
// consuming such a queue; Exclusive makes the module its only consumer.
//
// De-duplication. Delivery is at least once, but a module is handed each
// event id once: a redelivery or resend of an id it already handled is
// acknowledged without running the handler (for the node's retention
// window, 24h by default). A handler subscribed with the AllowDuplicates
// option gets every copy; a tool served with it runs again for a repeated
// request.
//
// Causation and repeatable side effects. The ctx a handler or tool
// handler gets carries what it handles: what is emitted or called with it
// records that id as its causation. An event emitted there gets an id
// derived from the handled event, the module, the type, the body and its
// occurrence (a valid ULID with the handled event's time), so a retried
// handler that emits the same thing again emits the same id, and the
// consumers' de-duplication absorbs it; a retry that emits another body
// emits another id. A call made there gets its request id the same way,
// and the server answers a repeated request id with the answer it stored
// (a response or a permanent error) without running the tool again.
// WithFreshID opts an emit out. Outside a handler, ids are fresh. In a
// module process the node derives these ids itself, from the handling it
// handed the process, while the handling lasts: a process cannot give an
// event another's id.
//
// Grants. Under meshd a module may call, consume and receive dead letters
// only as its entry in the node config grants (calls:, consumes:,
// dead_letters:), and who may call the tools it serves is the entry's
// callers: or, failing that, Module.Callers. The node checks them, not
// the module's process; a refusal is ErrForbidden naming the key to add
// (docs/security.md in the mesh repository).
//
// What a handler's ctx carries. Besides the handled event or request (the
// cause of what is emitted or called with it): its deadline (a handler's
// ctx ends at the handler timeout; a tool handler's at the caller's
// deadline); the trace the event or call is in, when it is traced (the
// host's span, as a remote parent in a module process); and a logger,
// sdk.Logger(ctx), the module's tagged with the event's id and type (a
// request's id, tool and caller) and the trace. Run's ctx carries the
// module's logger.
//
// Deadlines. A handler's ctx ends at the handler timeout; a tool
// handler's at the caller's deadline. A Call whose ctx has no deadline
// gets the node's call timeout (30s by default); the request expires on
// the broker when the caller gives up, and the call fails with an error
// satisfying errors.Is(err, context.DeadlineExceeded).
//
// # Delivery
//
// Event.ID stays the same across retries, redeliveries and replays, so a
// handler can also make its own side effects idempotent by it.
package sdk
