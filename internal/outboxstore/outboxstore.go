// Package outboxstore keeps a module's outbox and inbox in the module's own
// database (docs/adr/0044-exactly-once-effects-outbox-and-inbox.md): the
// tables, their format, and the statements on them, for SQLite (modernc)
// and PostgreSQL (pgx's database/sql driver). It knows nothing of the mesh:
// the sdk's outbox package writes rows in the caller's transaction,
// relays them and records handled ids through it.
//
// The tables:
//
//   - mesh_outbox_meta: the format of the tables (a newer one is refused,
//     never misread: ADR 42's rule) and the outbox's epoch, a random value
//     made with the tables, from which the ids of rows written outside a
//     handling derive;
//   - mesh_outbox: one row per event to send, in the order of the
//     sequence; sent_at is set once the broker confirmed it, failed
//     once the host refused it for good;
//   - mesh_outbox_relay: which relay holds the outbox (Lease), when
//     several processes share the database;
//   - mesh_inbox: one row per handled event id (or tool request id), with
//     the digest of what was handled and, for a tool, its decision.
//
// Order: SQLite serialises writers, so the sequence is commit order.
// PostgreSQL does not: a row with a lower sequence can commit after one
// with a higher. Each row there keeps the id of the transaction that
// wrote it, and Pending returns only rows whose transaction is older than
// every transaction still running, so a row is never sent before one that
// commits earlier in sequence.
package outboxstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Dialect is the SQL of a database.
type Dialect int

// The databases the store speaks.
const (
	SQLite Dialect = iota + 1
	PostgreSQL
)

// FormatVersion is the format of the tables this release writes.
const FormatVersion = 1

// ErrNewerFormat is returned by Open for tables of a newer format than
// FormatVersion (a later release's, before a rollback).
var ErrNewerFormat = errors.New("the outbox tables are of a newer format")

// Store is a module's outbox and inbox in its database.
type Store struct {
	db      *sql.DB
	dialect Dialect
	epoch   string
}

// Open makes the tables in db if they are missing, checks their format,
// and returns the store.
func Open(ctx context.Context, db *sql.DB, dialect Dialect) (*Store, error) {
	if dialect != SQLite && dialect != PostgreSQL {
		return nil, fmt.Errorf("outboxstore: unknown dialect %d", dialect)
	}
	s := &Store{db: db, dialect: dialect}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outboxstore: begin: %w", err)
	}
	defer tx.Rollback()
	for _, stmt := range s.schema() {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("outboxstore: make the tables: %w", err)
		}
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	for _, kv := range [][2]string{{"format", strconv.Itoa(FormatVersion)}, {"epoch", hex.EncodeToString(b[:])}} {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO mesh_outbox_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`), kv[0], kv[1]); err != nil {
			return nil, fmt.Errorf("outboxstore: meta: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO mesh_outbox_relay (id) VALUES (1) ON CONFLICT (id) DO NOTHING`); err != nil {
		return nil, fmt.Errorf("outboxstore: relay lease: %w", err)
	}
	var format string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT value FROM mesh_outbox_meta WHERE key = ?`), "format").Scan(&format); err != nil {
		return nil, fmt.Errorf("outboxstore: read the format: %w", err)
	}
	if v, err := strconv.Atoi(format); err != nil || v > FormatVersion {
		return nil, fmt.Errorf("%w: %s, this release reads %d (a later release wrote them: run that release, or restore the database it had before)", ErrNewerFormat, format, FormatVersion)
	}
	if err := tx.QueryRowContext(ctx, s.q(`SELECT value FROM mesh_outbox_meta WHERE key = ?`), "epoch").Scan(&s.epoch); err != nil {
		return nil, fmt.Errorf("outboxstore: read the epoch: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outboxstore: commit: %w", err)
	}
	return s, nil
}

// schema are the statements that make the tables.
func (s *Store) schema() []string {
	if s.dialect == PostgreSQL {
		return []string{
			`CREATE TABLE IF NOT EXISTS mesh_outbox_meta (key text PRIMARY KEY, value text NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS mesh_outbox (
				seq bigserial PRIMARY KEY,
				id text NOT NULL UNIQUE,
				type text NOT NULL,
				body bytea NOT NULL,
				options text NOT NULL DEFAULT '{}',
				written_at bigint NOT NULL,
				xact xid8 NOT NULL DEFAULT pg_current_xact_id(),
				sent_at bigint,
				failed text)`,
			`CREATE INDEX IF NOT EXISTS mesh_outbox_unsent ON mesh_outbox (seq) WHERE sent_at IS NULL AND failed IS NULL`,
			`CREATE TABLE IF NOT EXISTS mesh_outbox_relay (
				id integer PRIMARY KEY CHECK (id = 1),
				holder text NOT NULL DEFAULT '',
				until bigint NOT NULL DEFAULT 0)`,
			`CREATE TABLE IF NOT EXISTS mesh_inbox (
				id text PRIMARY KEY,
				digest text NOT NULL,
				recorded_at bigint NOT NULL,
				decision bytea)`,
		}
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS mesh_outbox_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS mesh_outbox (
			seq INTEGER PRIMARY KEY AUTOINCREMENT,
			id TEXT NOT NULL UNIQUE,
			type TEXT NOT NULL,
			body BLOB NOT NULL,
			options TEXT NOT NULL DEFAULT '{}',
			written_at INTEGER NOT NULL,
			sent_at INTEGER,
			failed TEXT)`,
		`CREATE INDEX IF NOT EXISTS mesh_outbox_unsent ON mesh_outbox (seq) WHERE sent_at IS NULL AND failed IS NULL`,
		`CREATE TABLE IF NOT EXISTS mesh_outbox_relay (
			id INTEGER PRIMARY KEY CHECK (id = 1),
			holder TEXT NOT NULL DEFAULT '',
			until INTEGER NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS mesh_inbox (
			id TEXT PRIMARY KEY,
			digest TEXT NOT NULL,
			recorded_at INTEGER NOT NULL,
			decision BLOB)`,
	}
}

