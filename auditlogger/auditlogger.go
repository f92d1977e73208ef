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
//	audit.verify  checks the hash chain and the signed checkpoints
//
// With Options.History it reads the mesh's history, a stream on the
// broker, instead of a queue of its own, by offset: any number of loggers
// on any nodes hold the same rows in the same order, and one started
// empty builds its index from the stream. Every row is hash-chained, and
// the logger signs its chain's head every minute and emits the signed
// checkpoint onto the mesh (checkpoint.go, docs/adr/0035-audit-history-on-a-stream.md).
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
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
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
	// ToolVerify checks the chain and the checkpoints (Verify).
	ToolVerify = "audit.verify"
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
	// History reads the mesh's history (the stream its node config names
	// under history:, granted by history: true in the logger's entry)
	// instead of a queue of its own: rows in the stream's order, each with
	// its offset, and the offset to read next stored with them, so a
	// restarted logger resumes exactly and a new one builds its index from
	// the stream (ADR 35). Dead letters still come on its dead-letter
	// queue, as fates.
	History bool
	// KeyFile is the logger's signing key (PKCS #8 PEM, made if missing):
	// default the database's path with ".key" added. "-" signs nothing.
	KeyFile string
	// CheckpointEvery is how often the logger signs its chain's head and
	// emits the checkpoint (when the head moved). Default 1 minute; a
	// negative value emits none.
	CheckpointEvery time.Duration
}

// Logger is an audit logger with its store open.
type Logger struct {
	store *store.Store
	opts  Options
	now   func() time.Time
	key   ed25519.PrivateKey // signs checkpoints; nil: none

	mu             sync.Mutex
	lastCheckpoint int64 // the head's Seq at the last checkpoint emitted
}

// Open opens (or creates) the audit database at path.
func Open(path string, opts Options) (*Logger, error) {
	if opts.MaxAge < 0 || opts.MaxBytes < 0 || opts.PruneEvery < 0 {
		return nil, fmt.Errorf("audit logger: retention %+v: negative bound", opts)
	}
	if opts.PruneEvery == 0 {
		opts.PruneEvery = time.Minute
	}
	if opts.CheckpointEvery == 0 {
		opts.CheckpointEvery = time.Minute
	}
	var key ed25519.PrivateKey
	if opts.KeyFile != "-" {
		if opts.KeyFile == "" {
			opts.KeyFile = path + ".key"
		}
		var err error
		if key, err = LoadKey(opts.KeyFile); err != nil {
			return nil, fmt.Errorf("audit logger: %w", err)
		}
	}
	s, err := store.Open(path, store.Options{})
	if err != nil {
		return nil, err
	}
	return &Logger{store: s, opts: opts, now: time.Now, key: key}, nil
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

// run keeps the retention and the checkpoints until ctx ends.
func (l *Logger) run(ctx context.Context, m sdk.Mesh) error {
	var wg sync.WaitGroup
	wg.Go(func() { l.checkpoints(ctx, m) })
	err := l.retain(ctx, m)
	wg.Wait()
	return err
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
	var history *sdk.History
	// It stores a body of any version as it came: no new version of a
	// schema breaks it (meshctl schema check says so).
	reads := map[string][]string{"#": {"*"}}
	if l.opts.History {
		history = &sdk.History{From: l.historyFrom, Handle: l.recordHistory}
		reads = nil // no On handler: the history is read whole
	}
	return sdk.Module{
		Name:  Name,
		Emits: []string{CheckpointEvent},
		Run:   l.run,
		// With the history, every event comes from the stream, in its
		// order: no queue of its own.
		History: history,
		// The audit log holds every body of the mesh, and audit.replayed
		// writes into it: by default only the operator (meshctl) may call
		// its tools; a node config may grant more (callers:).
		Callers: map[string][]string{"audit.*": {OperatorCaller}},
		Reads:   reads,
		// Dead letters come on <node>.audit-logger.dead: the logger
		// records each as a fate of its event, and stores the event too
		// (one that breaks the contract reaches the logger only so).
		DeadLetters: sdk.HandlerFunc(l.recordDead),
		Setup: func(m sdk.Mesh) error {
			// The store keeps each id once by itself: the node's own
			// de-duplication would only repeat that work.
			var on error
			if !l.opts.History {
				on = m.On("#", sdk.HandlerFunc(l.record), sdk.AllowDuplicates())
			}
			return errors.Join(on,
				m.Serve(ToolVerify, sdk.ToolHandlerFunc(l.verify)),
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
	row := flaggedRowOf(ev, l.now())
	fate := store.Fate{EventID: row.ID, Kind: store.FateDead, Queue: ev.DeadQueue, Reason: ev.DeadReason, Error: ev.DeadError,
		Attempts: ev.DeadAttempts, Time: ev.DeadTime}
	rows := []store.Event{row}
	if l.opts.History {
		rows = nil // the event comes from the history, in the history's order
	}
	if _, err := l.store.AddFates(ctx, []store.Fate{fate}, rows...); err != nil {
		return fmt.Errorf("record the dead letter of %s in the audit log: %w", row.ID, err)
	}
	return nil
}

// flaggedRowOf is rowOf for an event that may break the contract (a dead
// letter, or a message of the history): such an event is stored flagged
// with why, with every header as it came, and, without a usable id, one
// made from its content.
func flaggedRowOf(ev sdk.Event, now time.Time) store.Event {
	row := rowOf(ev, now)
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
	return row
}

// HistoryRowOf is the row the logger stores for an event of the history
// (a History handler's), arrived now: what meshctl audit verify --history
// compares the logger's rows with.
func HistoryRowOf(ev sdk.Event, now time.Time) store.Event {
	row := flaggedRowOf(ev, now)
	offset := ev.Offset
	row.Offset = &offset
	return row
}

// historyFrom is where the logger reads the history from: the offset
// after the last batch it stored, or the start for a new database.
func (l *Logger) historyFrom(ctx context.Context) (int64, error) {
	next, ok, err := l.store.HistoryNext(ctx)
	if err != nil || !ok {
		return -1, err
	}
	return next, nil
}

// recordHistory stores a batch of the history in its order, with the
// offset to read next, in one transaction.
func (l *Logger) recordHistory(ctx context.Context, evs []sdk.Event) error {
	if len(evs) == 0 {
		return nil
	}
	rows := make([]store.Event, len(evs))
	for i, ev := range evs {
		rows[i] = HistoryRowOf(ev, l.now())
	}
	next := evs[len(evs)-1].Offset + 1
	if _, err := l.store.AddHistory(ctx, next, rows...); err != nil {
		return fmt.Errorf("record the history from offset %d in the audit log: %w", evs[0].Offset, err)
	}
	return nil
}

// VerifyRequest is audit.verify's request.
type VerifyRequest struct {
	// Trusted lists the key ids whose checkpoints count (empty: any).
	Trusted []string `json:"trusted,omitempty"`
}

func (l *Logger) verify(ctx context.Context, req sdk.Request) (any, error) {
	var r VerifyRequest
	if len(req.Body) > 0 && string(req.Body) != "null" {
		if err := req.Decode(&r); err != nil {
			return nil, badRequest(err)
		}
	}
	return l.Verify(ctx, r.Trusted)
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
