// Package auditlogger is the audit logger module: it consumes every event
// of the mesh ("#") on its queue <node>.audit-logger.events, stores each
// once by its id (package store), and answers queries about them as
// tools over mesh.rpc, so they work from any node:
//
//	audit.query  a page of the events a filter selects, and the next cursor
//	audit.count  how many events a filter selects
//	audit.get    one event by id
//	audit.trace  the causal chain of an event, in both directions
//	audit.stats  rows, bytes, oldest and newest arrivals
//	audit.replayed  records what a replay sent (meshctl audit replay)
//
// A delivery is acknowledged only once its row is durable; a redelivery,
// a resend or a replay of an id already stored is not a second row. It is
// built on the sdk alone, and runs in-process or as a module process
// (auditlogger/cmd/audit-logger). Give it a large prefetch and as much
// concurrency (256): its handlers then share the store's transactions, and
// it keeps up with the event path (docs/adr/0012-audit-store.md).
//
// Retention (Options) drops the oldest events by age and by size, a chunk
// at a time, while ingestion goes on.
//
// meshctl audit query|count|get|trace|export|stats asks it from the
// command line.
//
// It also receives every dead letter of the mesh (sdk.Module.DeadLetters)
// and records it as a fate of its event, so a trace shows where events
// died; an event that breaks the wire contract reaches it that way and
// is stored flagged with why.
package auditlogger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/sdk"
)

// Name is the module's name: its queue is <node>.audit-logger.events.
const Name = "audit-logger"

// OperatorCaller is meshctl's caller name, the default caller of the
// audit tools.
const OperatorCaller = "meshctl"

// Tool keys the audit logger serves.
const (
	ToolQuery = "audit.query"
	ToolCount = "audit.count"
	ToolGet   = "audit.get"
	ToolTrace = "audit.trace"
	ToolStats = "audit.stats"
	// ToolReplayed records what a replay sent (meshctl audit replay
	// calls it), as fates of the events.
	ToolReplayed = "audit.replayed"
)

// Options set the logger's retention. Zero fields keep everything.
type Options struct {
	// MaxAge drops events that arrived longer ago.
	MaxAge time.Duration
	// MaxBytes drops the oldest events while the rows use more of the
	// database.
	MaxBytes int64
	// PruneEvery is how often retention runs (in the module's Run).
	// Default 1 minute.
	PruneEvery time.Duration
}

// Logger is an audit logger with its store open.
type Logger struct {
	store *store.Store
	opts  Options
	now   func() time.Time
}

// Open opens (or creates) the audit database at path.
func Open(path string, opts Options) (*Logger, error) {
	if opts.MaxAge < 0 || opts.MaxBytes < 0 || opts.PruneEvery < 0 {
		return nil, fmt.Errorf("audit logger: retention %+v: negative bound", opts)
	}
	if opts.PruneEvery == 0 {
		opts.PruneEvery = time.Minute
	}
	s, err := store.Open(path, store.Options{})
	if err != nil {
		return nil, err
	}
	return &Logger{store: s, opts: opts, now: time.Now}, nil
}

// Prune applies the retention once: the oldest events it does not keep
// are deleted, a chunk at a time, while ingestion goes on.
func (l *Logger) Prune(ctx context.Context) (int64, error) {
	r := store.Retention{MaxBytes: l.opts.MaxBytes}
	if l.opts.MaxAge > 0 {
		r.Before = l.now().Add(-l.opts.MaxAge)
	}
	if r.Before.IsZero() && r.MaxBytes == 0 {
		return 0, nil
	}
	return l.store.Prune(ctx, r)
}

// retain runs Prune every PruneEvery until ctx ends.
func (l *Logger) retain(ctx context.Context, m sdk.Mesh) error {
	if l.opts.MaxAge == 0 && l.opts.MaxBytes == 0 {
		return nil
	}
	t := time.NewTicker(l.opts.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n, err := l.Prune(ctx); err != nil && ctx.Err() == nil {
			m.Logger().Error("audit retention failed; trying again later", "err", err)
		} else if n > 0 {
			m.Logger().Info("audit retention dropped the oldest events", "events", n)
		}
	}
}

// Close closes the store. Stop the module first: a handler still running
// then fails its delivery, which the broker delivers again.
func (l *Logger) Close() error { return l.store.Close() }

// Store is the logger's store, for a program that embeds it.
func (l *Logger) Store() *store.Store { return l.store }