// q is stmt with its ? placeholders as the dialect writes them.
func (s *Store) q(stmt string) string {
	if s.dialect != PostgreSQL {
		return stmt
	}
	var b strings.Builder
	n := 0
	for _, r := range stmt {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Epoch is the outbox's epoch, made with its tables.
func (s *Store) Epoch() string { return s.epoch }

// Row is one event of the outbox.
type Row struct {
	Seq       int64
	ID        string
	Type      string // the full event type
	Body      []byte
	Options   Options
	WrittenAt time.Time
}

// Options are what a row keeps of its emit besides the type and body: the
// emit's options, its cause, and the ref its id derives from
// (causation.OutboxRef). They are stored as a JSON object.
type Options struct {
	Schema       string `json:"schema,omitempty"`
	TTLMillis    int64  `json:"ttl_ms,omitempty"`
	Priority     *uint8 `json:"priority,omitempty"`
	AtUnixMillis int64  `json:"at_ms,omitempty"` // a delay, as the time it comes due
	Cause        string `json:"cause,omitempty"`
	Scope        string `json:"scope"`
	N            uint64 `json:"n"`
	IDUnixMillis int64  `json:"id_ms"`
}

// MaxOptionsBytes bounds a row's stored options: more is not a row this
// package wrote.
const MaxOptionsBytes = 4096

// DecodeOptions reads a row's stored options, refusing what this
// package would not have written: not one JSON object of the known keys,
// over MaxOptionsBytes, or values out of range.
func DecodeOptions(raw []byte) (Options, error) {
	var o Options
	if len(raw) > MaxOptionsBytes {
		return o, fmt.Errorf("outboxstore: options of %d bytes, over %d", len(raw), MaxOptionsBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return Options{}, fmt.Errorf("outboxstore: options: %w", err)
	}
	if dec.More() {
		return Options{}, errors.New("outboxstore: options: more than one JSON value")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Options{}, errors.New("outboxstore: options: trailing data")
	}
	switch {
	case o.TTLMillis < 0:
		return Options{}, fmt.Errorf("outboxstore: options: negative time to live %d", o.TTLMillis)
	case o.Priority != nil && *o.Priority > 9:
		return Options{}, fmt.Errorf("outboxstore: options: priority %d over 9", *o.Priority)
	case o.AtUnixMillis < 0 || o.IDUnixMillis < 0:
		return Options{}, errors.New("outboxstore: options: a time before 1970")
	}
	return o, nil
}

// Append writes r in tx (the caller's, with its change) and returns its
// sequence number. r.Seq is ignored. A row of r.ID already there (the
// same handling run again, its earlier run committed) is kept as it is:
// Append then returns 0 and no error.
func (s *Store) Append(ctx context.Context, tx *sql.Tx, r Row) (int64, error) {
	opts, err := json.Marshal(r.Options)
	if err != nil {
		return 0, fmt.Errorf("outboxstore: append %s: %w", r.ID, err)
	}
	var seq int64
	err = tx.QueryRowContext(ctx, s.q(`INSERT INTO mesh_outbox (id, type, body, options, written_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING seq`),
		r.ID, r.Type, r.Body, string(opts), r.WrittenAt.UnixNano()).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("outboxstore: append %s: %w", r.ID, err)
	}
	return seq, nil
}

// Pending returns up to limit rows not sent yet, in commit order (see the
// package doc), without holding a transaction. A row whose options do not
// decode is returned with Options zero and its error in bad, keyed by
// sequence: the caller sets it aside (MarkFailed).
func (s *Store) Pending(ctx context.Context, limit int) (rows []Row, bad map[int64]error, err error) {
	stmt := `SELECT seq, id, type, body, options, written_at FROM mesh_outbox WHERE sent_at IS NULL AND failed IS NULL ORDER BY seq LIMIT ?`
	if s.dialect == PostgreSQL {
		stmt = `SELECT seq, id, type, body, options, written_at FROM mesh_outbox
			WHERE sent_at IS NULL AND failed IS NULL AND xact < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY seq LIMIT ?`
	}
	rs, err := s.db.QueryContext(ctx, s.q(stmt), limit)
	if err != nil {
		return nil, nil, fmt.Errorf("outboxstore: pending: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var r Row
		var at int64
		var opts string
		if err := rs.Scan(&r.Seq, &r.ID, &r.Type, &r.Body, &opts, &at); err != nil {
			return nil, nil, fmt.Errorf("outboxstore: pending: %w", err)
		}
		r.WrittenAt = time.Unix(0, at)
		if r.Options, err = DecodeOptions([]byte(opts)); err != nil {
			if bad == nil {
				bad = map[int64]error{}
			}
			bad[r.Seq] = err
		}
		rows = append(rows, r)
	}
	return rows, bad, rs.Err()
}

// MarkSent records that the rows seqs were confirmed by the broker at at,
// in a short transaction of its own.
func (s *Store) MarkSent(ctx context.Context, at time.Time, seqs ...int64) error {
	if len(seqs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outboxstore: mark sent: %w", err)
	}
	defer tx.Rollback()
	for _, seq := range seqs {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE mesh_outbox SET sent_at = ? WHERE seq = ? AND sent_at IS NULL`), at.UnixNano(), seq); err != nil {
			return fmt.Errorf("outboxstore: mark %d sent: %w", seq, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outboxstore: mark sent: %w", err)
	}
	return nil
}

// MarkFailed sets the row seq aside for good, with why: the host refused
// it (a type the module may not emit, say), so no resend can succeed. It
// stays in the table, out of Pending, for the operator to see.
func (s *Store) MarkFailed(ctx context.Context, seq int64, why string) error {
	if _, err := s.db.ExecContext(ctx, s.q(`UPDATE mesh_outbox SET failed = ? WHERE seq = ? AND sent_at IS NULL`), why, seq); err != nil {
		return fmt.Errorf("outboxstore: set %d aside: %w", seq, err)
	}
	return nil
}

// Prune deletes the rows sent before before, and says how many.
func (s *Store) Prune(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM mesh_outbox WHERE sent_at IS NOT NULL AND sent_at < ?`), before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("outboxstore: prune: %w", err)
	}
	return res.RowsAffected()
}

// Backlog is what waits in the outbox: the rows not sent and not set
// aside, when the oldest of them was written (zero for none), and how many
// were set aside.
type Backlog struct {
	Unsent int64
	Oldest time.Time
	Failed int64
}

// Backlog counts what waits in the outbox.
func (s *Store) Backlog(ctx context.Context) (Backlog, error) {
	var b Backlog
	var oldest sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM mesh_outbox WHERE sent_at IS NULL AND failed IS NULL),
		(SELECT min(written_at) FROM mesh_outbox WHERE sent_at IS NULL AND failed IS NULL),
		(SELECT count(*) FROM mesh_outbox WHERE failed IS NOT NULL)`).Scan(&b.Unsent, &oldest, &b.Failed)
	if err != nil {
		return b, fmt.Errorf("outboxstore: backlog: %w", err)
	}
	if oldest.Valid {
		b.Oldest = time.Unix(0, oldest.Int64)
	}
	return b, nil
}

// Lease makes holder the outbox's one relay until now+ttl, if no other
// holds it past now, and says whether holder has it. One statement, so two
// processes sharing the database never both hold it (with clocks that
// agree within the ttl): the holder relays in order, the others stand by
// and take over once its lease runs out.
func (s *Store) Lease(ctx context.Context, holder string, now time.Time, ttl time.Duration) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE mesh_outbox_relay SET holder = ?, until = ? WHERE id = 1 AND (holder = ? OR until < ?)`),
		holder, now.Add(ttl).UnixNano(), holder, now.UnixNano())
	if err != nil {
		return false, fmt.Errorf("outboxstore: relay lease: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("outboxstore: relay lease: %w", err)
	}
	return n == 1, nil
}

