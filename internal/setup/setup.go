// Package setup records what a module's Setup subscribes (On) and serves
// (Serve), by the rules every host applies the same way: the runtime
// in-process, a module process (sdk/process) and sdk/meshtest.
//
//	rec := setup.New("notifier", grants)
//	o, optErr := wire.ApplyHandlerOptions(opts)
//	err := rec.On("module.umami.#", handler, o, optErr) // during Setup
//	subs, tools := rec.Fix()                 // Setup returned
package setup

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/meshkit/mesh/internal/wire"
)

// Entry is a pattern or tool key with its handler (an sdk.Handler or an
// sdk.ToolHandler).
type Entry struct {
	Key     string
	Handler any
	// Prefetch is a consumed queue's (Consume), and Exclusive whether the
	// module is to be its only consumer (Exclusive).
	Prefetch  int
	Exclusive bool
	// Options are the handler's options (sdk.HandlerOption).
	Options wire.HandlerOptions
}

// Recorder records one module's subscriptions and tools. It is safe for
// concurrent use.
type Recorder struct {
	module string
	grants []string // tool patterns the module may serve; nil: no limit
	// consumeGrants are the queue name patterns the module may consume;
	// nil: no limit.
	consumeGrants []string

	mu       sync.Mutex
	fixed    bool
	subs     []Entry
	tools    []Entry
	consumes []Entry
}

// New records for module, which may serve the tools grants match (nil
// places no limit).
func New(module string, toolGrants []string) *Recorder {
	return &Recorder{module: module, grants: toolGrants}
}

// On records a subscription with its options. A bad pattern, a nil
// handler, a bad option or a pattern already subscribed is refused with
// wire.ErrInvalid; after Fix, anything with wire.ErrAlreadyStarted.
func (r *Recorder) On(pattern string, h any, o wire.HandlerOptions, optErr error) error {
	if err := wire.ValidateSubscription(pattern); err != nil {
		return fmt.Errorf("on: %w", err)
	}
	if h == nil {
		return fmt.Errorf("on %q: %w: handler is nil", pattern, wire.ErrInvalid)
	}
	if optErr != nil {
		return fmt.Errorf("on %q: %w", pattern, optErr)
	}
	return r.add(&r.subs, "on", "pattern already subscribed", Entry{Key: pattern, Handler: h, Options: o})
}

// Serve records a tool with its options. A bad key, a nil handler, a bad
// option (a filter: a tool answers every request) or a tool already served
// is refused with wire.ErrInvalid, a tool the grants do not match with
// wire.ErrForbidden; after Fix, anything with wire.ErrAlreadyStarted.
func (r *Recorder) Serve(key string, h any, o wire.HandlerOptions, optErr error) error {
	if err := wire.ValidateToolKey(key); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if h == nil {
		return fmt.Errorf("serve %q: %w: handler is nil", key, wire.ErrInvalid)
	}
	if optErr != nil {
		return fmt.Errorf("serve %q: %w", key, optErr)
	}
	if o.Filter != nil {
		return fmt.Errorf("serve %q: %w: a tool answers every request it is sent, so Filter does not apply to Serve "+
			"(filter in the handler, and answer with a Permanent error what it does not take)", key, wire.ErrInvalid)
	}
	if err := wire.CheckToolGrant(r.module, key, r.grants); err != nil {
		return fmt.Errorf("serve %q: %w", key, err)
	}
	return r.add(&r.tools, "serve", "tool already served", Entry{Key: key, Handler: h, Options: o})
}

// GrantConsumes limits Consume to the queues whose names the topic
// patterns match (nil: no limit). Call it before Setup runs.
func (r *Recorder) GrantConsumes(patterns []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.consumeGrants = patterns
}

// MaxConsumePrefetch bounds a consumed queue's prefetch.
const MaxConsumePrefetch = 1000

// Consume records h as the consumer of an existing broker queue, with
// prefetch unacknowledged messages at most (and as many calls at once),
// and its options (AllowDuplicates refused: such messages are never
// de-duplicated).
func (r *Recorder) Consume(queue string, prefetch int, h any, o wire.HandlerOptions, optErr error) error {
	if err := wire.ValidateQueueName(queue); err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	if h == nil {
		return fmt.Errorf("consume %q: %w: handler is nil", queue, wire.ErrInvalid)
	}
	if optErr != nil {
		return fmt.Errorf("consume %q: %w", queue, optErr)
	}
	if o.AllowDuplicates {
		return fmt.Errorf("consume %q: %w: the messages of a consumed queue are never de-duplicated, so AllowDuplicates does not apply to Consume (drop it)", queue, wire.ErrInvalid)
	}
	if prefetch < 1 || prefetch > MaxConsumePrefetch {
		return fmt.Errorf("consume %q: %w: prefetch %d is not from 1 to %d", queue, wire.ErrInvalid, prefetch, MaxConsumePrefetch)
	}
	r.mu.Lock()
	grants := r.consumeGrants
	r.mu.Unlock()
	if grants != nil && !slices.ContainsFunc(grants, func(g string) bool { return wire.ConsumeGranted(g, queue) }) {
		own := ""
		if strings.HasPrefix(queue, wire.MeshQueuePrefix) {
			own = " (the mesh's own queues are granted by their exact name only, never by a wildcard)"
		}
		return fmt.Errorf("consume %q: %w: module %s's entry in mesh.yaml does not grant it (%s)%s: add %q to its consumes:",
			queue, wire.ErrForbidden, r.module, wire.GrantsHave("consumes", grants), own, queue)
	}
	return r.add(&r.consumes, "consume", "queue already consumed", Entry{Key: queue, Handler: h, Prefetch: prefetch, Options: o})
}

// Exclusive marks a queue recorded by Consume to be consumed by this
// module alone.
func (r *Recorder) Exclusive(queue string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fixed {
		return fmt.Errorf("exclusive %q: %w", queue, wire.ErrAlreadyStarted)
	}
	for i := range r.consumes {
		if r.consumes[i].Key == queue {
			r.consumes[i].Exclusive = true
			return nil
		}
	}
	return fmt.Errorf("exclusive %q: %w: module %s does not consume that queue (call Consume first)", queue, wire.ErrInvalid, r.module)
}

// Consumes reports whether Consume recorded queue.
func (r *Recorder) Consumes(queue string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.consumes, func(e Entry) bool { return e.Key == queue })
}

// Consumed returns the queues recorded by Consume. Call it after Fix.
func (r *Recorder) Consumed() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.consumes)
}

func (r *Recorder) add(to *[]Entry, verb, dup string, e Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fixed {
		return fmt.Errorf("%s %q: %w", verb, e.Key, wire.ErrAlreadyStarted)
	}
	if slices.ContainsFunc(*to, func(o Entry) bool { return o.Key == e.Key }) {
		return fmt.Errorf("%s %q: %w: %s by module %s", verb, e.Key, wire.ErrInvalid, dup, r.module)
	}
	*to = append(*to, e)
	return nil
}

// Fix ends Setup and returns what it recorded, in order. On and Serve are
// refused from then on.
func (r *Recorder) Fix() (subs, tools []Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fixed = true
	return slices.Clone(r.subs), slices.Clone(r.tools)
}
