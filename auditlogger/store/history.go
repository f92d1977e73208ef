package store

import (
	"context"
	"fmt"
)

// AddHistory stores a batch read from the mesh's history stream: the
// events in exactly the given order, with no other call's row between
// them (one transaction, whatever MaxBatch says), each once by its id as
// Add stores them, with its Offset; and, in the same transaction, next,
// the offset of the next stream message to read, which HistoryNext returns
// from then on. It returns how many events were new, once they are
// durable. A batch of only duplicates, or of none, still moves the
// position.
//
// The offsets that are set must increase along the batch and be below
// next; next may not be negative. The batches are meant to come from one
// reader, one call after another: the position recorded is the last
// call's.
func (s *Store) AddHistory(ctx context.Context, next int64, events ...Event) (int, error) {
	if err := checkEvents(events); err != nil {
		return 0, fmt.Errorf("add history to the audit log: %w", err)
	}
	if next < 0 {
		return 0, fmt.Errorf("add history to the audit log: next offset %d is negative", next)
	}
	last := int64(-1)
	for i, ev := range events {
		if ev.Offset == nil {
			continue
		}
		if o := *ev.Offset; o <= last || o >= next {
			return 0, fmt.Errorf("add history to the audit log: event %d (%s): offset %d is not above %d and below next %d", i, ev.ID, o, last, next)
		}
		last = *ev.Offset
	}
	return s.send(ctx, addRequest{events: events, history: true, next: next})
}

// HistoryNext returns the offset of the next history stream message to
// read, as the last AddHistory recorded it; ok is false when none has.
func (s *Store) HistoryNext(ctx context.Context) (next int64, ok bool, err error) {
	ok, err = getMeta(ctx, s.db, metaHistoryNext, &next)
	if err != nil {
		return 0, false, fmt.Errorf("the audit log's history position: %w", err)
	}
	return next, ok, nil
}
