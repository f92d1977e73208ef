package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// The hash chain. Every row the store inserts holds prev, the hash of the
// row inserted before it, and hash, ChainHash(prev, event): a row changed,
// inserted, deleted or moved after it was written breaks a link that
// Verify finds. The chain covers what two audit loggers reading the same
// events in the same order store alike, and not where or when each got
// them: the arrival time, the redelivered flag and the stream offset are
// outside it.
//
// What the chain alone cannot show: rows taken from its end, rows added at
// its end with hashes computed to fit, the oldest rows deleted with the
// anchor moved as retention moves it, or the whole log rewritten. A Head
// recorded outside the store (a checkpoint) shows those.

// chainDomain opens what every link hashes, so that a chain hash is never
// taken for another hash of the same bytes.
const chainDomain = "mesh-audit-chain-v1\n"

// Genesis is the prev of the first row of a chain that no retention has
// cut: 32 zero bytes. It returns a new slice each time.
func Genesis() []byte { return make([]byte, sha256.Size) }

// ChainHash is the hash of a row of the chain whose previous row's hash is
// prev (Genesis, or nil, for the first row): SHA-256 over
// "mesh-audit-chain-v1\n", prev, then each of these fields as an unsigned
// 64-bit big-endian length and its bytes: ID, Type, UserID, Malformed, the
// headers as JSON (json.Marshal of the map, keys sorted, "{}" when there
// are none) and the body.
//
// It is the same for an event as given to Add and as Get reads it back:
// the body reads back byte for byte (JSON or not; a nil and an empty body
// both hash as no bytes), and headers with text that is not UTF-8 hash as
// they read back, with each bad byte replaced by U+FFFD (encoding/json's
// rule). Seq, Hash, Offset, Arrived, Redelivered, Fates and the fields the
// headers hold again (Source, Node, CausationID, Schema, Time) are not
// covered.
func ChainHash(prev []byte, ev Event) []byte {
	return chainHash(prev, ev, canonicalHeaders(ev.Headers))
}

// chainHash is ChainHash with the headers already as canonicalHeaders
// renders them.
func chainHash(prev []byte, ev Event, headers []byte) []byte {
	h := sha256.New()
	writeChainInput(h, prev, ev, headers)
	return h.Sum(nil)
}

// writeChainInput writes what ChainHash hashes to w: a hash, or a buffer
// in a test, neither of which fails a write.
func writeChainInput(w io.Writer, prev []byte, ev Event, headers []byte) {
	if len(prev) == 0 {
		prev = Genesis()
	}
	io.WriteString(w, chainDomain)
	w.Write(prev)
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		w.Write(n[:])
		w.Write(b)
	}
	str := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		w.Write(n[:])
		io.WriteString(w, s)
	}
	num := func(v int64) {
		binary.BigEndian.PutUint64(n[:], uint64(v))
		w.Write(n[:])
	}
	str(ev.ID)
	str(ev.Type)
	// The columns queries select on, each as the store keeps it, so an
	// edit of one shows though the headers still say the truth.
	str(ev.Source)
	str(ev.Node)
	str(ev.CausationID)
	str(ev.Schema)
	num(unixNano(ev.Time))
	str(ev.UserID)
	str(ev.Malformed)
	if ev.Offset != nil {
		num(1)
		num(*ev.Offset)
	} else {
		num(0)
	}
	field(headers)
	field(ev.Body)
}

// canonicalHeaders is the headers as the store keeps them and the chain
// covers them: json.Marshal of the map (keys sorted), "{}" when there are
// none. Headers with text that is not UTF-8 go through JSON and back
// first, as they read back, so that what is stored marshals to itself.
func canonicalHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return []byte("{}")
	}
	b, _ := json.Marshal(h) // a map of strings always marshals
	for k, v := range h {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			var back map[string]string
			if err := json.Unmarshal(b, &back); err != nil {
				return b // json.Marshal's output always reads back
			}
			b, _ = json.Marshal(back)
			break
		}
	}
	return b
}

// The keys of the meta table.
const (
	// metaChainAnchor is the hash of the newest row retention deleted: the
	// prev of the first row left.
	metaChainAnchor = "chain_anchor"
	// metaHistoryNext is the offset of the next history stream message to
	// read (AddHistory).
	metaHistoryNext = "history_next"
	// metaUnchainedUpTo is the highest seq a row stored before the store
	// chained its rows may have: a row above it without a hash was put
	// there afterwards.
	metaUnchainedUpTo = "unchained_up_to"
)

