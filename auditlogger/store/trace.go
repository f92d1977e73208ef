package store

import (
	"context"
	"errors"
	"fmt"
)

// MaxTraceEvents bounds the events one Trace returns, so that memory stays
// bounded whatever the store holds.
const MaxTraceEvents = 10000

// Caused is an event and what it caused, in order of arrival.
type Caused struct {
	Event  Event     `json:"event"`
	Caused []*Caused `json:"caused,omitempty"`
}

// Trace is the causal chain around one event, through x-causation-id in
// both directions.
type Trace struct {
	// Causes are what caused the event, its direct cause first, up to
	// the first one the store does not hold or that has no cause.
	Causes []Event `json:"causes,omitempty"`
	// Root is the event and, below it, what it caused, level by level.
	Root *Caused `json:"root"`
	// Truncated says the tree was cut at MaxTraceEvents or maxDepth.
	Truncated bool `json:"truncated,omitempty"`
	// MissingCause is the id of the first cause the store does not hold
	// (it arrived before retention took it, or on no audited node), or "".
	MissingCause string `json:"missing_cause,omitempty"`
}

// Trace returns the causal chain of the event id: up to maxDepth causes
// above it and maxDepth levels of what it caused below (0: no limit but
// MaxTraceEvents).
func (s *Store) Trace(ctx context.Context, id string, maxDepth int) (Trace, error) {
	var tr Trace
	ev, err := s.Get(ctx, id)
	if err != nil {
		return tr, err
	}
	tr.Root = &Caused{Event: ev}
	seen := map[string]bool{ev.ID: true} // a forged cycle must not loop
	for cause := ev.CausationID; cause != "" && !seen[cause]; {
		if maxDepth > 0 && len(tr.Causes) >= maxDepth {
			tr.Truncated = true
			break
		}
		c, err := s.Get(ctx, cause)
		if errors.Is(err, ErrNotFound) {
			tr.MissingCause = cause
			break
		}
		if err != nil {
			return tr, err
		}
		seen[cause] = true
		tr.Causes = append(tr.Causes, c)
		cause = c.CausationID
	}
	level := []*Caused{tr.Root}
	count := 1 + len(tr.Causes)
	for depth := 1; len(level) > 0; depth++ {
		byID := make(map[string]*Caused, len(level))
		ids := make([]string, 0, len(level))
		for _, n := range level {
			byID[n.Event.ID] = n
			ids = append(ids, n.Event.ID)
		}
		if maxDepth > 0 && depth > maxDepth {
			more, err := s.Count(ctx, Filter{CausationIDs: ids[:min(len(ids), 500)]})
			if err != nil {
				return tr, fmt.Errorf("trace %s: %w", id, err)
			}
			tr.Truncated = more > 0
			break
		}
		var next []*Caused
		for start := 0; start < len(ids); start += 500 { // bounded SQL parameter lists
			chunk := ids[start:min(start+500, len(ids))]
			var after int64
			for {
				evs, more, err := s.Query(ctx, Filter{CausationIDs: chunk}, Page{After: after, Limit: MaxPage})
				if err != nil {
					return tr, fmt.Errorf("trace %s: %w", id, err)
				}
				for _, c := range evs {
					if seen[c.ID] {
						continue
					}
					if count >= MaxTraceEvents {
						tr.Truncated = true
						return tr, nil
					}
					seen[c.ID] = true
					count++
					n := &Caused{Event: c}
					parent := byID[c.CausationID]
					parent.Caused = append(parent.Caused, n)
					next = append(next, n)
				}
				if more == 0 {
					break
				}
				after = more
			}
		}
		level = next
	}
	return tr, nil
}