// Module is the audit logger as an sdk module.
func (l *Logger) Module() sdk.Module {
	return sdk.Module{
		Name: Name,
		Run:  l.retain,
		// The audit log holds every body of the mesh, and audit.replayed
		// writes into it: by default only the operator (meshctl) may call
		// its tools; a node config may grant more (callers:).
		Callers: map[string][]string{"audit.*": {OperatorCaller}},
		// It stores a body of any version as it came: no new version of a
		// schema breaks it (meshctl schema check says so).
		Reads: map[string][]string{"#": {"*"}},
		// Dead letters come on <node>.audit-logger.dead: the logger
		// records each as a fate of its event, and stores the event too
		// (one that breaks the contract reaches the logger only so).
		DeadLetters: sdk.HandlerFunc(l.recordDead),
		Setup: func(m sdk.Mesh) error {
			// The store keeps each id once by itself: the node's own
			// de-duplication would only repeat that work.
			return errors.Join(
				m.On("#", sdk.HandlerFunc(l.record), sdk.AllowDuplicates()),
				m.Serve(ToolQuery, sdk.ToolHandlerFunc(l.query)),
				m.Serve(ToolCount, sdk.ToolHandlerFunc(l.count)),
				m.Serve(ToolGet, sdk.ToolHandlerFunc(l.get)),
				m.Serve(ToolTrace, sdk.ToolHandlerFunc(l.trace)),
				m.Serve(ToolStats, sdk.ToolHandlerFunc(l.stats)),
				m.Serve(ToolReplayed, sdk.ToolHandlerFunc(l.replayed)),
			)
		},
	}
}

// record stores one event and returns once its row is durable.
func (l *Logger) record(ctx context.Context, ev sdk.Event) error {
	if _, err := l.store.Add(ctx, rowOf(ev, l.now())); err != nil {
		return fmt.Errorf("record %s in the audit log: %w", ev.ID, err)
	}
	return nil
}

// recordDead stores a dead letter as a fate of its event, and the event
// itself if the store does not hold it, once both are durable. An event
// that breaks the contract is stored flagged with why; without a usable
// id it gets one made from its content, so the same message
// dead-lettered by several queues is one row with several fates.
func (l *Logger) recordDead(ctx context.Context, ev sdk.Event) error {
	row := rowOf(ev, l.now())
	if ev.DeadReason == malformedReason {
		row.Malformed = ev.DeadError
		if row.Malformed == "" {
			row.Malformed = "breaks the wire contract"
		}
		row.Headers = ev.Headers // every header as it came, as text
		if row.ID == "" {
			row.ID = contentID(ev)
		}
	}
	fate := store.Fate{EventID: row.ID, Kind: store.FateDead, Queue: ev.DeadQueue, Reason: ev.DeadReason, Error: ev.DeadError,
		Attempts: ev.DeadAttempts, Time: ev.DeadTime}
	if _, err := l.store.AddFates(ctx, []store.Fate{fate}, row); err != nil {
		return fmt.Errorf("record the dead letter of %s in the audit log: %w", row.ID, err)
	}
	return nil
}

// malformedReason is the dead letters' reason for a message that breaks
// the wire contract (x-mesh-dead-reason).
const malformedReason = "malformed"