// execer is a *sql.DB or *sql.Tx.
type execer interface {
	Exec(query string, args ...any) (sql.Result, error)
}

// querier is a *sql.DB or *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// setMeta records value under key.
func setMeta(x execer, key string, value any) error {
	_, err := x.Exec(`INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

// getMeta reads the value under key into dest; ok is false when there is
// none.
func getMeta(ctx context.Context, q querier, key string, dest any) (ok bool, err error) {
	err = q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(dest)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	return true, nil
}

// anchor is the prev the chain's first row must have: the anchor
// retention recorded, or Genesis.
func anchor(ctx context.Context, q querier) ([]byte, error) {
	var a []byte
	ok, err := getMeta(ctx, q, metaChainAnchor, &a)
	if err != nil {
		return nil, fmt.Errorf("the chain's anchor: %w", err)
	}
	if !ok || len(a) == 0 {
		return Genesis(), nil
	}
	return a, nil
}

// migrate creates the schema, or brings a database made before the hash
// chain up to it, in one transaction: the events table gains hash, prev
// and stream_offset (NULL in the rows it held), and meta records the
// highest seq those rows have.
func migrate(db *sql.DB) (err error) {
	tx, err := db.Begin()
	if err != nil {
		return fmt.Errorf("create schema: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// A database a later release wrote is refused before anything in it
	// changes (a rollback must not leave the chain for the later release to
	// misread as tampering).
	if err := checkFormat(tx); err != nil {
		return err
	}
	if _, err := tx.Exec(schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	have, err := eventColumns(tx)
	if err != nil {
		return fmt.Errorf("upgrade schema: %w", err)
	}
	for _, c := range []struct{ name, decl string }{{"hash", "BLOB"}, {"prev", "BLOB"}, {"stream_offset", "INTEGER"}} {
		if have[c.name] {
			continue
		}
		if _, err := tx.Exec(`ALTER TABLE events ADD COLUMN ` + c.name + ` ` + c.decl); err != nil {
			return fmt.Errorf("upgrade schema: add column events.%s: %w", c.name, err)
		}
	}
	var upTo int64
	ok, err := getMeta(context.Background(), tx, metaUnchainedUpTo, &upTo)
	if err != nil {
		return fmt.Errorf("upgrade schema: %w", err)
	}
	if !ok {
		// The rows before the first chained one predate the chain: all of
		// them when the columns were just added, none in a new database.
		if err := tx.QueryRow(`SELECT coalesce((SELECT seq FROM events WHERE hash IS NOT NULL ORDER BY seq LIMIT 1) - 1,
			(SELECT max(seq) FROM events), 0)`).Scan(&upTo); err != nil {
			return fmt.Errorf("upgrade schema: rows before the chain: %w", err)
		}
		if err := setMeta(tx, metaUnchainedUpTo, upTo); err != nil {
			return fmt.Errorf("upgrade schema: record %s: %w", metaUnchainedUpTo, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create schema: commit: %w", err)
	}
	return nil
}

// eventColumns names the columns of the events table.
func eventColumns(tx *sql.Tx) (map[string]bool, error) {
	rows, err := tx.Query(`PRAGMA table_info(events)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var cid, notNull, pk int
		var name, typ string
		var dflt sql.NullString
		if err := rows.Scan(&cid, &name, &typ, &notNull, &dflt, &pk); err != nil {
			return nil, err
		}
		have[name] = true
	}
	return have, rows.Err()
}

// loadHead is the prev of the next row: the hash of the newest chained
// row, else the anchor, else Genesis.
func loadHead(db *sql.DB) ([]byte, error) {
	ctx := context.Background()
	var h []byte
	err := db.QueryRowContext(ctx, `SELECT hash FROM events WHERE hash IS NOT NULL ORDER BY seq DESC LIMIT 1`).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		return anchor(ctx, db)
	}
	if err != nil {
		return nil, fmt.Errorf("the chain's head: %w", err)
	}
	return h, nil
}

