// Package schema compiles the JSON Schemas modules declare for their
// bodies, validates bodies against them, digests them, and decides
// whether one version can read another's bodies (compat.go). ADR 34.
//
// A declared schema is untrusted input: a module process sends it to
// meshd. Compiling one loads nothing (no file, no URL: a $ref outside the
// document is refused), and its size is bounded.
package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/meshkit/mesh/internal/wire"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var printer = message.NewPrinter(language.English)

// MaxSize bounds a declared schema's document, in bytes.
const MaxSize = 256 << 10

// MaxDecls bounds how many schema versions one module declares.
const MaxDecls = 256

// ErrSchema is wrapped by every refusal of a declared schema (not JSON,
// not a schema, too big, a reference it may not load).
var ErrSchema = errors.New("invalid schema")

// ErrBody is wrapped by every refusal of a body that does not conform.
var ErrBody = errors.New("body does not conform to its schema")

// Compiled is a schema compiled once, to validate many bodies. It is safe
// for concurrent use.
type Compiled struct {
	// Version is the declared version (x-schema).
	Version string
	// Digest is the schema's SHA-256 (Digest).
	Digest string
	sch    *jsonschema.Schema
}

// refuseLoader loads nothing: a schema's $ref may point only inside it.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%w: %s: a schema may refer only to itself (no file, no URL)", ErrSchema, url)
}

// Compile compiles the JSON Schema doc (draft 2020-12 unless its $schema
// says otherwise) declared as version. The returned error wraps ErrSchema.
func Compile(version string, doc []byte) (*Compiled, error) {
	if err := wire.CheckSchema(version); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	if len(doc) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrSchema, len(doc), MaxSize)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("%w: not JSON: %v", ErrSchema, err)
	}
	switch v.(type) {
	case map[string]any, bool:
	default:
		return nil, fmt.Errorf("%w: a schema is an object or a boolean", ErrSchema)
	}
	const url = "mesh:///schema.json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		if errors.Is(err, ErrSchema) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrSchema, strings.ReplaceAll(err.Error(), url, "schema"))
	}
	return &Compiled{Version: version, Digest: Digest(doc), sch: sch}, nil
}

// Digest is the SHA-256 of a schema document, hex: of its compact form
// where it is JSON, so that layout does not change it.
func Digest(doc []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, doc) == nil {
		doc = b.Bytes()
	}
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:])
}

// Validate validates a JSON body. A body that is not JSON or does not
// conform gets an error wrapping ErrBody that names the JSON pointer and
// the keyword of the first rule it breaks ("/price: minimum: must be >=
// 0 but found -1"), and how many more it breaks.
func (c *Compiled) Validate(body []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w (version %s): not JSON: %v", ErrBody, c.Version, err)
	}
	err = c.sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("%w (version %s): %v", ErrBody, c.Version, err)
	}
	leaves := Violations(ve)
	msg := leaves[0].String()
	if len(leaves) > 1 {
		msg += fmt.Sprintf(" (and %d more)", len(leaves)-1)
	}
	return fmt.Errorf("%w (version %s): %s", ErrBody, c.Version, msg)
}

// A Violation is one rule a body breaks.
type Violation struct {
	// Pointer is the JSON pointer of the value in the body ("" for the
	// body itself).
	Pointer string
	// Keyword is the schema keyword it breaks ("minimum", "required").
	Keyword string
	// Message says how.
	Message string
}

// String is "POINTER: KEYWORD: MESSAGE", the pointer "/" for the body.
func (v Violation) String() string {
	p := v.Pointer
	if p == "" {
		p = "/"
	}
	return p + ": " + v.Keyword + ": " + v.Message
}

// Violations are the leaf errors of a validation error, sorted by
// pointer, then keyword.
func Violations(ve *jsonschema.ValidationError) []Violation {
	var out []Violation
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			out = append(out, violationOf(e))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Pointer != out[j].Pointer {
			return out[i].Pointer < out[j].Pointer
		}
		return out[i].Keyword < out[j].Keyword
	})
	return out
}

func violationOf(e *jsonschema.ValidationError) Violation {
	var p strings.Builder
	for _, tok := range e.InstanceLocation {
		p.WriteByte('/')
		p.WriteString(strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
	}
	kw := "schema"
	if path := e.ErrorKind.KeywordPath(); len(path) > 0 {
		kw = path[len(path)-1]
	}
	if _, ok := e.ErrorKind.(*kind.FalseSchema); ok {
		kw = "false"
	}
	msg := strings.TrimPrefix(e.ErrorKind.LocalizedString(printer), kw+": ") // some of the library's messages name it already
	return Violation{Pointer: p.String(), Keyword: kw, Message: msg}
}