// contentID names a message that has no id of its own by what it holds:
// "malformed-" and a digest of its type, headers and body.
func contentID(ev sdk.Event) string {
	h := sha256.New()
	keys := slices.Sorted(maps.Keys(ev.Headers))
	fmt.Fprintf(h, "%q\n", ev.Type)
	for _, k := range keys {
		fmt.Fprintf(h, "%q=%q\n", k, ev.Headers[k])
	}
	h.Write(ev.Body)
	return "malformed-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// ReplayedRequest is audit.replayed's request: what one replay sent.
type ReplayedRequest struct {
	// ReplayID is the replay's id (the x-replay-id header it sent).
	ReplayID string `json:"replay_id"`
	// Destination is where the events went: mesh.events or a module's
	// queue.
	Destination string `json:"destination"`
	// Sent lists the events sent, each with when.
	Sent []ReplayedEvent `json:"sent"`
}

// ReplayedEvent is one event a replay sent.
type ReplayedEvent struct {
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
}

// MaxReplayedPerCall bounds the events one audit.replayed call records.
const MaxReplayedPerCall = 1000

func (l *Logger) replayed(ctx context.Context, req sdk.Request) (any, error) {
	var r ReplayedRequest
	if err := req.Decode(&r); err != nil {
		return nil, badRequest(err)
	}
	if r.ReplayID == "" || r.Destination == "" || len(r.Sent) > MaxReplayedPerCall {
		return nil, badRequest(fmt.Errorf("a replay id, a destination and at most %d events are needed", MaxReplayedPerCall))
	}
	fates := make([]store.Fate, 0, len(r.Sent))
	for _, e := range r.Sent {
		if e.ID == "" {
			return nil, badRequest(errors.New("an event sent without an id"))
		}
		fates = append(fates, store.Fate{EventID: e.ID, Kind: store.FateReplayed, Queue: r.Destination, ReplayID: r.ReplayID, Time: e.Time})
	}
	if _, err := l.store.AddFates(ctx, fates); err != nil {
		return nil, err
	}
	return len(fates), nil
}

// rowOf is what the store keeps of an event: every header the handler
// sees, the contract's included.
func rowOf(ev sdk.Event, arrived time.Time) store.Event {
	headers := make(map[string]string, len(ev.Headers)+6)
	for k, v := range ev.Headers {
		headers[k] = v
	}
	set := func(k, v string) {
		if v != "" {
			headers[k] = v
		}
	}
	set("x-event-id", ev.ID)
	set("x-source", ev.Source)
	set("x-node", ev.Node)
	set("x-causation-id", ev.CausationID)
	set("x-schema", ev.Schema)
	if !ev.Time.IsZero() {
		headers["x-time"] = ev.Time.UTC().Format(time.RFC3339Nano)
	}
	return store.Event{ID: ev.ID, Type: ev.Type, Source: ev.Source, Node: ev.Node, CausationID: ev.CausationID, Schema: ev.Schema,
		Time: ev.Time, UserID: ev.UserID, Headers: headers, Body: ev.Body, Arrived: arrived.UTC(), Redelivered: ev.Redelivered}
}

// QueryRequest is audit.query's request: a filter and a page.
type QueryRequest struct {
	Filter store.Filter `json:"filter"`
	Page   store.Page   `json:"page"`
}

// QueryResponse is audit.query's response: the events and the cursor of
// the next page (0 when there is none).
type QueryResponse struct {
	Events []store.Event `json:"events"`
	Next   int64         `json:"next,omitempty"`
}

// TraceRequest is audit.trace's request.
type TraceRequest struct {
	ID string `json:"id"`
	// MaxDepth bounds the levels followed each way; 0 follows them all.
	MaxDepth int `json:"max_depth,omitempty"`
}

// badRequest is the tool error of a request the logger cannot read.
func badRequest(err error) error {
	return &sdk.ToolError{Code: "bad_request", Message: err.Error(), Permanent: true}
}

func (l *Logger) query(ctx context.Context, req sdk.Request) (any, error) {
	var q QueryRequest
	if err := req.Decode(&q); err != nil {
		return nil, badRequest(err)
	}
	evs, next, err := l.store.Query(ctx, q.Filter, q.Page)
	if err != nil {
		return nil, queryError(err)
	}
	if evs == nil {
		evs = []store.Event{}
	}
	return QueryResponse{Events: evs, Next: next}, nil
}

func (l *Logger) count(ctx context.Context, req sdk.Request) (any, error) {
	var f store.Filter
	if err := req.Decode(&f); err != nil {
		return nil, badRequest(err)
	}
	n, err := l.store.Count(ctx, f)
	if err != nil {
		return nil, queryError(err)
	}
	return n, nil
}

func (l *Logger) get(ctx context.Context, req sdk.Request) (any, error) {
	var id string
	if err := req.Decode(&id); err != nil {
		return nil, badRequest(err)
	}
	ev, err := l.store.Get(ctx, id)
	if err != nil {
		return nil, queryError(err)
	}
	return ev, nil
}

func (l *Logger) trace(ctx context.Context, req sdk.Request) (any, error) {
	var t TraceRequest
	if err := req.Decode(&t); err != nil {
		return nil, badRequest(err)
	}
	tr, err := l.store.Trace(ctx, t.ID, t.MaxDepth)
	if err != nil {
		return nil, queryError(err)
	}
	return tr, nil
}

func (l *Logger) stats(ctx context.Context, _ sdk.Request) (any, error) {
	st, err := l.store.Stats(ctx)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// queryError tells the caller a missing event and a bad filter apart from
// the store's own failures (which are transient).
func queryError(err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &sdk.ToolError{Code: "not_found", Message: err.Error(), Permanent: true}
	case errors.Is(err, store.ErrBadFilter):
		return badRequest(err)
	}
	return err
}
