package dispatcher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"
)

// Outcomes of a firing, as recorded.
const (
	OutcomeOK       = "ok"       // the tool answered: acked
	OutcomeRejected = "rejected" // the tool or the target refused it for good: dead-lettered
	OutcomeFailed   = "failed"   // a transient failure: retried, dead-lettered past the attempt limit
	OutcomeExpired  = "expired"  // its deadline passed before it was taken: dead-lettered, no call
	OutcomeConflict = "conflict" // its id was handled with another body: dead-lettered, no call
	OutcomeRepeated = "repeated" // its id was handled already: its first outcome, no call
)

// Fire is one firing of a trigger, as recorded.
type Fire struct {
	Seq         int64     `json:"seq"`
	Trigger     string    `json:"trigger"`
	MessageID   string    `json:"message_id,omitempty"`
	RoutingKey  string    `json:"routing_key"`
	Redelivered bool      `json:"redelivered,omitempty"`
	Attempt     int       `json:"attempt"`
	Outcome     string    `json:"outcome"`
	Detail      string    `json:"detail,omitempty"`
	Time        time.Time `json:"time"`

	bodySum string
}

// fires is the durable record of firings (pure-Go SQLite, WAL).
type fires struct{ db *sql.DB }

const firesSchema = `
CREATE TABLE IF NOT EXISTS fires (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	trigger     TEXT NOT NULL,
	message_id  TEXT NOT NULL DEFAULT '',
	body_sum    TEXT NOT NULL DEFAULT '',
	routing_key TEXT NOT NULL DEFAULT '',
	redelivered INTEGER NOT NULL DEFAULT 0,
	attempt     INTEGER NOT NULL DEFAULT 0,
	outcome     TEXT NOT NULL,
	detail      TEXT NOT NULL DEFAULT '',
	time_ns     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS fires_message ON fires(trigger, message_id);
CREATE TABLE IF NOT EXISTS paused (
	trigger   TEXT PRIMARY KEY,
	since_ns  INTEGER NOT NULL
);
`

func openFires(path string) (*fires, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open the firing record %s: %w", path, err)
	}
	if err := migrateFires(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open the firing record %s: %w", path, err)
	}
	return &fires{db: db}, nil
}

// FiresFormat is the format of the firing record this release writes and
// the newest it reads, kept in SQLite's PRAGMA user_version: a record of
// v0.1.0 says 0, which is format 1, this one (docs/compatibility.md).
const FiresFormat = 1

// ErrNewerFormat is what Open wraps for a firing record of a format newer
// than FiresFormat: one a later release wrote, before a rollback.
var ErrNewerFormat = errors.New("written by a newer release of mesh")

// migrateFires refuses a record of a newer format before anything in it
// changes, and creates or keeps the schema, recording FiresFormat, in one
// transaction.
func migrateFires(db *sql.DB) (err error) {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var found int
	if err := tx.QueryRow("PRAGMA user_version").Scan(&found); err != nil {
		return fmt.Errorf("read the format (user_version): %w", err)
	}
	if found > FiresFormat {
		return fmt.Errorf("the record is of format %d, %w; this release reads formats up to %d: run the dispatcher of the release that wrote it (roll forward again), or move the file aside (the dispatcher then runs a redelivered message's tool again)", found, ErrNewerFormat, FiresFormat)
	}
	if _, err := tx.Exec(firesSchema); err != nil {
		return err
	}
	if found != FiresFormat {
		if _, err := tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", FiresFormat)); err != nil {
			return fmt.Errorf("record the format (user_version): %w", err)
		}
	}
	return tx.Commit()
}

func (f *fires) close() error { return f.db.Close() }

// add records a firing durably.
func (f *fires) add(ctx context.Context, x Fire) error {
	_, err := f.db.ExecContext(ctx, `INSERT INTO fires (trigger, message_id, body_sum, routing_key, redelivered, attempt, outcome, detail, time_ns)
		VALUES (?,?,?,?,?,?,?,?,?)`, x.Trigger, x.MessageID, x.bodySum, x.RoutingKey, x.Redelivered, x.Attempt, x.Outcome, x.Detail, x.Time.UnixNano())
	if err != nil {
		return fmt.Errorf("record the firing of %s for %q: %w", x.Trigger, x.MessageID, err)
	}
	return nil
}

