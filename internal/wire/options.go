package wire

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/meshkit/mesh/internal/filter"
)

// EmitOptions are the per-emit settings the sdk's options fill in and the
// hosts read.
type EmitOptions struct {
	Schema      string
	CausationID string
	TTL         time.Duration
	Priority    uint8
	HasPriority bool
	// FullType says the emitted name is a full event type, not one
	// relative to the module's namespace.
	FullType bool
	// FreshID asks for a new random id even inside a handler, where the id
	// is otherwise derived from the handled event (see causation.Scope).
	FreshID bool
}

// Bounds of what a module sets in an event's headers, so that an event
// always fits the broker's frame (a header too large for it would kill
// the publishing connection, and a spooled one would on every resend).
const (
	// MaxSchemaBytes bounds x-schema (sdk.WithSchema).
	MaxSchemaBytes = 128
	// MaxCausationBytes bounds x-causation-id: an id, at most an AMQP
	// short string.
	MaxCausationBytes = 255
)

// CheckSchema refuses a schema version that is empty, longer than
// MaxSchemaBytes, or holds control characters.
func CheckSchema(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: schema version is empty", ErrInvalid)
	case len(v) > MaxSchemaBytes:
		return fmt.Errorf("%w: schema version of %d bytes is over %d", ErrInvalid, len(v), MaxSchemaBytes)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: schema version %q holds a control character", ErrInvalid, v)
	}
	return nil
}

// CheckCausation refuses a causation id longer than MaxCausationBytes.
func CheckCausation(id string) error {
	if len(id) > MaxCausationBytes {
		return fmt.Errorf("%w: causation id of %d bytes is over %d", ErrInvalid, len(id), MaxCausationBytes)
	}
	return nil
}

// Check refuses settings no sdk option makes, as they arrive from a module
// process: a priority over 9, a negative time to live, a schema or a
// causation id out of bounds.
func (o EmitOptions) Check() error {
	if o.Schema != "" {
		if err := CheckSchema(o.Schema); err != nil {
			return err
		}
	}
	if err := CheckCausation(o.CausationID); err != nil {
		return err
	}
	if o.HasPriority && o.Priority > 9 {
		return fmt.Errorf("%w: priority %d is over 9", ErrInvalid, o.Priority)
	}
	if o.TTL < 0 {
		return fmt.Errorf("%w: time to live %v is negative", ErrInvalid, o.TTL)
	}
	return nil
}

// EmitOptionApplier is what every sdk.EmitOption is underneath. The sdk
// keeps the method off its exported surface (EmitOption is an interface
// with an unexported marker); hosts reach it with a type assertion.
type EmitOptionApplier interface {
	ApplyEmit(*EmitOptions) error
}

// ApplyEmitOptions folds sdk emit options into one set of settings. A nil
// option is skipped; a value that is not an sdk option is refused.
func ApplyEmitOptions[T any](opts []T) (EmitOptions, error) {
	var o EmitOptions
	for _, opt := range opts {
		if any(opt) == nil {
			continue
		}
		a, ok := any(opt).(EmitOptionApplier)
		if !ok {
			return o, fmt.Errorf("emit option %T is not one of the sdk's", opt)
		}
		if err := a.ApplyEmit(&o); err != nil {
			return o, fmt.Errorf("emit option: %w", err)
		}
	}
	return o, nil
}

// HandlerOptions are the per-handler settings the sdk's handler options
// (On, Consume and Serve take them) fill in and the hosts read.
type HandlerOptions struct {
	// AllowDuplicates hands the handler every delivery, including one
	// whose id the module handled already (On), or runs the tool again
	// for a repeated request instead of answering it from the stored
	// answer (Serve).
	AllowDuplicates bool
	// Filter, if not nil, is what an event must match to reach the
	// handler (On, Consume).
	Filter *filter.Filter
}

// HandlerOptionApplier is what every sdk.HandlerOption is underneath, as
// EmitOptionApplier is for emit options.
type HandlerOptionApplier interface {
	ApplyHandler(*HandlerOptions) error
}

// ApplyHandlerOptions folds sdk handler options into one set of settings.
// A nil option is skipped; a value that is not an sdk option is refused.
func ApplyHandlerOptions[T any](opts []T) (HandlerOptions, error) {
	var o HandlerOptions
	for _, opt := range opts {
		if any(opt) == nil {
			continue
		}
		a, ok := any(opt).(HandlerOptionApplier)
		if !ok {
			return o, fmt.Errorf("%w: handler option %T is not one of the sdk's", ErrInvalid, opt)
		}
		if err := a.ApplyHandler(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// ParseFilter parses a subscription filter (sdk.Filter) with the error the
// sdk promises: ErrInvalid, naming the rule broken and where.
func ParseFilter(expr string) (*filter.Filter, error) {
	f, err := filter.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: filter %.80q: %s", ErrInvalid, expr, strings.TrimPrefix(err.Error(), filter.ErrInvalid.Error()+": "))
	}
	return f, nil
}

// Tool error codes the mesh itself gives (sdk.ToolError.Code).
const (
	CodeRejected       = "rejected"        // the handler returned a Permanent error
	CodeFailed         = "failed"          // the handler returned another error
	CodeInternal       = "internal"        // the handler panicked or its response could not be encoded
	CodeInvalidRequest = "invalid_request" // the request broke the wire contract
	CodeForbidden      = "forbidden"       // the tool's callers do not include the caller
)
