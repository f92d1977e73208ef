// Package store is the audit logger's record of the mesh: every event
// stored once by its id, in an embedded pure-Go SQLite database (WAL),
// written in group-committed transactions and queried with filters and
// pages.
//
//	s, err := store.Open(filepath.Join(stateDir, "audit.db"), store.Options{})
//	added, err := s.Add(ctx, ev)             // returns once the row is durable
//	page, err := s.Query(ctx, store.Filter{Types: []string{"module.umami.#"}}, store.Page{Limit: 100})
//
// Every row stored is chained: it holds the hash of the row before it
// (prev) and its own hash over that and its content (ChainHash), so that
// Verify shows a row changed, inserted, deleted or moved after it was
// written. AddHistory indexes the mesh's replicated history stream by
// offset, recording in the same transaction where to read on.
//
//	report, err := s.Verify(ctx)             // report.Problem == nil: the chain holds
//	head, err := s.Head(ctx)                 // record head.Hash elsewhere: a checkpoint
//
// It imports neither the sdk nor the runtime: the audit logger module
// (package auditlogger) feeds it.
package store

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"modernc.org/sqlite"
)

// ErrNotFound is returned by Get and HashOf for an id the store does not
// hold.
var ErrNotFound = errors.New("no such event in the audit log")

// ErrUnchained is returned by HashOf for a row stored before the store
// chained its rows: it has no hash.
var ErrUnchained = errors.New("event stored before the audit log was chained")

// ErrBadFilter is wrapped by the error for a filter the store cannot run:
// a type pattern with an empty word, a body filter whose path or value is
// not one.
var ErrBadFilter = errors.New("bad filter")

// ErrClosed is returned once the store is closed.
var ErrClosed = errors.New("audit store closed")

// Event is one stored event: what an auditor asks about, without parsing
// its body.
type Event struct {
	// Seq is the event's place in the order of arrival in this store.
	Seq int64 `json:"seq"`
	// ID is the event's x-event-id.
	ID string `json:"id"`
	// Type is its routing key.
	Type string `json:"type"`
	// Source, Node, CausationID and Schema are its x-source, x-node,
	// x-causation-id and x-schema headers ("" when absent).
	Source      string `json:"source,omitempty"`
	Node        string `json:"node,omitempty"`
	CausationID string `json:"causation_id,omitempty"`
	Schema      string `json:"schema,omitempty"`
	// Time is its x-time, the emit time (zero when absent or unreadable).
	Time time.Time `json:"time,omitzero"`
	// UserID is the AMQP user-id property: the broker user that published
	// it, when the publisher set it (the broker checks it).
	UserID string `json:"user_id,omitempty"`
	// Headers holds every header, as text.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the body as it arrived. In JSON it is the body itself when
	// that is JSON, and "body_base64" otherwise.
	Body []byte `json:"-"`
	// Arrived is when the audit logger received it.
	Arrived time.Time `json:"arrived"`
	// Redelivered is the broker's flag on the delivery that was stored.
	Redelivered bool `json:"redelivered,omitempty"`
	// Malformed says how the event breaks the wire contract, or "".
	Malformed string `json:"malformed,omitempty"`
	// Fates are what became of the event after it was emitted: the
	// queues that dead-lettered it and the replays that sent it again, in
	// the order they were recorded.
	Fates []Fate `json:"fates,omitempty"`
	// Hash is the row's link in the store's hash chain, in hex (see
	// ChainHash): set by the store when it reads the row, "" for a row
	// stored before the store chained its rows. Add ignores it.
	Hash string `json:"hash,omitempty"`
	// Offset is the event's offset in the mesh's history stream, for an
	// event stored from it (AddHistory); nil otherwise. The chain does not
	// cover it: two loggers that store the same events, one from the
	// stream and one from a queue, hold the same chain.
	Offset *int64 `json:"offset,omitempty"`
}

// eventJSON is Event's JSON shape without its methods.
type eventJSON Event

