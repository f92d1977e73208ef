package sdk

import (
	"encoding/json"
	"fmt"
	"time"
)

// Event is one event as a handler receives it: its metadata and its body.
type Event struct {
	// ID is the event's ULID, the same across retries, redeliveries and
	// replays.
	ID string
	// Type is the full event type, for example module.umami.site.created.
	Type string
	// Source is the emitter: a module, a mesh context or a node name.
	Source string
	// Node is the node the event was emitted from.
	Node string
	// Time is when it was emitted, in UTC.
	Time time.Time
	// CausationID is the id of the event or request that caused this one,
	// or "".
	CausationID string
	// Schema is the version of the body's shape, or "".
	Schema string
	// Headers holds the emitter's other x- headers, as text. The mesh
	// ignores them; a handler may read them.
	Headers map[string]string
	// Body is the JSON payload.
	Body json.RawMessage
	// Attempt counts the handler calls for this event in this queue,
	// starting at 1.
	Attempt int
	// Redelivered is true when the broker delivered the event before, to
	// this or another consumer of the queue.
	Redelivered bool
	// UserID is the broker user that published the event (the AMQP
	// user-id property), when the publisher set it: the broker refuses a
	// user-id other than the publishing connection's, so it says whose
	// credential published the event. Nodes set it; a foreign publisher
	// may not. A retry keeps the original publisher's; a replay (meshctl
	// dlq replay, audit replay) has the replaying user's. On a dead letter
	// it is the original publisher's too.
	UserID string
	// Queue is the broker queue a Consume handler got the message from;
	// "" for an event of the mesh.
	Queue string
	// Offset is the event's place in the mesh's history, for a
	// Module.History handler (0 elsewhere): the broker numbers what the
	// history keeps from 0 up.
	Offset int64

	// The Dead fields describe a dead letter, as a Module.DeadLetters
	// handler receives it; they are empty for an event from mesh.events.
	//
	// DeadQueue is the queue that gave up on the event
	// (<node>.<module>.events).
	DeadQueue string
	// DeadReason is why: "permanent" (the handler said so),
	// "forbidden" (the handler's emit or call was refused for want of a
	// grant: retrying cannot help; the error names the key to add),
	// "delivery_limit" (every attempt failed, or the broker's limit
	// struck), "malformed" (the message breaks the wire contract: the
	// other fields are then read as far as they can be, Body is the bytes
	// as they arrived and may not be JSON, and Headers holds every header
	// as text), "no_handler", "schema" (its x-schema is not a version
	// the handler reads, Module.Reads: the handler did not run),
	// "expired" (a consumed queue's message whose x-deadline passed) or
	// "conflict" (its id was handled with other content: the handler did
	// not run; DeadError names both digests) or "identity" (its x-node
	// was published by another broker user than the receiving node's
	// identity rule names: the handler did not run; DeadError names both).
	DeadReason string
	// DeadError is the last error, as text.
	DeadError string
	// DeadAttempts is how many times the handler was tried; 0 if unknown.
	DeadAttempts int
	// DeadTime is when the queue gave up, in UTC.
	DeadTime time.Time
}

// Decode unmarshals the event's JSON body into v.
func (e Event) Decode(v any) error {
	if err := json.Unmarshal(e.Body, v); err != nil {
		return fmt.Errorf("decode body of %s event %s: %w", e.Type, e.ID, err)
	}
	return nil
}

// Request is one tool call as a server receives it.
type Request struct {
	// ID is the request's ULID.
	ID string
	// Tool is the tool key called, for example invoice.create.
	Tool string
	// Caller is the calling module (or meshctl), and Node its node.
	Caller, Node string
	// Time is when the call was made, in UTC.
	Time time.Time
	// Deadline is when the caller gives up; the handler's context ends then.
	Deadline time.Time
	// CausationID is the id of the event or request that caused this call,
	// or "".
	CausationID string
	// Headers holds the caller's other x- headers, as text.
	Headers map[string]string
	// Body is the JSON request.
	Body json.RawMessage
}

// Decode unmarshals the request's JSON body into v.
func (r Request) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("decode request %s to %s: %w", r.ID, r.Tool, err)
	}
	return nil
}
