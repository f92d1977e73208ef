package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// pruneChunk is how many rows one retention transaction deletes, so that
// inserts go on between chunks.
const pruneChunk = 1000

// Retention bounds what the store keeps. Zero fields place no bound.
type Retention struct {
	// Before drops the events that arrived before it.
	Before time.Time
	// MaxBytes drops the oldest events until the rows use at most this
	// many bytes of the database (its free pages are reused, so the file
	// itself stops growing rather than shrinking).
	MaxBytes int64
}

// Prune deletes the oldest events (by arrival) that r does not keep, a
// chunk per transaction, so that ingestion goes on meanwhile. It returns
// how many it deleted. Each transaction records the hash of the newest
// row it deletes as the chain's anchor, so that what is left verifies.
func (s *Store) Prune(ctx context.Context, r Retention) (int64, error) {
	var deleted int64
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		var upTo int64 // delete rows with seq <= upTo
		if !r.Before.IsZero() {
			err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM (SELECT seq, arrived_ns FROM events ORDER BY seq LIMIT ?) WHERE arrived_ns < ?`,
				pruneChunk, r.Before.UnixNano()).Scan(&upTo)
			if err != nil {
				return deleted, fmt.Errorf("prune the audit log: %w", err)
			}
		}
		if upTo == 0 && r.MaxBytes > 0 {
			used, err := s.usedBytes(ctx)
			if err != nil {
				return deleted, err
			}
			if used > r.MaxBytes {
				if err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM (SELECT seq FROM events ORDER BY seq LIMIT ?)`, pruneChunk/10).
					Scan(&upTo); err != nil {
					return deleted, fmt.Errorf("prune the audit log: %w", err)
				}
			}
		}
		if upTo == 0 {
			return deleted, nil
		}
		n, err := s.pruneUpTo(ctx, upTo)
		if err != nil {
			return deleted, fmt.Errorf("prune the audit log: %w", err)
		}
		deleted += n
		if n == 0 {
			return deleted, nil
		}
	}
}

// usedBytes is the size of the database's pages in use.
func (s *Store) usedBytes(ctx context.Context) (int64, error) {
	var pages, free, size int64
	for q, v := range map[string]*int64{`PRAGMA page_count`: &pages, `PRAGMA freelist_count`: &free, `PRAGMA page_size`: &size} {
		if err := s.db.QueryRowContext(ctx, q).Scan(v); err != nil {
			return 0, fmt.Errorf("audit log size: %w", err)
		}
	}
	return (pages - free) * size, nil
}

// pruneUpTo deletes the events with seq <= upTo and their fates in one
// transaction, and records as the chain's anchor the hash of the newest
// row it deletes, so that the rows left verify from their first.
func (s *Store) pruneUpTo(ctx context.Context, upTo int64) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	var anchor []byte
	err = tx.QueryRowContext(ctx, `SELECT hash FROM events WHERE seq <= ? ORDER BY seq DESC LIMIT 1`, upTo).Scan(&anchor)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("the chain's new anchor: %w", err)
	}
	if anchor != nil { // nil: the newest row deleted predates the chain, which keeps its anchor
		if err := setMeta(tx, metaChainAnchor, anchor); err != nil {
			return 0, fmt.Errorf("record the chain's anchor: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM fates WHERE event_id IN (SELECT id FROM events WHERE seq <= ?)`, upTo); err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM events WHERE seq <= ?`, upTo)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, tx.Commit()
}
