package sdk

import (
	"context"
	"log/slog"

	"github.com/meshkit/mesh/internal/handlerlog"
)

// Mesh is a module's view of the event mesh. It is safe for concurrent use.
// The package doc, "What a module can rely on", says when each method may
// be called and what every host guarantees.
type Mesh interface {
	// Emit publishes an event of type module.<this module>.<name> with body
	// marshalled to JSON (a json.RawMessage or []byte is taken as JSON
	// as is, and must be valid). It returns the event's id once the broker
	// confirmed the event. If ctx carries a handled event or request (the
	// ctx a handler received), its id becomes the causation id and the
	// event's id is derived from it (see WithFreshID).
	//
	// Errors: ErrInvalid for a bad name, a body that is not JSON or too
	// large, a bad option, or an emit during Setup; ErrForbidden for a
	// full type the module may not emit; ErrTransient when the broker
	// refused the event, the connection dropped while it was in flight (it
	// may or may not have reached the broker) or the node's spool is full;
	// ErrClosed; or ctx's error.
	Emit(ctx context.Context, name string, body any, opts ...EmitOption) (id string, err error)

	// EmitAsync is Emit for a producer that streams (a bridge, an
	// importer): it returns as soon as the emit is under way, and done
	// gets what Emit would have returned, the event's id once the broker
	// confirmed it (or the node spooled it), or why not, exactly once,
	// from another goroutine. So one goroutine keeps many events in
	// flight. At most 256 of a module's asynchronous emits are unfinished
	// at once: EmitAsync waits for one to finish, and returns ctx's error
	// if ctx ends first (done is then not called). Once under way, an
	// emit is not cancelled by ctx; ctx's values (the handled event, for
	// the causation id) are kept. Events emitted asynchronously may reach
	// the broker in another order than they were emitted.
	//
	// Errors from EmitAsync: ctx's, or ErrInvalid for a nil done. Every
	// other error goes to done, as Emit returns it.
	EmitAsync(ctx context.Context, name string, body any, done func(id string, err error), opts ...EmitOption) error

	// On subscribes h to the events matching an AMQP topic pattern
	// ("module.umami.#", "node.*.joined", "#"), with options
	// (AllowDuplicates, Filter). Call it while the module is set up
	// (Module.Setup): once the module consumes, its patterns are fixed. A
	// pattern already subscribed is refused. Patterns the module no longer
	// subscribes to on its next start are unbound from its queue.
	//
	// An event matching several of the module's patterns is delivered once,
	// to the handler of the first pattern subscribed that matches it and
	// whose filter, if any, accepts it.
	//
	// Errors, each ErrInvalid naming the fix: a bad pattern, one that
	// could never match an event type (its first word not an origin,
	// module, mesh or node, nor a wildcard: "orders.placed"; or fewer than
	// three words and no '#': "module.umami"), a nil handler, a bad option
	// or a pattern already subscribed; On after Setup.
	On(pattern string, h Handler, opts ...HandlerOption) error

	// Call invokes a tool ("invoice.create") with req marshalled to JSON
	// and, on success, unmarshals the tool's response into resp (unless
	// resp is nil). The call's deadline is ctx's, or the node's default
	// call timeout; the request expires on the broker when the caller gives
	// up. If ctx carries a handled event or request, its id becomes the
	// request's causation id.
	//
	// Inside a handler, the request's id is derived from the handled
	// event, so the same call made again by a retry is answered by the
	// server from its stored answer, without running the tool twice.
	//
	// Errors: ErrNoServer at once when nobody serves the tool; an error
	// satisfying errors.Is(err, context.DeadlineExceeded) when no answer
	// came in time; a *ToolError with the tool's code and message
	// (errors.Is(err, ErrPermanent) tells a permanent one);
	// ErrTransient when the broker connection dropped during the call;
	// ErrInvalid for a bad tool key or request body, or during Setup.
	// TypedCall is Call with the response's type.
	Call(ctx context.Context, tool string, req, resp any) error

	// Logger is the module's structured logger. Under meshd its lines
	// reach the node's log tagged with the module and at their level. In
	// a handler, sdk.Logger(ctx) is this logger tagged with the event.
	Logger() *slog.Logger

	// Consume hands h the messages of an existing broker queue that
	// another system fills (not an event queue of the mesh). The node
	// consumes it passively: it never declares, binds or deletes it, and a
	// queue that is not there fails the module's start, naming it. At most
	// prefetch messages (1 to 1000) are unacknowledged, and as many
	// handler calls run at once. A message reaches h as an Event read as
	// far as it can be: ID is its message id (or x-event-id), Type its
	// routing key, Queue the queue, Headers every header as text, Body the
	// bytes as they came (not necessarily JSON). A CloudEvent (binary
	// mode: cloudEvents_, cloudEvents: or ce- headers, one binding per
	// message; or structured mode, application/cloudevents+json) is read
	// as one: ID, Source, Type, Time and Schema are its id, source, type,
	// time and dataschema, Body its data; one that breaks the
	// specification is dead-lettered as malformed. Outcomes are an event
	// handler's: nil acknowledges; an error is retried with back-off up
	// to the attempt limit, then, like a Permanent error at once,
	// dead-lettered to mesh.events.dead with the queue's name. A message
	// whose x-deadline header (RFC 3339) has passed is dead-lettered as
	// "expired" without reaching h. A Filter option hands h only the
	// messages it accepts (the others are acknowledged); AllowDuplicates is
	// refused, since such messages are never de-duplicated. Call it during
	// Module.Setup, like On.
	//
	// Errors: ErrInvalid for a bad queue name, prefetch or option, a nil
	// handler, a queue already consumed, or after Setup.
	Consume(queue string, prefetch int, h Handler, opts ...HandlerOption) error

	// Hold stops consuming a queue the module consumes (Consume) while
	// held is true, and consumes it again when it is false. What the queue
	// holds stays there meanwhile; handlers of messages already taken
	// finish. Called during Setup (after Consume), the module starts with
	// the queue held. Hold returns once the node stopped or started
	// consuming.
	//
	// Errors: ErrInvalid for a queue the module does not consume.
	Hold(queue string, held bool) error

	// Exclusive makes the module the only consumer of a queue it consumes
	// (Consume), for one global order of its messages across nodes: the
	// node consumes it exclusively, and while another consumer has it, the
	// node stands by and takes it over, within a second or so, once that
	// one is gone. Call it during Setup, after Consume.
	//
	// Errors: ErrInvalid for a queue the module does not consume, or after
	// Setup.
	Exclusive(queue string) error

	// Serve answers calls of a tool with h. Several servers of one tool,
	// on this node or others, compete: each call is answered by one. A
	// request repeated with the same id (a retried handler's call) is
	// answered from the stored answer without running h again, unless
	// the AllowDuplicates option says h is idempotent by itself; Filter
	// is refused. Call it during Module.Setup, like On.
	//
	// Errors: ErrInvalid for a bad key or option, a nil handler, a tool
	// already served, or after Setup; ErrForbidden for a tool the node
	// config does not grant (the module's tools in meshd's config).
	Serve(tool string, h ToolHandler, opts ...HandlerOption) error
}

