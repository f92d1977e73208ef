package wire

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/delay"
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
	// After and At delay the event (sdk.After, sdk.At): it is published
	// into the delay cascade (internal/delay) and reaches mesh.events
	// when due. At most one of them is set; a zero value is none.
	After time.Duration
	At    time.Time
	// Key is the event's key (sdk.WithKey): events of one key are handled
	// in order by a group that keeps order (ADR 48). HasKey says it was
	// set (the empty key is a key).
	Key    string
	HasKey bool
	// AtMostOnce publishes the event not persistent and without waiting
	// for the broker's confirm or spooling it (sdk.AtMostOnce).
	AtMostOnce bool
	// Outbox, if not nil, says the emit publishes a row of the module's
	// outbox (sdk/outbox): its id is causation.OutboxID of the module's
	// name and this ref, whatever the handling, and a resend of the row
	// gets the same. Only the sdk's outbox sets it (OutboxOption).
	Outbox *causation.OutboxRef
}

// OutboxStats is what a module's outbox relay (sdk/outbox) reports of
// its backlog, for the node's metrics.
type OutboxStats struct {
	Unsent      int64     // rows committed and not yet published
	Oldest      time.Time // when the oldest of them was written; zero for none
	SetAside    int64     // rows the node refused for good
	RelayErrors uint64    // failed relay passes so far
}

// OutboxReporter is implemented by a host's sdk.Mesh that keeps a
// module's outbox figures: the relay hands it its backlog.
type OutboxReporter interface {
	ReportOutbox(OutboxStats)
}

// OutboxOption makes the sdk's emit option that sets Outbox to ref. The
// sdk sets it when it is loaded, so sdk/outbox can hand the option to a
// host's Emit while the sdk's exported surface has no such option.
var OutboxOption func(ref causation.OutboxRef) any

// Delayed reports whether the emit asks for a delay.
func (o EmitOptions) Delayed() bool { return o.After > 0 || !o.At.IsZero() }

// Due is when a delayed emit made at now comes due: now for one that is
// not delayed (or whose time has come).
func (o EmitOptions) Due(now time.Time) time.Time {
	switch {
	case o.After > 0:
		return now.Add(o.After)
	case !o.At.IsZero() && o.At.After(now):
		return o.At
	}
	return now
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
	if o.HasKey {
		if err := CheckKey(o.Key); err != nil {
			return err
		}
	}
	return o.checkTiming()
}

// checkTiming refuses what no combination of sdk options may ask: a
// negative delay, both After and At, a delay past delay.Max, or a delayed
// emit at most once (the delay cascade keeps what waits durably; an event
// that may be lost needs no schedule).
func (o EmitOptions) checkTiming() error {
	switch {
	case o.After < 0:
		return fmt.Errorf("%w: delay %v is negative", ErrInvalid, o.After)
	case o.After > 0 && !o.At.IsZero():
		return fmt.Errorf("%w: both After and At: give one", ErrInvalid)
	case o.AtMostOnce && o.Outbox != nil:
		return fmt.Errorf("%w: an outbox row is published at least once", ErrInvalid)
	case o.AtMostOnce && o.Delayed():
		return fmt.Errorf("%w: a delayed emit is at least once (it waits durably on the broker); drop AtMostOnce or the delay", ErrInvalid)
	case o.After > delay.Max:
		return fmt.Errorf("%w: delay %v is over the longest, %v (2^%d−1 s, about 8.5 years)", ErrInvalid, o.After, delay.Max, delay.Levels)
	}
	return nil
}

// CheckDue refuses a delayed emit made at now that would come due past
// delay.Max (an At too far ahead); it is Check's for what only the time of
// the emit decides.
func (o EmitOptions) CheckDue(now time.Time) error {
	if d := o.Due(now).Sub(now); d > delay.Max {
		return fmt.Errorf("%w: At %s is %v ahead, over the longest delay, %v (2^%d−1 s, about 8.5 years)",
			ErrInvalid, o.At.UTC().Format(time.RFC3339), d.Round(time.Second), delay.Max, delay.Levels)
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
	if err := o.checkTiming(); err != nil {
		return o, fmt.Errorf("emit options: %w", err)
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
	CodeConflict       = "conflict"        // the request's id was answered for another request (wire.Digest differs)
)
