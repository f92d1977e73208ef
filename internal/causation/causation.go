// Package causation carries the id of the event or request being handled
// through a context, so an emit or call made while handling it records that
// id as its x-causation-id with nothing for the module author to do.
//
//	ctx = causation.With(ctx, event.ID)
//	id := causation.From(ctx) // event.ID
package causation

import "context"

type key struct{}

// With returns a context that carries id as the cause of what is done in it.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the id With stored, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}