// Head is the newest row of the chain.
type Head struct {
	// Seq and ID are the row's (0 and "" when the chain has no row).
	Seq int64  `json:"seq"`
	ID  string `json:"id"`
	// Hash is the row's hash in hex; with no row, the anchor retention
	// recorded, or Genesis.
	Hash string `json:"hash"`
	// Rows counts the rows from the chain's first row up to this one: in
	// a log that verifies, the chained rows.
	Rows int64 `json:"rows"`
}

// Head returns the newest row of the chain, from one snapshot of the
// store. Recorded elsewhere, it is a checkpoint: while retention has not
// taken its row, HashOf(its ID) must still return its Hash, and Verify
// must still reach it; otherwise rows were removed from the end or the log
// rewritten. Rows is a count, which takes time in proportion to the rows
// held.
func (s *Store) Head(ctx context.Context) (Head, error) {
	var h Head
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return h, fmt.Errorf("the audit log's head: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var hash []byte
	err = tx.QueryRowContext(ctx, `SELECT seq, id, hash FROM events WHERE hash IS NOT NULL ORDER BY seq DESC LIMIT 1`).Scan(&h.Seq, &h.ID, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		a, err := anchor(ctx, tx)
		if err != nil {
			return h, fmt.Errorf("the audit log's head: %w", err)
		}
		h.Hash = hex.EncodeToString(a)
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("the audit log's head: %w", err)
	}
	h.Hash = hex.EncodeToString(hash)
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM events
		WHERE seq >= (SELECT seq FROM events WHERE hash IS NOT NULL ORDER BY seq LIMIT 1) AND seq <= ?`, h.Seq).Scan(&h.Rows); err != nil {
		return h, fmt.Errorf("the audit log's head: %w", err)
	}
	return h, nil
}

// HashOf returns the hash of the event id's row, in hex: ErrNotFound when
// the store does not hold it, ErrUnchained when the row was stored before
// the store chained its rows.
func (s *Store) HashOf(ctx context.Context, id string) (string, error) {
	var hash []byte
	err := s.db.QueryRowContext(ctx, `SELECT hash FROM events WHERE id = ?`, id).Scan(&hash)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("hash of %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("hash of %s: %w", id, err)
	}
	if hash == nil {
		return "", fmt.Errorf("hash of %s: %w", id, ErrUnchained)
	}
	return hex.EncodeToString(hash), nil
}

// The kinds of Problem.
const (
	// ProblemChanged: a row is not what was stored (its content, or its
	// hash, was edited).
	ProblemChanged = "changed"
	// ProblemInserted: a row was put into the chain after it was written.
	ProblemInserted = "inserted"
	// ProblemDeleted: rows are missing before a row.
	ProblemDeleted = "deleted"
	// ProblemReordered: rows are out of the order they were stored in.
	ProblemReordered = "reordered"
)

// Problem is where the chain first breaks.
type Problem struct {
	// Seq and ID name the row where it breaks.
	Seq int64  `json:"seq"`
	ID  string `json:"id"`
	// Kind is ProblemChanged, ProblemInserted, ProblemDeleted or
	// ProblemReordered.
	Kind string `json:"kind"`
	// Detail says what was found, for an auditor.
	Detail string `json:"detail"`
}

// Report is what Verify found.
type Report struct {
	// Rows counts the chained rows verified (up to the problem, if any).
	Rows int64 `json:"rows"`
	// Unchained counts the rows stored before the store chained its rows,
	// which the chain does not cover.
	Unchained int64 `json:"unchained"`
	// Head is the last row verified.
	Head Head `json:"head"`
	// Problem is where the chain first breaks; nil when it holds.
	Problem *Problem `json:"problem,omitempty"`
}

// Verify walks every row in order of seq, in one snapshot of the store
// (writes go on meanwhile), holding two rows at a time whatever the store
// holds, and checks that each links to the one before it (the first to the
// anchor retention recorded, or Genesis), that its hash is ChainHash of its
// content, and that stream offsets, where rows have them, only increase.
// Rows stored before the store chained its rows may only come first. It
// stops at the first problem; an error is for a store it could not read.
//
// Verify does not show what the chain alone cannot (see Head): compare
// its Head with a checkpoint for that. While it runs, its snapshot keeps
// the write-ahead log from being checkpointed past it.
func (s *Store) Verify(ctx context.Context) (Report, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return Report{}, fmt.Errorf("verify the audit log: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	v := verifier{}
	if v.expected, err = anchor(ctx, tx); err != nil {
		return Report{}, fmt.Errorf("verify the audit log: %w", err)
	}
	v.head.Hash = hex.EncodeToString(v.expected)
	if v.boundKnown, err = getMeta(ctx, tx, metaUnchainedUpTo, &v.unchainedUpTo); err != nil {
		return Report{}, fmt.Errorf("verify the audit log: %w", err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, id, type, source, node, causation_id, schema_ver, time_ns, user_id, malformed,
		headers, body_json, body_raw, hash, prev, stream_offset FROM events ORDER BY seq`)
	if err != nil {
		return Report{}, fmt.Errorf("verify the audit log: %w", err)
	}
	defer rows.Close()
	var cur *chainRow
	for rows.Next() {
		next, err := scanChainRow(rows)
		if err != nil {
			return v.report(), fmt.Errorf("verify the audit log: %w", err)
		}
		if cur != nil && v.step(cur, next) {
			return v.report(), nil
		}
		cur = next
	}
	if err := rows.Err(); err != nil {
		return v.report(), fmt.Errorf("verify the audit log: %w", err)
	}
	if cur != nil {
		v.step(cur, nil)
	}
	return v.report(), nil
}

