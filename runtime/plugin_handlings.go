package runtime

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/causation"
)

// Handlings: the host's record of each handling it hands the module
// process, by the token sent with it, so that what the process emits and
// calls in one gets its id derived by the host from that handling (the
// process cannot choose another event's id) and joins its trace. The
// invariants:
//
//   - A token names one handling for good: tokens only grow, and 0 is
//     none (outside a handling). A token is live while its handling runs
//     (begin to end); once ended, it is still known among the last
//     keptEndedHandlings that ended, for what a process sends after the
//     outcome, and then forgotten.
//   - A handling is kept as its causation scope and its span only
//     (handlingCtx): an ended handling keeps nothing else of the handler's
//     context.
//   - An emit or call made in a handling the host knows, live or recently
//     ended, gets its id derived in it, the id it would have had in time.
//     One made in a handling the host does not know (ended too long ago,
//     or never handed) is refused (errHandlingGone), never given a fresh
//     id, unless the process asked for no derived id; outside a handling
//     ids are fresh.

// handlingCtx is one handling the host handed to the process: its
// causation scope and its span, on a context of their own (an ended
// handling keeps nothing else of the handler's context).
type handlingCtx struct{ ctx context.Context }

func newHandlingCtx(ctx context.Context) *handlingCtx {
	slim := causation.Carry(context.Background(), ctx)
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		slim = trace.ContextWithSpanContext(slim, sc)
	}
	return &handlingCtx{ctx: slim}
}

// keptEndedHandlings is how many ended handlings a module's host still
// knows, for the emits and calls a process sends after the handling's
// outcome: a process stopped past its handler's timeout sends them when
// it resumes, while the retry runs or after it.
const keptEndedHandlings = 4096

// handlings are a module's live handlings and the last keptEndedHandlings
// that ended. An emit made in an ended handling still gets its id derived
// in it, the id it would have had in time (the retry's emit of the same
// event gets it too, and de-duplication absorbs the repeat); one made in a
// handling ended longer ago is refused, never given a fresh id.
type handlings struct {
	next  atomic.Uint64
	mu    sync.Mutex
	live  map[uint64]*handlingCtx
	ended map[uint64]*handlingCtx
	order []uint64 // ended tokens, oldest first, a ring of keptEndedHandlings
	head  int
}

// begin registers ctx as a new handling and returns its token and the
// function that ends it.
func (hs *handlings) begin(ctx context.Context) (token uint64, end func()) {
	token = hs.next.Add(1)
	h := newHandlingCtx(ctx)
	hs.mu.Lock()
	if hs.live == nil {
		hs.live = make(map[uint64]*handlingCtx)
		hs.ended = make(map[uint64]*handlingCtx)
	}
	hs.live[token] = h
	hs.mu.Unlock()
	return token, func() {
		hs.mu.Lock()
		defer hs.mu.Unlock()
		delete(hs.live, token)
		if len(hs.order) < keptEndedHandlings {
			hs.order = append(hs.order, token)
		} else {
			delete(hs.ended, hs.order[hs.head])
			hs.order[hs.head] = token
			hs.head = (hs.head + 1) % keptEndedHandlings
		}
		hs.ended[token] = h
	}
}

// find is the handling of token, live or recently ended.
func (hs *handlings) find(token uint64) (*handlingCtx, bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h, ok := hs.live[token]; ok {
		return h, true
	}
	h, ok := hs.ended[token]
	return h, ok
}

// errHandlingGone refuses an emit or call a process makes in a handling
// the host ended too long ago to derive its id (or never handed it).
var errHandlingGone = fmt.Errorf("the handling it was made in is over and forgotten (its deadline passed long ago): %w", context.DeadlineExceeded)

// inHandling is ctx in the handling the process names by token: with its
// span, and with its causation scope, from which the host derives the ids
// of what the process emits and calls in it. Outside a handling (token 0)
// ctx carries the cause the process names alone, and ids are fresh; so
// they are in a handling the host no longer knows when the process asks
// for no derived id (derive false), and otherwise that is refused.
func (pm *PluginModule) inHandling(ctx context.Context, token uint64, cause string, derive bool) (context.Context, error) {
	h, known := pm.handlings.find(token)
	if token == 0 || !known && !derive {
		if cause == "" {
			return ctx, nil
		}
		return causation.With(ctx, cause), nil
	}
	if !known {
		return ctx, errHandlingGone
	}
	if sc := trace.SpanContextFromContext(h.ctx); sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	return causation.Carry(ctx, h.ctx), nil
}
