// Package schema builds the sdk.Schema declarations of a module's bodies
// (sdk.Module.Schemas): from a Go type with [Of], or from a schema file,
// typically embedded, with [File] and [MustFile].
//
// A module declares one or more versions of each event's schema, oldest
// first; the last is the one it emits now. The host validates every body
// of that event against it before publishing (an emit that breaks it fails
// with sdk.ErrInvalid naming the JSON pointer and the keyword) and sets
// the event's x-schema to its version:
//
//	//go:embed schemas
//	var schemas embed.FS
//
//	sdk.Module{
//		Name:  "umami",
//		Emits: []string{"site.created"},
//		Schemas: []sdk.Schema{
//			schema.MustFile(schemas, "schemas/site.created.1.json", "site.created", "1"),
//			schema.Of[SiteCreated]("site.created", "2"),
//		},
//	}
//
// A consumer says which versions its handler of a pattern reads with
// sdk.Module.Reads; the host dead-letters an event of another version with
// reason "schema".
//
// The package is a generator and a file reader only: it imports neither a
// broker client nor the runtime, and checks no body. The host compiles
// and enforces what it builds.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"reflect"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/meshkit/mesh/sdk"
)

// metaSchema is the $schema of a generated schema: JSON Schema 2020-12,
// the draft the host compiles by default.
const metaSchema = "https://json-schema.org/draft/2020-12/schema"

// Of returns version of the schema of event's body generated from the Go
// type T, as encoding/json marshals it, with github.com/invopop/jsonschema:
//
//   - a struct is an object whose properties are its exported fields,
//     named by their json tags (json:"-" leaves a field out; embedded
//     structs are flattened, as encoding/json does);
//   - a field without omitempty or omitzero is required;
//   - an object allows properties it does not list (no
//     additionalProperties: false), so a field added later, optional, is
//     compatible both ways: old consumers ignore it, new ones read old
//     bodies without it;
//   - time.Time is a string of format date-time, []byte a base64 string,
//     a map an object whose values have the schema of the map's (an
//     integer-keyed map's keys are digits), a slice an array;
//   - named types are described once, under $defs, and referred to as
//     #/$defs/NAME, inside the schema (it has no $id, and refers to no
//     file or URL, as the host requires); two types of one name from
//     different packages get distinct names;
//   - jsonschema struct tags add keywords (`jsonschema:"minimum=0"`,
//     `jsonschema:"enum=new,enum=paid"`), and a type with a JSONSchema or
//     JSONSchemaExtend method describes itself, by invopop/jsonschema's
//     rules.
//
// A nil slice, map or pointer marshals to null, which the schema of its
// field refuses: give such a field omitempty, keep it non-nil, or tag it
// `jsonschema:"nullable"`. A type with its own MarshalJSON is described by
// its Go structure, not by what it marshals to, unless it has a JSONSchema
// method.
//
// The schema is compact JSON, with $schema the 2020-12 meta-schema. The
// same T gives the same bytes, so the same digest.
//
// Of panics on a programming error, when T cannot be described: a channel,
// a function or a complex number in it, or a JSONSchema method that refers
// outside the schema. It is meant for package-level declarations and
// Module literals, where such a panic shows at the first test. The host
// checks event and version when the module is loaded.
func Of[T any](event, version string) sdk.Schema {
	t := reflect.TypeFor[T]()
	doc, err := generate(t)
	if err != nil {
		panic(fmt.Sprintf("schema.Of[%s](%q, %q): %v", t, event, version, err))
	}
	return sdk.Schema{Event: event, Version: version, JSON: doc}
}

// ForTool returns version of the schemas of a served tool's request (from
// Req) and response (from Resp), generated as Of generates an event's. It
// panics where Of does.
func ForTool[Req, Resp any](tool, version string) sdk.Schema {
	req, resp := reflect.TypeFor[Req](), reflect.TypeFor[Resp]()
	reqDoc, err := generate(req)
	if err == nil {
		var respDoc []byte
		if respDoc, err = generate(resp); err == nil {
			return sdk.Schema{Tool: tool, Version: version, JSON: reqDoc, Response: respDoc}
		}
	}
	panic(fmt.Sprintf("schema.ForTool[%s, %s](%q, %q): %v", req, resp, tool, version, err))
}

// File returns version of the schema of event's body read from path in
// fsys (an embed.FS, os.DirFS(dir), ...), as it is written. It checks that
// the file is a JSON object or boolean; the host compiles it when the
// module is loaded.
//
// Errors: the fs error for a file it cannot read (errors.Is(err,
// fs.ErrNotExist) for a missing one); sdk.ErrInvalid for a file that is
// not JSON, or is JSON but not an object or a boolean.
func File(fsys fs.FS, path, event, version string) (sdk.Schema, error) {
	doc, err := fs.ReadFile(fsys, path)
	if err != nil {
		return sdk.Schema{}, fmt.Errorf("schema of %s version %s: %w", event, version, err)
	}
	if err := checkDocument(doc); err != nil {
		return sdk.Schema{}, fmt.Errorf("%w: schema of %s version %s: %s %v", sdk.ErrInvalid, event, version, path, err)
	}
	return sdk.Schema{Event: event, Version: version, JSON: doc}, nil
}

