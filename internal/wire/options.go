package wire

import "time"

// EmitOptions are the per-emit settings the sdk's options fill in and the
// runtime reads.
type EmitOptions struct {
	Schema      string
	CausationID string
	TTL         time.Duration
	Priority    uint8
	HasPriority bool
	// FullType says the emitted name is a full event type, not one
	// relative to the module's namespace.
	FullType bool
}