// ToolHandler answers tool calls.
//
// HandleCall returns the response, which is marshalled to JSON, or an
// error: a *ToolError is sent to the caller as it is; an error marked with
// Permanent becomes a permanent ToolError with code "rejected"; any other
// error a transient one with code "failed". A panic becomes a permanent
// ToolError with code "internal"; the server keeps serving.
//
// ctx ends at the caller's deadline and carries the request as the cause
// of anything emitted or called with it.
type ToolHandler interface {
	HandleCall(ctx context.Context, req Request) (any, error)
}

// ToolHandlerFunc adapts a function to a ToolHandler.
type ToolHandlerFunc func(ctx context.Context, req Request) (any, error)

// HandleCall calls f.
func (f ToolHandlerFunc) HandleCall(ctx context.Context, req Request) (any, error) {
	return f(ctx, req)
}

// Handler handles events.
//
// HandleEvent returns nil to acknowledge the event. Any other error has the
// event retried with back-off, up to the node's attempt limit, after which
// it is dead-lettered with the last error. An error wrapped by Permanent is
// dead-lettered at once. A panic counts as an error; so does running past
// the node's handler timeout, when ctx ends.
//
// A module's handlers run one at a time, in queue order, unless its
// concurrency is set higher; then they run concurrently. The ctx carries
// the event as the cause of anything emitted or called with it.
type Handler interface {
	HandleEvent(ctx context.Context, ev Event) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, ev Event) error