// MustFile is File for a package-level variable or a Module literal: it
// panics with File's error.
func MustFile(fsys fs.FS, path, event, version string) sdk.Schema {
	s, err := File(fsys, path, event, version)
	if err != nil {
		panic(err)
	}
	return s
}

// checkDocument says why doc is not a JSON object or boolean.
func checkDocument(doc []byte) error {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return fmt.Errorf("is not JSON: %v", err)
	}
	switch v.(type) {
	case map[string]any, bool:
		return nil
	case []any:
		return fmt.Errorf("is a JSON array: a schema is an object or a boolean")
	case nil:
		return fmt.Errorf("is JSON null: a schema is an object or a boolean")
	default:
		return fmt.Errorf("is a JSON %T: a schema is an object or a boolean", v)
	}
}

// generate reflects t into a compact schema document. The root is t's own
// schema (not a $ref to it) unless t refers to itself, in which case it
// stays under $defs and the root refers to it.
func generate(t reflect.Type) (doc []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	doc, err = reflectType(t, true)
	if err != nil {
		return nil, err
	}
	if err := checkRefs(doc); err == errDangling {
		// t refers to itself: expanded into the root, its definition
		// is gone, and so is the target of its references.
		doc, err = reflectType(t, false)
		if err != nil {
			return nil, err
		}
	}
	if err := checkRefs(doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// reflectType runs the mesh's Reflector on t.
func reflectType(t reflect.Type, expanded bool) ([]byte, error) {
	n := namer{names: map[reflect.Type]string{}, types: map[string]reflect.Type{}}
	r := &jsonschema.Reflector{
		Anonymous:                 true, // no $id: the schema is its own, not a URL's
		AllowAdditionalProperties: true, // an open content model
		ExpandedStruct:            expanded,
		Namer:                     n.name,
	}
	s := r.ReflectFromType(t)
	s.ID = ""
	s.Version = metaSchema
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// namer names the $defs of one schema: a type's own name, made safe for a
// JSON pointer (a generic type's name holds its arguments' package
// paths), qualified by its package's name, then numbered, when another
// type of the schema has it.
type namer struct {
	names map[reflect.Type]string
	types map[string]reflect.Type
}

func (n namer) name(t reflect.Type) string {
	if t.Name() == "" {
		return ""
	}
	if name, ok := n.names[t]; ok {
		return name
	}
	base := safeName(t.Name())
	name := base
	if _, taken := n.types[name]; taken {
		name = safeName(path.Base(t.PkgPath())) + "." + base
		for i := 2; ; i++ {
			if _, taken := n.types[name]; !taken {
				break
			}
			name = fmt.Sprintf("%s.%s%d", safeName(path.Base(t.PkgPath())), base, i)
		}
	}
	n.names[t] = name
	n.types[name] = t
	return name
}

// safeName keeps letters, digits, '_', '-' and '.', and writes '_' for the
// rest.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
			return r
		}
		return '_'
	}, s)
}

// errDangling is checkRefs's error for a reference to a definition the
// schema does not hold.
var errDangling = errors.New("a $ref to a definition the schema does not hold")

// checkRefs checks that every $ref of doc is local and resolves, and that
// no subschema has an $id (which would move what a local $ref means).
// Values of const, default, enum and examples are data, not schemas: they
// are not looked into.
func checkRefs(doc []byte) error {
	var root any
	if err := json.Unmarshal(doc, &root); err != nil {
		return err
	}
	obj, ok := root.(map[string]any)
	if !ok {
		return nil // a boolean schema
	}
	defs, _ := obj["$defs"].(map[string]any)
	var walk func(v any, top bool) error
	walk = func(v any, top bool) error {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				switch k {
				case "const", "default", "enum", "examples":
					continue
				case "$id", "$anchor", "$dynamicAnchor":
					if !top {
						return fmt.Errorf("a JSONSchema method sets %s %v: the schema must be one document", k, e)
					}
				case "$ref", "$dynamicRef":
					ref, isRef := e.(string)
					if !isRef {
						break // a property of that name
					}
					if ref == "#" {
						continue
					}
					name, ok := strings.CutPrefix(ref, "#/$defs/")
					if !ok {
						return fmt.Errorf("%s %q refers outside the schema: it may refer only to #/$defs/... inside it", k, ref)
					}
					if _, ok := defs[name]; !ok {
						return errDangling
					}
					continue
				}
				if err := walk(e, false); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range v {
				if err := walk(e, false); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(obj, true)
}