// chainRow is what Verify reads of a row.
type chainRow struct {
	seq        int64
	ev         Event // what ChainHash covers
	headersOK  bool  // the stored headers are a JSON object of strings
	hash, prev []byte
	offset     sql.NullInt64
}

func scanChainRow(rows *sql.Rows) (*chainRow, error) {
	var r chainRow
	var headers string
	var bodyJSON sql.NullString
	var bodyRaw []byte
	var timeNS int64
	if err := rows.Scan(&r.seq, &r.ev.ID, &r.ev.Type, &r.ev.Source, &r.ev.Node, &r.ev.CausationID, &r.ev.Schema, &timeNS,
		&r.ev.UserID, &r.ev.Malformed, &headers, &bodyJSON, &bodyRaw, &r.hash, &r.prev, &r.offset); err != nil {
		return nil, err
	}
	r.ev.Time = fromUnixNano(timeNS)
	if r.offset.Valid {
		r.ev.Offset = &r.offset.Int64
	}
	r.headersOK = json.Unmarshal([]byte(headers), &r.ev.Headers) == nil
	r.ev.Body = storedBody(bodyJSON, bodyRaw)
	return &r, nil
}

// verifier is Verify's walk.
type verifier struct {
	// expected is the prev the next chained row must have.
	expected []byte
	// head is the newest row accepted, lastPrev its prev, and before the
	// row accepted before it.
	head, before Head
	lastPrev     []byte
	started      bool // a chained row was accepted
	// unchainedUpTo bounds the seq of a row without a hash, when known
	// (seq starts at 1: AUTOINCREMENT never gives 0 or less).
	unchainedUpTo int64
	boundKnown    bool
	// lastOffset is the stream offset of the newest accepted row with one.
	lastOffset    sql.NullInt64
	lastOffsetSeq int64

	rows, unchained int64
	problem         *Problem
}

func (v *verifier) report() Report {
	h := v.head
	h.Rows = v.rows
	return Report{Rows: v.rows, Unchained: v.unchained, Head: h, Problem: v.problem}
}