// HandleEvent calls f.
func (f HandlerFunc) HandleEvent(ctx context.Context, ev Event) error { return f(ctx, ev) }

// Module is what a module author writes: its name, what it emits, how it
// subscribes and, optionally, work it runs for as long as it is loaded.
type Module struct {
	// Name is the module's name, one word (no dots): it becomes part of
	// the types it emits (module.<Name>.<event>) and of its queue.
	Name string
	// Kind is what the module is, for operators and the mesh's graph:
	// "dispatcher" (it fires work on triggers: modules/dispatcher),
	// "agent" (it serves tools that act on the world: modules/agent), or
	// "" for a plain module. Any other value is refused at load.
	Kind string
	// Emits lists the event names (relative, "site.created") the module
	// emits; a full type there ("module.umami.site.created") is refused
	// at load, with the name to write. It may emit no other in its
	// namespace: an emit of a name not listed (relative, or as
	// module.<Name>.<event> with AsFullType) fails with ErrForbidden,
	// unless its config allows undeclared emits (allow_undeclared_emits).
	// The mesh's event graph is drawn from it.
	Emits []string
	// Schemas declares the JSON Schemas of the bodies the module emits,
	// for events of Emits, and of the requests and responses of the
	// tools it serves: one or more versions per event or tool, oldest
	// first. The last listed is the version it emits (or serves) now: the
	// host validates each body of that event against it before publishing
	// (an emit that breaks it fails with ErrInvalid naming the JSON
	// pointer and the keyword) and sets x-schema to its Version. For a
	// tool, the serving host validates each request before the handler
	// runs (one that breaks it is answered with a permanent ToolError
	// with Code "invalid_request", naming the pointer and the keyword,
	// and the handler does not run) and each response the handler
	// returns (one that breaks it is not sent: the caller gets a
	// permanent ToolError with Code "invalid_response", and the host logs
	// a warning). A module's config's skip_body_validation turns all of
	// it off. The earlier versions say what it emitted or served before,
	// for meshctl schema check. The mesh knows every declared version
	// (heartbeats carry their digests). Package sdk/schema makes one from
	// a Go type or a file. A schema refers only to itself: a $ref to a
	// file or a URL is refused at load, as is a schema for an event not
	// in Emits or a tool the module does not Serve.
	Schemas []Schema
	// Reads declares, for a pattern the module subscribes to with On, the
	// versions (x-schema) its handler reads: an event of another version
	// is never handed to it, it is dead-lettered with reason "schema". ""
	// stands for an event without x-schema, "*" for any version. A pattern
	// with no entry reads any version; an entry for a pattern the module
	// does not subscribe is refused at load.
	Reads map[string][]string
	// Calls lists the tool keys the module calls, for the graph. What it
	// may call is its node config's to grant (calls:).
	Calls []string
	// Callers says who may call the tools the module serves unless its
	// node config says otherwise (callers: in its entry replaces it): for
	// a tool key pattern ("audit.*"), the callers allowed, each "MODULE"
	// on any node, "NODE/MODULE" (* for any) or "user:USER" (the broker
	// user of the caller's node); "meshctl" is the operator. A tool no
	// entry matches may be called by anyone. The serving node checks it;
	// a refused caller gets a permanent ToolError with Code "forbidden".
	Callers map[string][]string
	// Setup subscribes the module's handlers with m.On. It runs before the
	// module consumes. It may be nil for a module that only emits.
	Setup func(m Mesh) error
	// DeadLetters, if not nil, receives the dead letters its node config
	// grants it (dead_letters:, patterns of event types; in-process
	// without a grant, every one): each event any module's queue gave up
	// on (from mesh.events.dead),
	// with the Dead fields of Event saying where, why and after how many
	// attempts, including events that break the wire contract (a
	// CloudEvent a Consume handler gave up on is read as Consume read it).
	// They come
	// on the module's own queue <node>.<module>.dead. A failing handler is
	// retried like an event handler, but a dead letter is never
	// dead-lettered again: past the attempt limit, or on a Permanent
	// error, it is dropped with an error in the log (mesh.dead-letters
	// still keeps it for the operator). The same dead letter may come
	// twice (a redelivery); the node does not de-duplicate dead letters.
	DeadLetters Handler
	// History, if not nil, reads the mesh's history: every event routed
	// on the mesh, kept replicated on the broker (a stream, when the node
	// config names one under history:, and only for a module whose entry
	// grants history: true; otherwise the load fails). Its events come in
	// the order the broker appended them, a batch at a time, each with
	// its Offset; the audit logger indexes the history this way, so any
	// number of loggers on any nodes hold the same record.
	History *History
	// Run, if not nil, runs once the module consumes, until ctx is
	// cancelled when the module is stopped: after the handlers in flight
	// have finished (or the node's grace ran out), so a handler may use
	// what Run keeps open. A module that emits on its own (on a timer,
	// from a socket) does it here. Run returning nil ends Run alone; the
	// module goes on handling. Run returning an error before the module
	// is stopped is a failure of the module: in-process it stops, and the
	// node's readiness (/readyz) names it until it is loaded again; a
	// module process exits, and meshd starts it again with back-off, as
	// after a crash. Either way the log says what Run returned.
	Run func(ctx context.Context, m Mesh) error
}