// first returns the first final firing (ok, rejected, expired) of the
// message id by the trigger.
func (f *fires) first(ctx context.Context, trigger, id string) (Fire, bool, error) {
	var x Fire
	var ns int64
	err := f.db.QueryRowContext(ctx, `SELECT seq, trigger, message_id, body_sum, routing_key, redelivered, attempt, outcome, detail, time_ns
		FROM fires WHERE trigger = ? AND message_id = ? AND outcome IN (?, ?, ?) ORDER BY seq LIMIT 1`,
		trigger, id, OutcomeOK, OutcomeRejected, OutcomeExpired).
		Scan(&x.Seq, &x.Trigger, &x.MessageID, &x.bodySum, &x.RoutingKey, &x.Redelivered, &x.Attempt, &x.Outcome, &x.Detail, &ns)
	if errors.Is(err, sql.ErrNoRows) {
		return x, false, nil
	}
	if err != nil {
		return x, false, fmt.Errorf("read the firing record: %w", err)
	}
	x.Time = time.Unix(0, ns).UTC()
	return x, true, nil
}

// MaxFiresPage bounds a page of the record.
const MaxFiresPage = 1000

// list returns the firings of a trigger ("" for all) after the cursor,
// oldest first, at most limit, and the next cursor (0 at the end).
func (f *fires) list(ctx context.Context, trigger string, after int64, limit int) ([]Fire, int64, error) {
	if limit <= 0 || limit > MaxFiresPage {
		limit = MaxFiresPage
	}
	rows, err := f.db.QueryContext(ctx, `SELECT seq, trigger, message_id, routing_key, redelivered, attempt, outcome, detail, time_ns
		FROM fires WHERE (? = '' OR trigger = ?) AND seq > ? ORDER BY seq LIMIT ?`, trigger, trigger, after, limit+1)
	if err != nil {
		return nil, 0, fmt.Errorf("read the firing record: %w", err)
	}
	defer rows.Close()
	var out []Fire
	for rows.Next() {
		var x Fire
		var ns int64
		if err := rows.Scan(&x.Seq, &x.Trigger, &x.MessageID, &x.RoutingKey, &x.Redelivered, &x.Attempt, &x.Outcome, &x.Detail, &ns); err != nil {
			return nil, 0, fmt.Errorf("read the firing record: %w", err)
		}
		x.Time = time.Unix(0, ns).UTC()
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read the firing record: %w", err)
	}
	var next int64
	if len(out) > limit {
		out = out[:limit]
		next = out[len(out)-1].Seq
	}
	return out, next, nil
}

// setPaused records that a trigger is paused (or no longer), durably, so
// that it stays paused across restarts.
func (f *fires) setPaused(ctx context.Context, trigger string, paused bool, at time.Time) error {
	var err error
	if paused {
		_, err = f.db.ExecContext(ctx, `INSERT INTO paused (trigger, since_ns) VALUES (?, ?) ON CONFLICT(trigger) DO NOTHING`, trigger, at.UnixNano())
	} else {
		_, err = f.db.ExecContext(ctx, `DELETE FROM paused WHERE trigger = ?`, trigger)
	}
	if err != nil {
		return fmt.Errorf("record that trigger %s is paused (%v): %w", trigger, paused, err)
	}
	return nil
}

// paused returns the paused triggers.
func (f *fires) paused(ctx context.Context) (map[string]bool, error) {
	rows, err := f.db.QueryContext(ctx, `SELECT trigger FROM paused`)
	if err != nil {
		return nil, fmt.Errorf("read the paused triggers: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("read the paused triggers: %w", err)
		}
		out[t] = true
	}
	return out, rows.Err()
}
