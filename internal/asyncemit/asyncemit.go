// Package asyncemit runs a module's asynchronous emits (sdk.Mesh.EmitAsync)
// the same way on every host: each is the host's own synchronous emit, run
// on a goroutine of its own, at most Size at once per module; the caller
// waits for a free slot (back-pressure), and done gets the outcome.
//
// A host gives each module one Window, made by New, and implements
// EmitAsync with it (docs/adr/0024-emit-async.md):
//
//	func (m *moduleMesh) EmitAsync(ctx context.Context, name string, body any, done func(string, error), opts ...sdk.EmitOption) error {
//		return m.async.Go(ctx, func(ctx context.Context) (string, error) {
//			return m.Emit(ctx, name, body, opts...)
//		}, done)
//	}
package asyncemit

import (
	"context"
	"fmt"
)

// Size is how many asynchronous emits of one module may be unfinished at
// once, as many as raw amqp091-go at its best keeps confirms in flight.
const Size = 256

// Window bounds one module's unfinished asynchronous emits.
type Window struct{ slots chan struct{} }

// New makes a window of Size slots.
func New() *Window { return &Window{slots: make(chan struct{}, Size)} }

// Go (done must not be nil) waits for a slot (or ctx's end, returning its error), then runs emit
// on a goroutine with ctx's values but not its cancellation (the emit
// finishes, confirmed or spooled or refused, even if the caller's context
// ends), and calls done with its outcome, once, after the slot is free
// again (so done may emit again).
func (w *Window) Go(ctx context.Context, emit func(context.Context) (string, error), done func(id string, err error)) error {
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for one of %d emits in flight to finish: %w", Size, ctx.Err())
	}
	ectx := context.WithoutCancel(ctx)
	go func() {
		id, err := emit(ectx)
		<-w.slots
		done(id, err)
	}()
	return nil
}