// Release gives up holder's lease, if it holds it, so another relay takes
// over at once.
func (s *Store) Release(ctx context.Context, holder string) error {
	if _, err := s.db.ExecContext(ctx, s.q(`UPDATE mesh_outbox_relay SET until = 0 WHERE id = 1 AND holder = ?`), holder); err != nil {
		return fmt.Errorf("outboxstore: release the relay lease: %w", err)
	}
	return nil
}

// Seen is what the inbox knew of an id when it was recorded.
type Seen int

// What Record found.
const (
	// New: the id was not there; it is recorded in the transaction.
	New Seen = iota + 1
	// Duplicate: the id was there with the same digest.
	Duplicate
	// Conflict: the id was there with another digest.
	Conflict
)

// ErrConflict is wrapped by Record's error for an id recorded with another
// digest.
var ErrConflict = errors.New("the same id with other content")

// Record records id with digest in tx (the handler's, with its effect),
// at at. For an id already there, it records nothing and says whether the
// digest is the same (Duplicate, with the stored decision) or not
// (Conflict, with an error wrapping ErrConflict that names both digests).
func (s *Store) Record(ctx context.Context, tx *sql.Tx, id, digest string, at time.Time) (Seen, []byte, error) {
	res, err := tx.ExecContext(ctx, s.q(`INSERT INTO mesh_inbox (id, digest, recorded_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`), id, digest, at.UnixNano())
	if err != nil {
		return 0, nil, fmt.Errorf("outboxstore: record %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, nil, fmt.Errorf("outboxstore: record %s: %w", id, err)
	} else if n == 1 {
		return New, nil, nil
	}
	var have string
	var decision []byte
	if err := tx.QueryRowContext(ctx, s.q(`SELECT digest, decision FROM mesh_inbox WHERE id = ?`), id).Scan(&have, &decision); err != nil {
		return 0, nil, fmt.Errorf("outboxstore: read %s: %w", id, err)
	}
	if have != digest {
		return Conflict, nil, fmt.Errorf("%w: %s was recorded with digest %s, this copy has %s", ErrConflict, id, have, digest)
	}
	return Duplicate, decision, nil
}

// Decide stores a tool's decision for id (recorded by Record in tx).
func (s *Store) Decide(ctx context.Context, tx *sql.Tx, id string, decision []byte) error {
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE mesh_inbox SET decision = ? WHERE id = ?`), decision, id); err != nil {
		return fmt.Errorf("outboxstore: decide %s: %w", id, err)
	}
	return nil
}