// MarshalJSON writes the body as JSON when it is, in base64 otherwise;
// the other fields as their tags say.
func (e Event) MarshalJSON() ([]byte, error) {
	out := struct {
		eventJSON
		Body       json.RawMessage `json:"body,omitempty"`
		BodyBase64 []byte          `json:"body_base64,omitempty"`
	}{eventJSON: eventJSON(e)}
	if json.Valid(e.Body) {
		out.Body = e.Body
	} else {
		out.BodyBase64 = e.Body
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (e *Event) UnmarshalJSON(b []byte) error {
	var in struct {
		eventJSON
		Body       json.RawMessage `json:"body"`
		BodyBase64 []byte          `json:"body_base64"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*e = Event(in.eventJSON)
	e.Body = in.BodyBase64
	if in.Body != nil {
		e.Body = in.Body
	}
	return nil
}

// Options tune a Store. Zero fields take the defaults.
type Options struct {
	// MaxBatch bounds the events the writer gathers from waiting calls
	// into one transaction. Default 512. One call's events are never split
	// across transactions nor interleaved with another's: a call with more
	// than MaxBatch events is committed whole.
	MaxBatch int
}

// Store is an open audit database. It is safe for concurrent use: reads
// run in parallel (WAL), writes go through one writer that commits what
// is waiting in one transaction. One Store at a time may have a database
// open: its writer keeps the head of the hash chain in memory.
type Store struct {
	db       *sql.DB
	maxBatch int
	adds     chan addRequest
	done     chan struct{}

	// head is the hash of the newest chained row (or the anchor, or
	// Genesis): the prev of the next row stored. Only the writer goroutine
	// uses it, once Open has loaded it.
	head []byte

	closeMu sync.RWMutex
	closed  bool
}

type addRequest struct {
	events []Event
	fates  []Fate
	// history says the events come from the history stream (AddHistory):
	// next is then recorded as the position to read on from.
	history bool
	next    int64
	result  chan addResult
}

type addResult struct {
	added int
	err   error
}

const schema = `
CREATE TABLE IF NOT EXISTS events (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT NOT NULL UNIQUE,
	type         TEXT NOT NULL,
	source       TEXT NOT NULL DEFAULT '',
	node         TEXT NOT NULL DEFAULT '',
	causation_id TEXT NOT NULL DEFAULT '',
	schema_ver   TEXT NOT NULL DEFAULT '',
	time_ns      INTEGER NOT NULL DEFAULT 0,
	user_id      TEXT NOT NULL DEFAULT '',
	headers      TEXT NOT NULL DEFAULT '{}',
	body_json    TEXT,
	body_raw     BLOB,
	arrived_ns   INTEGER NOT NULL,
	redelivered  INTEGER NOT NULL DEFAULT 0,
	malformed    TEXT NOT NULL DEFAULT '',
	hash          BLOB,
	prev          BLOB,
	stream_offset INTEGER
);
CREATE INDEX IF NOT EXISTS events_time ON events(time_ns);
CREATE INDEX IF NOT EXISTS events_source ON events(source);
CREATE INDEX IF NOT EXISTS events_causation ON events(causation_id);
CREATE TABLE IF NOT EXISTS fates (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	event_id   TEXT NOT NULL,
	kind       TEXT NOT NULL,
	queue      TEXT NOT NULL DEFAULT '',
	reason     TEXT NOT NULL DEFAULT '',
	error      TEXT NOT NULL DEFAULT '',
	attempts   INTEGER NOT NULL DEFAULT 0,
	replay_id  TEXT NOT NULL DEFAULT '',
	time_ns    INTEGER NOT NULL DEFAULT 0,
	UNIQUE (event_id, kind, queue, replay_id, time_ns)
);
CREATE TABLE IF NOT EXISTS meta (
	key   TEXT PRIMARY KEY,
	value BLOB
);
`

// Indexes cost every insert (ADR 12): the type has none, because a topic
// pattern is matched by a function no index serves, and the arrival time
// has none, because arrivals follow seq.

var registerFuncs sync.Once

// Open opens (or creates) the audit database at path.
func Open(path string, opts Options) (*Store, error) {
	registerFuncs.Do(func() {
		sqlite.MustRegisterDeterministicScalarFunction("mesh_topic_match", 2, topicMatchFunc)
	})
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(ON)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open audit store %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open audit store %s: %w", path, err)
	}
	s := &Store{db: db, maxBatch: opts.MaxBatch, adds: make(chan addRequest, opts.MaxBatch), done: make(chan struct{})}
	if s.head, err = loadHead(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open audit store %s: %w", path, err)
	}
	go s.write()
	return s, nil
}

// Close waits for the writes in flight and closes the database.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.adds)
	s.closeMu.Unlock()
	<-s.done
	return s.db.Close()
}

// Add stores events, each once by its id: an id the store holds already
// (a redelivery, a resend, a replay) is not stored again. It returns how
// many were new, once they are durable on disk. Concurrent calls share a
// transaction.
func (s *Store) Add(ctx context.Context, events ...Event) (int, error) {
	return s.AddFates(ctx, nil, events...)
}

// AddFates stores events as Add does and, in the same transaction, what
// became of events (each fate once: a redelivered dead letter is not a
// second one). The fates' events need not be stored.
func (s *Store) AddFates(ctx context.Context, fates []Fate, events ...Event) (int, error) {
	if err := checkEvents(events); err != nil {
		return 0, fmt.Errorf("add to the audit log: %w", err)
	}
	for i, f := range fates {
		if f.EventID == "" || (f.Kind != FateDead && f.Kind != FateReplayed) {
			return 0, fmt.Errorf("add to the audit log: fate %d: no event id, or kind %q is not %s or %s", i, f.Kind, FateDead, FateReplayed)
		}
	}
	return s.send(ctx, addRequest{events: events, fates: fates})
}

// checkEvents refuses an event without an id.
func checkEvents(events []Event) error {
	for i := range events {
		if events[i].ID == "" {
			return fmt.Errorf("event %d has no id", i)
		}
	}
	return nil
}

// send hands req to the writer and waits for its result.
func (s *Store) send(ctx context.Context, req addRequest) (int, error) {
	req.result = make(chan addResult, 1)
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return 0, ErrClosed
	}
	select {
	case s.adds <- req:
	case <-ctx.Done():
		s.closeMu.RUnlock()
		return 0, ctx.Err()
	}
	s.closeMu.RUnlock()
	select {
	case r := <-req.result:
		return r.added, r.err
	case <-ctx.Done():
		return 0, ctx.Err() // the write goes on; a retry is absorbed by id
	}
}

// write commits what Add queued, as many requests as are waiting (up to
// MaxBatch events) per transaction, until Close. A request is never split:
// it joins a transaction whole, its events in its order, and the requests
// of a transaction are inserted one after another.
func (s *Store) write() {
	defer close(s.done)
	for req := range s.adds {
		batch := []addRequest{req}
		n := len(req.events) + len(req.fates)
	fill:
		for n < s.maxBatch {
			select {
			case more, ok := <-s.adds:
				if !ok {
					break fill
				}
				batch = append(batch, more)
				n += len(more.events) + len(more.fates)
			default:
				break fill
			}
		}
		added, err := s.commit(batch)
		for i, r := range batch {
			r.result <- addResult{added: added[i], err: err}
		}
	}
}

// commit inserts the batch in one transaction; added[i] counts the new
// rows of batch[i]. Each new row is chained to the one before it; if the
// transaction fails, the head of the chain is what it was.
func (s *Store) commit(batch []addRequest) (added []int, err error) {
	added = make([]int, len(batch))
	head := s.head
	defer func() {
		if err != nil {
			s.head = head
		}
	}()
	tx, err := s.db.Begin()
	if err != nil {
		return added, fmt.Errorf("add to the audit log: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	stmt, err := tx.Prepare(`INSERT INTO events (id, type, source, node, causation_id, schema_ver, time_ns, user_id, headers,
		body_json, body_raw, arrived_ns, redelivered, malformed, prev, hash, stream_offset)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING`)
	if err != nil {
		return added, fmt.Errorf("add to the audit log: prepare: %w", err)
	}
	defer stmt.Close()
	for i, r := range batch {
		for _, ev := range r.events {
			headers := canonicalHeaders(ev.Headers)
			var bodyJSON, bodyRaw any
			if json.Valid(ev.Body) && utf8.Valid(ev.Body) {
				bodyJSON = string(ev.Body)
			} else if ev.Body != nil {
				bodyRaw = ev.Body
			}
			var offset any
			if ev.Offset != nil {
				offset = *ev.Offset
			}
			hash := chainHash(s.head, ev, headers)
			res, err := stmt.Exec(ev.ID, ev.Type, ev.Source, ev.Node, ev.CausationID, ev.Schema, unixNano(ev.Time), ev.UserID,
				string(headers), bodyJSON, bodyRaw, unixNano(ev.Arrived), ev.Redelivered, ev.Malformed, s.head, hash, offset)
			if err != nil {
				return added, fmt.Errorf("add %s to the audit log: %w", ev.ID, err)
			}
			if n, _ := res.RowsAffected(); n > 0 { // a duplicate id is no row, and no link
				added[i]++
				s.head = hash
			}
		}
		if len(r.fates) > 0 {
			if err := insertFates(tx, r.fates); err != nil {
				return added, err
			}
		}
		if r.history {
			if err := setMeta(tx, metaHistoryNext, r.next); err != nil {
				return added, fmt.Errorf("add to the audit log: record the history position %d: %w", r.next, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return added, fmt.Errorf("add to the audit log: commit: %w", err)
	}
	return added, nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

const columns = `seq, id, type, source, node, causation_id, schema_ver, time_ns, user_id, headers, body_json, body_raw, arrived_ns, redelivered, malformed, hash, stream_offset`

func scanEvent(row interface{ Scan(...any) error }) (Event, error) {
	var ev Event
	var timeNS, arrivedNS int64
	var headers string
	var bodyJSON sql.NullString
	var bodyRaw, hash []byte
	var offset sql.NullInt64
	if err := row.Scan(&ev.Seq, &ev.ID, &ev.Type, &ev.Source, &ev.Node, &ev.CausationID, &ev.Schema, &timeNS, &ev.UserID,
		&headers, &bodyJSON, &bodyRaw, &arrivedNS, &ev.Redelivered, &ev.Malformed, &hash, &offset); err != nil {
		return ev, err
	}
	ev.Time, ev.Arrived = fromUnixNano(timeNS), fromUnixNano(arrivedNS)
	if err := json.Unmarshal([]byte(headers), &ev.Headers); err != nil {
		return ev, fmt.Errorf("event %s: stored headers: %w", ev.ID, err)
	}
	ev.Body = storedBody(bodyJSON, bodyRaw)
	if hash != nil {
		ev.Hash = hex.EncodeToString(hash)
	}
	if offset.Valid {
		ev.Offset = &offset.Int64
	}
	return ev, nil
}

// storedBody is the body a row holds: its JSON text when it has one, its
// raw bytes otherwise.
func storedBody(bodyJSON sql.NullString, bodyRaw []byte) []byte {
	if bodyJSON.Valid {
		return []byte(bodyJSON.String)
	}
	return bodyRaw
}

// Get returns the event with that id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Event, error) {
	ev, err := scanEvent(s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM events WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return ev, fmt.Errorf("event %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return ev, err
	}
	evs := []Event{ev}
	err = s.withFates(ctx, evs)
	return evs[0], err
}

// Filter selects events. Every set field must hold (AND); within a list,
// any value may match (OR); Any adds alternatives: when it is not empty,
// at least one of its filters must hold too.
type Filter struct {
	// From and To bound the emit time (x-time): From <= time < To. Zero
	// leaves that side open.
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
	// Types are AMQP topic patterns of the event type ("module.umami.#").
	Types []string `json:"types,omitempty"`
	// Sources, Nodes, UserIDs, IDs and CausationIDs match exactly.
	Sources      []string `json:"sources,omitempty"`
	Nodes        []string `json:"nodes,omitempty"`
	UserIDs      []string `json:"user_ids,omitempty"`
	IDs          []string `json:"ids,omitempty"`
	CausationIDs []string `json:"causation_ids,omitempty"`
	// Headers match headers by name, exactly.
	Headers map[string]string `json:"headers,omitempty"`
	// Body matches fields of a JSON body by path ("order.id", "items.0")
	// to a JSON value (`42`, `"gold"`, `true`).
	Body map[string]string `json:"body,omitempty"`
	// Malformed selects only events that break the contract (true) or
	// only those that keep it (false); nil selects both.
	Malformed *bool `json:"malformed,omitempty"`
	// Dead selects only events some queue dead-lettered (true) or only
	// those none did (false); nil selects both.
	Dead *bool `json:"dead,omitempty"`
	// UpTo, when not 0, selects only events stored up to that Seq: a
	// cutoff (a replay's) that what arrives later never passes.
	UpTo int64 `json:"up_to,omitempty"`
	// Any lists alternatives, at least one of which must hold.
	Any []Filter `json:"any,omitempty"`
}

// where renders f as an SQL condition with its arguments.
func (f Filter) where() (string, []any, error) {
	var conds []string
	var args []any
	if !f.From.IsZero() {
		conds, args = append(conds, "time_ns >= ?"), append(args, f.From.UnixNano())
	}
	if !f.To.IsZero() {
		conds, args = append(conds, "time_ns < ?"), append(args, f.To.UnixNano())
	}
	in := func(column string, values []string) {
		if len(values) == 0 {
			return
		}
		conds = append(conds, column+" IN ("+strings.TrimSuffix(strings.Repeat("?,", len(values)), ",")+")")
		for _, v := range values {
			args = append(args, v)
		}
	}
	in("source", f.Sources)
	in("node", f.Nodes)
	in("user_id", f.UserIDs)
	in("id", f.IDs)
	in("causation_id", f.CausationIDs)
	if len(f.Types) > 0 {
		var or []string
		for _, p := range f.Types {
			if err := checkPattern(p); err != nil {
				return "", nil, fmt.Errorf("%w: %v", ErrBadFilter, err)
			}
			or, args = append(or, "mesh_topic_match(?, type)"), append(args, p)
		}
		conds = append(conds, "("+strings.Join(or, " OR ")+")")
	}
	for name, value := range f.Headers {
		conds, args = append(conds, "json_extract(headers, ?) = ?"), append(args, jsonPathOfKey(name), value)
	}
	for path, value := range f.Body {
		if !json.Valid([]byte(value)) {
			return "", nil, fmt.Errorf("%w: body filter %s: %q is not a JSON value", ErrBadFilter, path, value)
		}
		p, err := jsonPath(path)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrBadFilter, err)
		}
		conds = append(conds, "(body_json IS NOT NULL AND json_extract(body_json, ?) IS json_extract(?, '$'))")
		args = append(args, p, value)
	}
	if f.Malformed != nil {
		if *f.Malformed {
			conds = append(conds, "malformed != ''")
		} else {
			conds = append(conds, "malformed = ''")
		}
	}
	if f.Dead != nil {
		exists := "EXISTS (SELECT 1 FROM fates WHERE fates.event_id = events.id AND fates.kind = 'dead')"
		if !*f.Dead {
			exists = "NOT " + exists
		}
		conds = append(conds, exists)
	}
	if f.UpTo != 0 {
		conds, args = append(conds, "seq <= ?"), append(args, f.UpTo)
	}
	if len(f.Any) > 0 {
		var or []string
		for _, sub := range f.Any {
			w, a, err := sub.where()
			if err != nil {
				return "", nil, err
			}
			or, args = append(or, "("+w+")"), append(args, a...)
		}
		conds = append(conds, "("+strings.Join(or, " OR ")+")")
	}
	if len(conds) == 0 {
		return "1", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

// jsonPathOfKey is the JSON path of an object member named key.
func jsonPathOfKey(key string) string {
	return `$."` + strings.ReplaceAll(strings.ReplaceAll(key, `\`, `\\`), `"`, `\"`) + `"`
}

// jsonPath turns a dotted path ("order.items.0.sku") into a JSON path:
// numeric words index arrays, others name members.
func jsonPath(dotted string) (string, error) {
	if dotted == "" {
		return "", errors.New("body filter: empty path")
	}
	var b strings.Builder
	b.WriteString("$")
	for _, word := range strings.Split(dotted, ".") {
		if word == "" {
			return "", fmt.Errorf("body filter %q: empty word", dotted)
		}
		if strings.Trim(word, "0123456789") == "" {
			b.WriteString("[" + word + "]")
			continue
		}
		b.WriteString(strings.TrimPrefix(jsonPathOfKey(word), "$"))
	}
	return b.String(), nil
}

// Page is a window of results in order of arrival: the events after the
// cursor (a Seq; 0 starts at the beginning), at most Limit of them.
type Page struct {
	After int64 `json:"after,omitempty"`
	Limit int   `json:"limit,omitempty"`
	// Newest pages from the newest event back: After is then the cursor
	// below which the page starts (0: the newest). A logger of v0.1.0
	// ignores it and pages oldest first.
	Newest bool `json:"newest,omitempty"`
}

// MaxPage bounds a page, so that memory stays bounded whatever the store
// holds.
const MaxPage = 1000

// Query returns a page of the events f selects, in order of arrival (or
// newest first, with p.Newest), and the cursor of the next page (0 when
// there is none).
func (s *Store) Query(ctx context.Context, f Filter, p Page) (events []Event, next int64, err error) {
	if p.Limit <= 0 || p.Limit > MaxPage {
		p.Limit = MaxPage
	}
	where, args, err := f.where()
	if err != nil {
		return nil, 0, fmt.Errorf("query the audit log: %w", err)
	}
	page := ` AND seq > ? ORDER BY seq LIMIT ?`
	args = append(args, p.After, p.Limit+1)
	if p.Newest {
		page = ` AND seq < ? ORDER BY seq DESC LIMIT ?`
		if p.After <= 0 {
			args[len(args)-2] = int64(math.MaxInt64)
		}
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM events WHERE `+where+page, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("query the audit log: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("query the audit log: %w", err)
		}
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("query the audit log: %w", err)
	}
	if len(events) > p.Limit {
		events = events[:p.Limit]
		next = events[len(events)-1].Seq
	}
	if err := s.withFates(ctx, events); err != nil {
		return nil, 0, fmt.Errorf("query the audit log: %w", err)
	}
	return events, next, nil
}

// Count returns how many events f selects.
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	where, args, err := f.where()
	if err != nil {
		return 0, fmt.Errorf("count in the audit log: %w", err)
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM events WHERE `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count in the audit log: %w", err)
	}
	return n, nil
}

// Stats describe what the store holds.
type Stats struct {
	// Events and Malformed count the rows, all and flagged.
	Events    int64 `json:"events"`
	Malformed int64 `json:"malformed"`
	// Bytes is the database's size.
	Bytes int64 `json:"bytes"`
	// DeadLetters and Replayed count the fates recorded: dead letters,
	// and events sent again by a replay.
	DeadLetters int64 `json:"dead_letters"`
	Replayed    int64 `json:"replayed"`
	// LastSeq is the Seq of the newest event: a replay's cutoff.
	LastSeq int64 `json:"last_seq"`
	// OldestArrived and NewestArrived bound the arrival times held.
	OldestArrived time.Time `json:"oldest_arrived,omitzero"`
	NewestArrived time.Time `json:"newest_arrived,omitzero"`
}

// Stats counts the rows and bytes the store holds, and its oldest and
// newest arrivals.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest, newest sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(malformed != ''), 0),
		(SELECT arrived_ns FROM events ORDER BY seq LIMIT 1), (SELECT arrived_ns FROM events ORDER BY seq DESC LIMIT 1) FROM events`).
		Scan(&st.Events, &st.Malformed, &oldest, &newest)
	if err != nil {
		return st, fmt.Errorf("audit log stats: %w", err)
	}
	st.OldestArrived, st.NewestArrived = fromUnixNano(oldest.Int64), fromUnixNano(newest.Int64)
	if err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0), (SELECT count(*) FROM fates WHERE kind = 'dead'),
		(SELECT count(*) FROM fates WHERE kind = 'replayed') FROM events`).Scan(&st.LastSeq, &st.DeadLetters, &st.Replayed); err != nil {
		return st, fmt.Errorf("audit log stats: %w", err)
	}
	var pages, pageSize int64
	if err := s.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return st, fmt.Errorf("audit log stats: %w", err)
	}
	if err := s.db.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		return st, fmt.Errorf("audit log stats: %w", err)
	}
	st.Bytes = pages * pageSize
	return st, nil
}
