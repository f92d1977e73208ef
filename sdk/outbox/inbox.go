package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshkit/mesh/internal/outboxstore"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// ErrConflict is wrapped by the error of a handling whose event (or
// request) id the inbox recorded with other content: the same id with
// another type, body or headers. The handler does not run. The error is
// sdk.ErrConflict too (and permanent), so the host dead-letters the event
// at once with reason "conflict" and counts it as a conflict, whatever
// its node's own de-duplication knew of the id (nothing, with
// allow_duplicates or for a node that shares the database with the one
// that handled it).
var ErrConflict = outboxstore.ErrConflict

// conflictError is the error of a handling the inbox found in conflict.
type conflictError struct{ err error }

func (c conflictError) Error() string { return "outbox inbox: " + c.err.Error() }
func (c conflictError) Unwrap() []error {
	return []error{c.err, sdk.ErrConflict, sdk.ErrPermanent}
}

// ErrNoID is wrapped by the error of a handling of a message without an
// id (a foreign message consumed from a queue without a message id): the
// inbox has nothing to record it by, and it is dead-lettered.
var ErrNoID = errors.New("outbox: the message has no id for the inbox to record")

// Handler returns a handler (for On, Consume or DeadLetters) that applies
// fn's effect exactly once per event id (per event id and queue, for a
// dead letter): it opens a transaction on the
// outbox's database, records the event's id with a digest of its content
// (the inbox, table mesh_inbox), runs fn in it and commits, and only then
// returns, so the node acknowledges the event after its effect is
// durable. An event whose id is already recorded with the same content
// (a redelivery after any crash, from this node or another sharing the
// database) is acknowledged without running fn; with other content, it is
// a conflict (ErrConflict and sdk.ErrConflict: the host dead-letters it
// at once with reason "conflict"). fn returning an error rolls the
// transaction back, its record with it: the event is retried, as any
// handler's. What fn emits with Emit in tx commits with its effect, under
// ids derived from the event.
//
// Do not commit or roll back tx in fn.
func (o *Outbox) Handler(fn func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		if ev.ID == "" {
			return sdk.Permanent(ErrNoID)
		}
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("outbox inbox: begin: %w", err)
		}
		defer tx.Rollback()
		seen, _, err := o.store.Record(ctx, tx, inboxKey(ev), eventDigest(ev), o.now())
		switch {
		case seen == outboxstore.Conflict:
			return conflictError{err}
		case err != nil:
			return err
		case seen == outboxstore.Duplicate:
			return nil // its effect committed before: acknowledged without running again
		}
		if err := fn(ctx, tx, ev); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("outbox inbox: commit %s: %w", ev.ID, err)
		}
		return nil
	})
}

// ToolHandler returns a tool handler (for Serve) that decides each request
// exactly once: it opens a transaction, records the request's id with a
// digest of the request (tool, caller, body), runs fn in it, stores the
// decision (the response, or a permanent error) with the record and
// commits, then answers. A request repeated with its id (a retried call,
// after a restart, at any server of the tool sharing the database) is
// answered with the stored decision, without running fn; with another
// body, tool or caller it is refused with the permanent ToolError
// "conflict". A transient error (not sdk.Permanent, nor a permanent
// ToolError) rolls back, the record with it, so a retry runs fn again.
//
// Do not commit or roll back tx in fn.
func (o *Outbox) ToolHandler(fn func(ctx context.Context, tx *sql.Tx, req sdk.Request) (any, error)) sdk.ToolHandler {
	return sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
		if req.ID == "" {
			return nil, sdk.Permanent(ErrNoID)
		}
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("outbox inbox: begin: %w", err)
		}
		defer tx.Rollback()
		seen, stored, err := o.store.Record(ctx, tx, req.ID, requestDigest(req), o.now())
		switch {
		case seen == outboxstore.Conflict:
			return nil, &sdk.ToolError{Code: "conflict", Message: err.Error(), Permanent: true}
		case err != nil:
			return nil, err
		case seen == outboxstore.Duplicate:
			return replay(stored)
		}
		resp, ferr := fn(ctx, tx, req)
		d, keep := decide(resp, ferr)
		if !keep {
			return nil, ferr // transient: rolled back, record and all
		}
		raw, err := json.Marshal(d)
		if err != nil {
			return nil, sdk.Permanent(fmt.Errorf("outbox inbox: the response is not JSON: %w", err))
		}
		if err := o.store.Decide(ctx, tx, req.ID, raw); err != nil {
			return nil, err
		}
		if err := tx.Commit(); err != nil {
			return nil, fmt.Errorf("outbox inbox: commit %s: %w", req.ID, err)
		}
		return replay(raw)
	})
}

// decision is what the inbox stores of a tool's answer.
type decision struct {
	Response json.RawMessage `json:"response,omitempty"`
	Error    *sdk.ToolError  `json:"error,omitempty"`
}

// decide is the decision to store for fn's answer, and whether to store
// it: a response or a permanent error, not a transient one.
func decide(resp any, err error) (decision, bool) {
	if err == nil {
		raw, merr := json.Marshal(resp)
		if merr != nil {
			return decision{Error: &sdk.ToolError{Code: "rejected", Message: "the response is not JSON: " + merr.Error(), Permanent: true}}, true
		}
		return decision{Response: raw}, true
	}
	var te *sdk.ToolError
	switch {
	case errors.As(err, &te) && te.Permanent:
		return decision{Error: te}, true
	case errors.As(err, &te):
		return decision{}, false
	case errors.Is(err, sdk.ErrPermanent):
		return decision{Error: &sdk.ToolError{Code: "rejected", Message: err.Error(), Permanent: true}}, true
	}
	return decision{}, false
}

// replay answers with a stored decision.
func replay(raw []byte) (any, error) {
	var d decision
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, sdk.Permanent(fmt.Errorf("outbox inbox: the stored decision does not decode: %w", err))
	}
	if d.Error != nil {
		return nil, d.Error
	}
	return d.Response, nil
}

// inboxKey is what the inbox records an event by: its id, and for a dead
// letter the queue that gave up on it too (one event may be given up by
// several modules' queues, each a dead letter of its own).
func inboxKey(ev sdk.Event) string {
	if ev.DeadQueue != "" {
		return ev.ID + "@" + ev.DeadQueue
	}
	return ev.ID
}

// eventDigest is the digest the inbox records an event with: the node's
// (wire.Digest) over its type, source, schema, cause, headers and body.
func eventDigest(ev sdk.Event) string {
	return wire.FormatDigest(wire.Digest(ev.Type, wire.Meta{Source: ev.Source, Schema: ev.Schema, CausationID: ev.CausationID, Extra: ev.Headers}, ev.Body))
}

// requestDigest is the digest a tool request is recorded with: the tool,
// the caller and the body, with the request's headers.
func requestDigest(req sdk.Request) string {
	return wire.FormatDigest(wire.Digest("tool:"+req.Tool, wire.Meta{Source: req.Caller, CausationID: req.CausationID, Extra: req.Headers}, req.Body))
}
