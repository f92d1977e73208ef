package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// The kinds of Fate.
const (
	// FateDead: a queue gave up on the event (a dead letter).
	FateDead = "dead"
	// FateReplayed: a replay sent the event again.
	FateReplayed = "replayed"
)

// Fate is something that became of an event after it was emitted.
type Fate struct {
	// EventID is the event's id.
	EventID string `json:"event_id"`
	// Kind is FateDead or FateReplayed.
	Kind string `json:"kind"`
	// Queue is, for a dead letter, the queue that gave up on the event;
	// for a replay, where it was sent (mesh.events or a module's queue).
	Queue string `json:"queue,omitempty"`
	// Reason, Error and Attempts are a dead letter's: why, the last
	// error, and how many times the handler was tried.
	Reason   string `json:"reason,omitempty"`
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	// ReplayID is a replay's id.
	ReplayID string `json:"replay_id,omitempty"`
	// Time is when the queue gave up, or when the replay sent the event.
	Time time.Time `json:"time,omitzero"`
}

// insertFates inserts fates in tx, each once.
func insertFates(tx *sql.Tx, fates []Fate) error {
	stmt, err := tx.Prepare(`INSERT INTO fates (event_id, kind, queue, reason, error, attempts, replay_id, time_ns)
		VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING`)
	if err != nil {
		return fmt.Errorf("add to the audit log: prepare: %w", err)
	}
	defer stmt.Close()
	for _, f := range fates {
		if _, err := stmt.Exec(f.EventID, f.Kind, f.Queue, f.Reason, f.Error, f.Attempts, f.ReplayID, unixNano(f.Time)); err != nil {
			return fmt.Errorf("add the %s fate of %s to the audit log: %w", f.Kind, f.EventID, err)
		}
	}
	return nil
}

// withFates sets the Fates of events (at most MaxPage of them).
func (s *Store) withFates(ctx context.Context, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	at := make(map[string]int, len(events))
	args := make([]any, 0, len(events))
	for i, ev := range events {
		at[ev.ID] = i
		args = append(args, ev.ID)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT event_id, kind, queue, reason, error, attempts, replay_id, time_ns FROM fates
		WHERE event_id IN (`+strings.TrimSuffix(strings.Repeat("?,", len(args)), ",")+`) ORDER BY seq`, args...)
	if err != nil {
		return fmt.Errorf("fates: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var f Fate
		var ns int64
		if err := rows.Scan(&f.EventID, &f.Kind, &f.Queue, &f.Reason, &f.Error, &f.Attempts, &f.ReplayID, &ns); err != nil {
			return fmt.Errorf("fates: %w", err)
		}
		f.Time = fromUnixNano(ns)
		if i, ok := at[f.EventID]; ok {
			events[i].Fates = append(events[i].Fates, f)
		}
	}
	return rows.Err()
}