// History is how a module reads the mesh's history (Module.History). The
// host calls From when the module is loaded (a module process: each time
// it starts), and Handle with each batch in order, never two at once.
// Handle returning nil means the batch is done with, for good (the module
// stored it, and the offset after its last event if it is to resume
// there); an error, or a panic, hands the same batch again after a
// back-off, and nothing later is read until it succeeds. After the node
// reconnects, a batch it had not seen through may come again, with the
// same offsets: keep what is stored by id or offset. A malformed message
// comes in its place with DeadReason "malformed", as a dead letter of one
// would.
type History struct {
	// From returns the offset of the first event to read: the offset
	// after the last one the module stored, or a negative number for the
	// start of the history (as much as the broker still keeps).
	From func(ctx context.Context) (int64, error)
	// Handle receives a batch of events in offset order.
	Handle func(ctx context.Context, events []Event) error
}

// Schema is one version of the JSON Schema of an emitted event's body,
// or of the request and response of a tool the module serves
// (Module.Schemas). It sets Event or Tool, never both.
type Schema struct {
	// Event is the event's name, as in Module.Emits ("site.created"),
	// for an event's body schema; "" for a tool's.
	Event string
	// Tool is the key of a tool the module serves ("invoice.create"),
	// for the schemas of its request (JSON) and response (Response);
	// "" for an event's.
	Tool string
	// Version is the version: for an event, its x-schema ("1",
	// "2024-06"); for a tool, the version of its contract.
	Version string
	// JSON is the schema, a JSON Schema document (draft 2020-12 unless
	// its $schema names another): of the event's body, or of the tool's
	// request. A tool's may be empty: its requests are not checked.
	JSON []byte
	// Response is a tool's response schema, a JSON Schema document as
	// JSON is; empty, its responses are not checked (a tool's schema sets
	// JSON or Response, or both). An event's schema has none: one with a
	// Response is refused at load.
	Response []byte
}

// Logger is the logger of the handling ctx is in. In the ctx a handler
// gets, it is the module's logger (Mesh.Logger) tagged with the event's id
// and type; in a tool handler's, with the request's id, tool and caller;
// in Run's, the module's logger as it is. When the handling is traced, the
// trace and span ids are tagged too, on every host. Any other ctx gets
// slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := handlerlog.From(ctx); ok {
		return l
	}
	return slog.Default()
}
