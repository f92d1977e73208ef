package wire

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// EmitType is the full event type a module's emit of name makes, if the
// module may emit it: under module.<module>. always; with full set, a
// type elsewhere only where one of grants (topic patterns) matches.
func EmitType(module, name string, full bool, grants []string) (string, error) {
	if !full {
		if err := ValidateRelativeType(name); err != nil {
			return "", err
		}
		t := ModuleEventType(module, name)
		return t, ValidateEventType(t)
	}
	if err := ValidateEventType(name); err != nil {
		return "", err
	}
	if strings.HasPrefix(name, "module."+module+".") {
		return name, nil
	}
	for _, g := range grants {
		if MatchPattern(g, name) {
			return name, nil
		}
	}
	return "", fmt.Errorf("%w: module %s may emit %s only if its node config grants it (the module's emit_grants in meshd's config)", ErrForbidden, module, name)
}

// CheckDeclared refuses, with ErrForbidden, an emit of eventType in the
// module's own namespace (module.<module>.<name>) when emits, the
// module's declared event names, does not list <name>: what a module
// emits is what the mesh's graph shows and what its peers may rely on.
// Types outside the namespace are governed by the emit grants instead.
func CheckDeclared(module, eventType string, emits []string) error {
	name, ok := strings.CutPrefix(eventType, "module."+module+".")
	if !ok || slices.Contains(emits, name) {
		return nil
	}
	return fmt.Errorf("%w: module %s emits %s, which it does not declare: add %q to its Emits (or allow undeclared emits in its config)",
		ErrForbidden, module, eventType, name)
}

// EncodeBody turns an emit's body or a call's request into JSON:
// json.RawMessage and []byte are taken as JSON as they are and must be
// valid, anything else is marshalled. Over maxBytes is refused. Every
// refusal wraps ErrInvalid.
func EncodeBody(body any, maxBytes int) ([]byte, error) {
	var raw []byte
	switch b := body.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("%w: body is not JSON: %v", ErrInvalid, err)
		}
	}
	if len(raw) > maxBytes {
		return nil, fmt.Errorf("%w: body too large: %d bytes, the limit is %d (max_body_bytes)", ErrInvalid, len(raw), maxBytes)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, EmptyBodyRefusal)
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%w: body is not JSON: %d bytes are not valid JSON", ErrInvalid, len(raw))
	}
	return raw, nil
}

// EmptyBodyRefusal is EncodeBody's words for an empty body. A module
// process whose body could not be encoded sends its node an empty one, for
// the node to refuse it where it refuses a body in-process (after the
// name, the grants and a delay), and knows that refusal by these words.
const EmptyBodyRefusal = "body is not JSON: 0 bytes are not valid JSON"

// SourceEmit checks an emit made from outside the modules (an operator,
// the node itself, a test): source is one word, eventType a full valid
// type, opts the sdk's emit options and body JSON within maxBytes. It
// returns the body as JSON and the options folded.
func SourceEmit[T any](source, eventType string, body any, opts []T, maxBytes int) ([]byte, EmitOptions, error) {
	if err := ValidateWord("source", source); err != nil {
		return nil, EmitOptions{}, err
	}
	if err := ValidateEventType(eventType); err != nil {
		return nil, EmitOptions{}, err
	}
	o, err := ApplyEmitOptions(opts)
	if err != nil {
		return nil, o, err
	}
	raw, err := EncodeBody(body, maxBytes)
	if err != nil {
		return nil, o, fmt.Errorf("emit %s: %w", eventType, err)
	}
	return raw, o, nil
}

// checkEmitsName refuses a full event type in a module's Emits, which
// lists its own event names, relative to module.<module>: the name would
// declare module.<module>.<the full type>, which nothing emits.
func checkEmitsName(module, e string) error {
	if ValidateEventType(e) != nil {
		return nil // not shaped as a full type: a relative name
	}
	if rest, ok := strings.CutPrefix(e, "module."+module+"."); ok {
		return invalid("event name", e, "is a full event type, but Emits lists the module's own event names, relative to module.%s. (this one declares module.%s.%s): write %q", module, module, e, rest)
	}
	return invalid("event name", e, "is a full event type, but Emits lists the module's own event names, relative to module.%s. (this one declares module.%s.%s): "+
		"a type outside the module's namespace is not declared here; emit it with sdk.AsFullType() where the module's emit grants (emit_grants in meshd's config) allow it", module, module, e)
}

// Module kinds besides the plain one (""); sdk.KindDispatcher and
// sdk.KindAgent are these.
const (
	KindDispatcher = "dispatcher"
	KindAgent      = "agent"
)

// ValidateModule checks what a module declares: its name one word, its
// kind known, what it emits relative event names and what it calls tool
// keys.
func ValidateModule(name, kind string, emits, calls []string) error {
	if err := ValidateWord("module name", name); err != nil {
		return fmt.Errorf("load module: %w", err)
	}
	switch kind {
	case "", KindDispatcher, KindAgent:
	default:
		return fmt.Errorf("load module %s: %w: kind %q is not %q, %q or empty", name, ErrInvalid, kind, KindDispatcher, KindAgent)
	}
	for _, e := range emits {
		if err := ValidateRelativeType(e); err != nil {
			return fmt.Errorf("load module %s: emits: %w", name, err)
		}
		if err := checkEmitsName(name, e); err != nil {
			return fmt.Errorf("load module %s: emits: %w", name, err)
		}
	}
	for _, c := range calls {
		if err := ValidateToolKey(c); err != nil {
			return fmt.Errorf("load module %s: calls: %w", name, err)
		}
	}
	return nil
}
