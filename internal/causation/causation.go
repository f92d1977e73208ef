// Package causation carries the event or request being handled through a
// context, so that an emit or call made while handling it records that id
// as its x-causation-id, and gets an id of its own derived from it, with
// nothing for the module author to do.
//
// A retried handler that emits or calls the same thing again then sends
// the same id: consumers' de-duplication and servers' stored answers
// absorb the repeat (SPEC §1, Delivery).
//
//	ctx = causation.Handling(ctx, ev.ID, ev.Time)
//	causation.From(ctx)                                         // ev.ID
//	id, ok := causation.Derive(ctx, "billing", causation.KindEmit, "module.billing.invoiced", body)
package causation

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

type ctxKey struct{}

// scope is one handling of an event or request: its id, its time, and how
// many times each identical emit or call was made in it so far.
type scope struct {
	id       string
	time     time.Time
	handling bool // ids are derived in it (Handling, not With)
	mu       sync.Mutex
	seen     map[[sha256.Size]byte]uint64 // made at the first Derive
	// outboxRows counts the outbox rows written in the handling so far
	// (NextOutbox).
	outboxRows uint64
}

// With returns a context that carries id as the cause of what is done in
// it, without deriving ids (a cause given explicitly, not a handling).
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, &scope{id: id})
}

// Handling returns a context for one handling (one attempt) of the event
// or request id, made at t: what is emitted or called in it has id as its
// cause and an id derived by Derive.
func Handling(ctx context.Context, id string, t time.Time) context.Context {
	return context.WithValue(ctx, ctxKey{}, &scope{id: id, time: t, handling: true})
}

// Carry returns ctx with the cause, and the handling if any, that from
// carries (the same scope: ids derived in either count the same
// occurrences). A host uses it to derive, in the context of a request
// from a module process, the ids of the handling it handed that process.
func Carry(ctx, from context.Context) context.Context {
	if s, _ := from.Value(ctxKey{}).(*scope); s != nil {
		return context.WithValue(ctx, ctxKey{}, s)
	}
	return ctx
}

// From returns the id of the cause With or Handling stored, or "".
func From(ctx context.Context) string {
	if s, _ := ctx.Value(ctxKey{}).(*scope); s != nil {
		return s.id
	}
	return ""
}

// What Derive derives an id for.
const (
	KindEmit = "emit"
	KindCall = "call"
)

// Derive returns the id of an emit or call (kind) of key (the full event
// type or the tool key) with body, made by module inside the handling ctx
// carries: a valid ULID whose time is the handled event's and whose
// entropy is a digest of the handled id, module, kind, key, body and
// occurrence (the n-th identical emit or call of this handling). The same
// handling repeated (a retry) derives the same ids in the same order; a
// different body derives another. ok is false outside a handling.
func Derive(ctx context.Context, module, kind, key string, body []byte) (id string, ok bool) {
	s, _ := ctx.Value(ctxKey{}).(*scope)
	if s == nil || !s.handling {
		return "", false
	}
	h := sha256.New()
	for _, part := range []string{s.id, module, kind, key} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	bodySum := sha256.Sum256(body)
	h.Write(bodySum[:])
	var what [sha256.Size]byte
	h.Sum(what[:0])

	s.mu.Lock()
	if s.seen == nil {
		s.seen = make(map[[sha256.Size]byte]uint64)
	}
	n := s.seen[what]
	s.seen[what] = n + 1
	s.mu.Unlock()

	h.Reset()
	h.Write(what[:])
	var occ [8]byte
	binary.BigEndian.PutUint64(occ[:], n)
	h.Write(occ[:])
	sum := h.Sum(nil)

	var u ulid.ULID
	ms := ulid.Timestamp(s.time)
	if s.time.IsZero() || ms > ulid.MaxTime() {
		ms = 0
	}
	if err := u.SetTime(ms); err != nil {
		return "", false
	}
	if err := u.SetEntropy(sum[:10]); err != nil {
		return "", false
	}
	return u.String(), true
}

// HandlingEvent is Handling for a delivered event, unless its id is not a
// ULID (a dead letter that breaks the wire contract): nothing derives
// from such an id, and ctx is returned as it is.
func HandlingEvent(ctx context.Context, id string, t time.Time) context.Context {
	if _, err := ulid.ParseStrict(id); err != nil {
		return ctx
	}
	return Handling(ctx, id, t)
}

// KindOutbox is what OutboxID derives ids for: events a module writes to
// its outbox (sdk/outbox).
const KindOutbox = "outbox"

// OutboxRef is what an outbox row's id is derived from: a scope (the
// handled id, for a row written while handling an event or request; the
// outbox's epoch otherwise), a number in it (the n-th row written in the
// handling; a random number otherwise) and the time the id carries (the
// handled event's, or the row's).
type OutboxRef struct {
	Scope string
	N     uint64
	Time  time.Time
}

// OutboxID is the id of the outbox row ref names, written by module: a
// valid ULID whose time is ref.Time and whose entropy is a digest of
// module, ref.Scope and ref.N. The module derives it when it writes the
// row and the host derives it again, from the module's name it knows,
// when the row is published: whatever ref a module sends, the id is one
// of its own scope, never another module's, and the row sent again after
// a crash carries the same id.
func OutboxID(module string, ref OutboxRef) string {
	h := sha256.New()
	for _, part := range []string{KindOutbox, module, ref.Scope} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], ref.N)
	h.Write(n[:])
	sum := h.Sum(nil)
	var u ulid.ULID
	ms := ulid.Timestamp(ref.Time)
	if ref.Time.Before(time.UnixMilli(0)) || ms > ulid.MaxTime() {
		ms = 0
	}
	_ = u.SetTime(ms)          // ms is within ULID's range
	_ = u.SetEntropy(sum[:10]) // 10 bytes, as SetEntropy wants
	return u.String()
}

// NextOutbox returns the ref of the next outbox row written in the
// handling ctx carries: its scope is the handled id, its time the handled
// event's, and N counts the rows written so far in this handling. The
// same handling run again (a redelivery after a rollback, a retry) writes
// the same refs in the same order, so its rows get the same ids. ok is
// false outside a handling.
func NextOutbox(ctx context.Context) (ref OutboxRef, ok bool) {
	s, _ := ctx.Value(ctxKey{}).(*scope)
	if s == nil || !s.handling {
		return OutboxRef{}, false
	}
	s.mu.Lock()
	n := s.outboxRows
	s.outboxRows++
	s.mu.Unlock()
	return OutboxRef{Scope: s.id, N: n, Time: s.time}, true
}