// step checks row r, n being the row after it (nil for the last), and
// reports whether it found a problem.
func (v *verifier) step(r, n *chainRow) bool {
	if r.hash == nil && r.prev == nil && !v.started && r.seq >= 1 && (!v.boundKnown || r.seq <= v.unchainedUpTo) {
		if !v.checkOffset(r) {
			return true
		}
		v.unchained++
		return false
	}
	linkOK := bytes.Equal(r.prev, v.expected)
	contentOK := r.hash != nil && r.prev != nil && r.headersOK && bytes.Equal(ChainHash(r.prev, r.ev), r.hash)
	if linkOK && contentOK {
		if !v.checkOffset(r) {
			return true
		}
		v.before, v.lastPrev = v.head, r.prev
		v.head = Head{Seq: r.seq, ID: r.ev.ID, Hash: hex.EncodeToString(r.hash)}
		v.expected, v.started = r.hash, true
		v.rows++
		return false
	}
	at := func(kind, detail string, args ...any) bool {
		v.problem = &Problem{Seq: r.seq, ID: r.ev.ID, Kind: kind, Detail: fmt.Sprintf(detail, args...)}
		return true
	}
	switch {
	case n != nil && n.hash != nil && bytes.Equal(r.prev, n.hash) && bytes.Equal(n.prev, v.expected):
		return at(ProblemReordered, "rows seq %d (id %s) and seq %d (id %s) are out of order: each links to the other's place in the chain, so they were swapped",
			r.seq, r.ev.ID, n.seq, n.ev.ID)
	case n != nil && bytes.Equal(n.prev, v.expected):
		return at(ProblemInserted, "row seq %d (id %s) does not belong to the chain: the row after it (seq %d, id %s) links to %s, so it was inserted",
			r.seq, r.ev.ID, n.seq, n.ev.ID, v.place())
	case v.started && contentOK && bytes.Equal(r.prev, v.lastPrev):
		// r links past the row before it, which fitted: that row is the
		// one that does not belong, inserted with a hash computed to fit.
		p := v.head
		v.problem = &Problem{Seq: p.Seq, ID: p.ID, Kind: ProblemInserted, Detail: fmt.Sprintf(
			"row seq %d (id %s) does not belong to the chain: the row after it (seq %d, id %s) links to the row before it, so it was inserted with a hash computed to fit",
			p.Seq, p.ID, r.seq, r.ev.ID)}
		v.head, v.rows = v.before, v.rows-1
		return true
	case !linkOK && contentOK:
		return at(ProblemDeleted, "the chain breaks before row seq %d (id %s): the row's own hash verifies, but it links to a row that is not here, "+
			"so rows are missing between %s and it; or the row before it was changed and its hash recomputed to fit (only a checkpoint tells those apart)",
			r.seq, r.ev.ID, v.place())
	case r.hash == nil && linkOK:
		return at(ProblemChanged, "row seq %d (id %s) links to %s but its hash was erased", r.seq, r.ev.ID, v.place())
	case r.hash == nil:
		return at(ProblemInserted, "row seq %d (id %s) has no hash, yet it comes after the chain began (rows stored before it may only come first): it was inserted",
			r.seq, r.ev.ID)
	case !r.headersOK:
		return at(ProblemChanged, "row seq %d (id %s) is not what was stored: its headers are no longer a JSON object of strings", r.seq, r.ev.ID)
	default:
		return at(ProblemChanged, "row seq %d (id %s) is not what was stored: its content (id, type, source, node, causation, schema, time, user id, malformed, offset, headers or body) "+
			"no longer matches its hash, or its hash or link was edited", r.seq, r.ev.ID)
	}
}

// place names the row the next row must link to.
func (v *verifier) place() string {
	if !v.started {
		return "the start of the chain"
	}
	return fmt.Sprintf("row seq %d (id %s)", v.head.Seq, v.head.ID)
}

// checkOffset checks that r's stream offset, if it has one, is above the
// last one seen, and reports whether it is.
func (v *verifier) checkOffset(r *chainRow) bool {
	if !r.offset.Valid {
		return true
	}
	switch {
	case v.lastOffset.Valid && r.offset.Int64 < v.lastOffset.Int64:
		v.problem = &Problem{Seq: r.seq, ID: r.ev.ID, Kind: ProblemReordered, Detail: fmt.Sprintf(
			"row seq %d (id %s) has history stream offset %d, below offset %d of row seq %d before it: the stream is stored in order, "+
				"so rows were reordered (their hashes recomputed to fit) or an offset was edited",
			r.seq, r.ev.ID, r.offset.Int64, v.lastOffset.Int64, v.lastOffsetSeq)}
		return false
	case v.lastOffset.Valid && r.offset.Int64 == v.lastOffset.Int64:
		v.problem = &Problem{Seq: r.seq, ID: r.ev.ID, Kind: ProblemChanged, Detail: fmt.Sprintf(
			"row seq %d (id %s) has the same history stream offset %d as row seq %d before it: a stream message is one event, so an offset was edited",
			r.seq, r.ev.ID, r.offset.Int64, v.lastOffsetSeq)}
		return false
	}
	v.lastOffset, v.lastOffsetSeq = r.offset, r.seq
	return true
}
