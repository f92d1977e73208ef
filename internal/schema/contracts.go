package schema

import (
	"errors"
	"fmt"
	"maps"
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

// Decl is one declared version of a body schema: of an emitted event's
// body (Event set), or of the request and response of a tool the module
// serves (Tool set).
type Decl struct {
	// Event is the relative event name, as in the module's Emits; ""
	// for a tool's schema.
	Event string
	// Tool is the key of a tool the module serves; "" for an event's
	// schema.
	Tool    string
	Version string
	// JSON is the event's body schema, or the tool's request schema
	// (empty for a tool: its requests are not checked).
	JSON []byte
	// Response is the tool's response schema (empty: its responses are
	// not checked); an event's schema has none.
	Response []byte
}

// Declared is what a node tells the mesh of one declared version (in its
// heartbeats): not the schema, its digest (the node's schemas
// announcement carries the documents).
type Declared struct {
	// Type is the full event type (module.<name>.<event>); "" for a
	// tool's schema.
	Type string `json:"type"`
	// Tool is the tool key of a tool's schema; "" for an event's.
	Tool    string `json:"tool,omitempty"`
	Version string `json:"version"`
	// Digest is the SHA-256 of the event's body schema, or of the tool's
	// request schema ("" when the tool declares none).
	Digest string `json:"digest"`
	// ResponseDigest is that of the tool's response schema ("" for an
	// event, or a tool that declares none).
	ResponseDigest string `json:"response_digest,omitempty"`
	// Current says the module emits this version now (the last it
	// declares for the type), or serves the tool by it; the others are
	// what it did before.
	Current bool `json:"current,omitempty"`
}

// CodeInvalidResponse is the code of the permanent tool error a caller
// gets when the server's response does not conform to the tool's
// declared response schema (beside wire.CodeInvalidRequest, which a
// request that does not conform to its schema gets).
const CodeInvalidResponse = "invalid_response"

// toolContract is the current version of a tool's schemas; a nil
// request or response is not checked.
type toolContract struct {
	version           string
	request, response *Compiled
}

// Contracts is one module's declarations, compiled at load: each emit of a
// declared type is checked against its current version, each delivery to
// a handler that declares what it reads against that, each request to and
// response of a tool with schemas against the tool's current version. A
// nil *Contracts checks nothing. It is safe for concurrent use once made.
type Contracts struct {
	current  map[string]*Compiled     // full type → the version emitted now
	tools    map[string]*toolContract // tool key → the version served now
	declared []Declared
	docs     map[string][]byte // digest → schema
	reads    map[string][]string
	validate bool
}

// New compiles a module's declarations: decls, versions of the bodies of
// events in emits and of the requests and responses of tools (oldest first
// per event or tool; the last is the current one), and reads, the versions
// the handler of each pattern reads. validate false keeps x-schema from
// the declarations but validates no body, request or response (a module
// config's skip_body_validation). New returns nil for a module that
// declares nothing. That a tool's schema is for a tool the module serves
// is CheckTools's to check, once Setup has served them.
func New(module string, emits []string, decls []Decl, reads map[string][]string, validate bool) (*Contracts, error) {
	if len(decls) == 0 && len(reads) == 0 {
		return nil, nil
	}
	if len(decls) > MaxDecls {
		return nil, fmt.Errorf("%w: %d schemas declared, at most %d", wire.ErrInvalid, len(decls), MaxDecls)
	}
	c := &Contracts{current: map[string]*Compiled{}, tools: map[string]*toolContract{}, docs: map[string][]byte{},
		reads: map[string][]string{}, validate: validate}
	seen := map[string]bool{}
	for _, d := range decls {
		if d.Tool != "" || d.Event == "" {
			if err := c.addTool(d, seen); err != nil {
				return nil, err
			}
			continue
		}
		if !slices.Contains(emits, d.Event) {
			return nil, fmt.Errorf("%w: schemas: event %q is not in the module's Emits", wire.ErrInvalid, d.Event)
		}
		if err := wire.CheckSchema(d.Version); err != nil {
			return nil, fmt.Errorf("schemas: %s version %q: %w", d.Event, d.Version, err)
		}
		if len(d.Response) > 0 {
			return nil, fmt.Errorf("%w: schemas: %s version %s has a Response schema, which only a tool's schema has", wire.ErrInvalid, d.Event, d.Version)
		}
		if seen["e\x00"+d.Event+"\x00"+d.Version] {
			return nil, fmt.Errorf("%w: schemas: %s version %s is declared twice", wire.ErrInvalid, d.Event, d.Version)
		}
		seen["e\x00"+d.Event+"\x00"+d.Version] = true
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

// addTool compiles one version of a tool's schemas, the tool's current
// one until a later version of it.
func (c *Contracts) addTool(d Decl, seen map[string]bool) error {
	switch {
	case d.Event != "":
		return fmt.Errorf("%w: schemas: a schema names the event %q and the tool %q: set one (Event for an emitted event's body, Tool for a served tool's request and response)",
			wire.ErrInvalid, d.Event, d.Tool)
	case d.Tool == "":
		return fmt.Errorf("%w: schemas: a schema (version %q) names neither an event nor a tool: set Event (an emitted event's body) or Tool (a served tool's request and response)",
			wire.ErrInvalid, d.Version)
	}
	if err := wire.ValidateToolKey(d.Tool); err != nil {
		return fmt.Errorf("schemas: %w", err)
	}
	if err := wire.CheckSchema(d.Version); err != nil {
		return fmt.Errorf("schemas: tool %s version %q: %w", d.Tool, d.Version, err)
	}
	if len(d.JSON) == 0 && len(d.Response) == 0 {
		return fmt.Errorf("%w: schemas: tool %s version %s declares neither a request schema (JSON) nor a response schema (Response)", wire.ErrInvalid, d.Tool, d.Version)
	}
	if seen["t\x00"+d.Tool+"\x00"+d.Version] {
		return fmt.Errorf("%w: schemas: tool %s version %s is declared twice", wire.ErrInvalid, d.Tool, d.Version)
	}
	seen["t\x00"+d.Tool+"\x00"+d.Version] = true
	tc := &toolContract{version: d.Version}
	decl := Declared{Tool: d.Tool, Version: d.Version, Current: true}
	for _, part := range []struct {
		what string
		doc  []byte
		comp **Compiled
		dig  *string
	}{{"request", d.JSON, &tc.request, &decl.Digest}, {"response", d.Response, &tc.response, &decl.ResponseDigest}} {
		if len(part.doc) == 0 {
			continue
		}
		comp, err := Compile(d.Version, part.doc)
		if err != nil {
			return fmt.Errorf("%w: schemas: tool %s version %s, its %s: %w", wire.ErrInvalid, d.Tool, d.Version, part.what, err)
		}
		*part.comp, *part.dig = comp, comp.Digest
		c.docs[comp.Digest] = slices.Clone(part.doc)
	}
	if c.tools[d.Tool] != nil {
		for i := range c.declared {
			if c.declared[i].Tool == d.Tool {
				c.declared[i].Current = false
			}
		}
	}
	c.tools[d.Tool] = tc
	c.declared = append(c.declared, decl)
	return nil
}

// CheckTools refuses a schema declared for a tool the module does not
// serve (once its Setup has served its tools): a misspelt key would
// silently check nothing.
func (c *Contracts) CheckTools(served []string) error {
	if c == nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(c.tools)) {
		if !slices.Contains(served, k) {
			return fmt.Errorf("%w: schemas: the module does not serve the tool %q (it serves %q)", wire.ErrInvalid, k, served)
		}
	}
	return nil
}

// Request checks a request to tool against the request schema of the
// tool's current version; a tool without one, or validation off, takes
// any. The error wraps ErrBody, naming the JSON pointer and the keyword:
// the caller gets it as a permanent tool error with code
// wire.CodeInvalidRequest, and the handler does not run.
func (c *Contracts) Request(tool string, body []byte) error {
	if tc := c.tool(tool); tc != nil && tc.request != nil {
		if err := tc.request.Validate(body); err != nil {
			return fmt.Errorf("request to %s: %w", tool, err)
		}
	}
	return nil
}

// Response checks a response of tool against the response schema of the
// tool's current version, as Request does requests; the caller gets the
// error as a permanent tool error with code CodeInvalidResponse.
func (c *Contracts) Response(tool string, body []byte) error {
	if tc := c.tool(tool); tc != nil && tc.response != nil {
		if err := tc.response.Validate(body); err != nil {
			return fmt.Errorf("response of %s: %w", tool, err)
		}
	}
	return nil
}

// tool is the current version of tool's schemas to check, or nil.
func (c *Contracts) tool(tool string) *toolContract {
	if c == nil || !c.validate {
		return nil
	}
	return c.tools[tool]
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

// Declared lists the declared versions, events' and tools', in
// declaration order.
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

// Doc is the schema of digest, if the module declares it: an event's body
// schema, or a tool's request or response schema.
func (c *Contracts) Doc(digest string) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	d, ok := c.docs[digest]
	return d, ok
}
