package schema

import (
	"errors"
	"fmt"
	"slices"

	"github.com/meshkit/mesh/internal/wire"
)

// AnyVersion in a Reads list reads every version; NoVersion ("") is an
// event without x-schema.
const (
	AnyVersion = "*"
	NoVersion  = ""
)

// ErrVersion is wrapped by the refusal of an event whose x-schema is not
// one its handler reads: it is dead-lettered with reason "schema".
var ErrVersion = errors.New("schema version not read")

// Decl is one declared version of an emitted event's body schema.
type Decl struct {
	// Event is the relative event name, as in the module's Emits.
	Event   string
	Version string
	JSON    []byte
}

// Declared is what a node tells the mesh of one declared version (in its
// heartbeats): not the schema, its digest (the node's schemas tool serves
// the schema by digest).
type Declared struct {
	// Type is the full event type (module.<name>.<event>).
	Type    string `json:"type"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Current says the module emits this version now (the last it
	// declares for the type); the others are what it emitted before.
	Current bool `json:"current,omitempty"`
}

// Contracts is one module's declarations, compiled at load: each emit of a
// declared type is checked against its current version, each delivery to
// a handler that declares what it reads against that. A nil *Contracts
// checks nothing. It is safe for concurrent use once made.
type Contracts struct {
	current  map[string]*Compiled // full type → the version emitted now
	declared []Declared
	docs     map[string][]byte // digest → schema
	reads    map[string][]string
	validate bool
}

// New compiles a module's declarations: decls, versions of the bodies of
// events in emits (oldest first per event; the last is the current one),
// and reads, the versions the handler of each pattern reads. validate
// false keeps x-schema from the declarations but does not validate
// bodies (a module config's skip_body_validation). New returns nil for
// a module that declares nothing.
func New(module string, emits []string, decls []Decl, reads map[string][]string, validate bool) (*Contracts, error) {
	if len(decls) == 0 && len(reads) == 0 {
		return nil, nil
	}
	if len(decls) > MaxDecls {
		return nil, fmt.Errorf("%w: %d schemas declared, at most %d", wire.ErrInvalid, len(decls), MaxDecls)
	}
	c := &Contracts{current: map[string]*Compiled{}, docs: map[string][]byte{}, reads: map[string][]string{}, validate: validate}
	seen := map[string]bool{}
	for _, d := range decls {
		if !slices.Contains(emits, d.Event) {
			return nil, fmt.Errorf("%w: schemas: event %q is not in the module's Emits", wire.ErrInvalid, d.Event)
		}
		if err := wire.CheckSchema(d.Version); err != nil {
			return nil, fmt.Errorf("schemas: %s version %q: %w", d.Event, d.Version, err)
		}
		if seen[d.Event+"\x00"+d.Version] {
			return nil, fmt.Errorf("%w: schemas: %s version %s is declared twice", wire.ErrInvalid, d.Event, d.Version)
		}
		seen[d.Event+"\x00"+d.Version] = true
		comp, err := Compile(d.Version, d.JSON)
		if err != nil {
			return nil, fmt.Errorf("%w: schemas: %s version %s: %w", wire.ErrInvalid, d.Event, d.Version, err)
		}
		t := wire.ModuleEventType(module, d.Event)
		if prev := c.current[t]; prev != nil {
			for i := range c.declared {
				if c.declared[i].Type == t {
					c.declared[i].Current = false
				}
			}
		}
		c.current[t] = comp
		c.declared = append(c.declared, Declared{Type: t, Version: d.Version, Digest: comp.Digest, Current: true})
		c.docs[comp.Digest] = slices.Clone(d.JSON)
	}
	for p, vs := range reads {
		if err := wire.ValidatePattern(p); err != nil {
			return nil, fmt.Errorf("reads: %w", err)
		}
		if len(vs) == 0 {
			return nil, fmt.Errorf("%w: reads: pattern %q lists no version (%q reads any)", wire.ErrInvalid, p, AnyVersion)
		}
		for _, v := range vs {
			if v == NoVersion || v == AnyVersion {
				continue
			}
			if err := wire.CheckSchema(v); err != nil {
				return nil, fmt.Errorf("reads: pattern %q: %w", p, err)
			}
		}
		c.reads[p] = slices.Clone(vs)
	}
	return c, nil
}

// CheckPatterns refuses reads declared for a pattern the module does not
// subscribe (once its Setup has subscribed patterns): a misspelt key
// would silently read everything.
func (c *Contracts) CheckPatterns(patterns []string) error {
	if c == nil {
		return nil
	}
	for p := range c.reads {
		if !slices.Contains(patterns, p) {
			return fmt.Errorf("%w: reads: the module does not subscribe %q (it subscribes %q)", wire.ErrInvalid, p, patterns)
		}
	}
	return nil
}

// Emit checks an emit of eventType with body, where the emit asked for
// x-schema requested (or ""), and returns the x-schema it gets. For a
// declared type, that is the current version (an emit asking for another
// is refused) and the body must conform. The error wraps wire.ErrInvalid.
func (c *Contracts) Emit(eventType string, body []byte, requested string) (string, error) {
	if c == nil {
		return requested, nil
	}
	comp := c.current[eventType]
	if comp == nil {
		return requested, nil
	}
	if requested != "" && requested != comp.Version {
		return "", fmt.Errorf("%w: x-schema %q asked for, but the module declares version %s of %s", wire.ErrInvalid, requested, comp.Version, eventType)
	}
	if c.validate {
		if err := comp.Validate(body); err != nil {
			return "", fmt.Errorf("%w: %w", wire.ErrInvalid, err)
		}
	}
	return comp.Version, nil
}

// Read checks a delivery of version (its x-schema) to the handler of
// pattern; the error wraps ErrVersion.
func (c *Contracts) Read(pattern, version string) error {
	if c == nil {
		return nil
	}
	vs, ok := c.reads[pattern]
	if !ok || slices.Contains(vs, AnyVersion) || slices.Contains(vs, version) {
		return nil
	}
	got := version
	if got == "" {
		got = "none"
	}
	return fmt.Errorf("%w: the handler of %q reads versions %q, the event has %s", ErrVersion, pattern, vs, got)
}

// Declared lists the declared versions, in declaration order.
func (c *Contracts) Declared() []Declared {
	if c == nil {
		return nil
	}
	return slices.Clone(c.declared)
}

// Reads is a copy of the declared reads (pattern → versions).
func (c *Contracts) Reads() map[string][]string {
	if c == nil || len(c.reads) == 0 {
		return nil
	}
	out := make(map[string][]string, len(c.reads))
	for p, vs := range c.reads {
		out[p] = slices.Clone(vs)
	}
	return out
}

// Doc is the schema of digest, if the module declares it.
func (c *Contracts) Doc(digest string) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	d, ok := c.docs[digest]
	return d, ok
}
