// Package schema compiles the JSON Schemas modules declare for their
// bodies, validates bodies against them, digests them, and decides
// whether one version can read another's bodies (compat.go). ADR 34.
//
// A declared schema is untrusted input: a module process sends it to
// meshd. Compiling one loads nothing (no file, no URL: a $ref outside the
// document is refused), and its size is bounded, and so is what it may
// cost: Compile refuses a schema that fans out too much, Validate a body
// whose check would cost more than its budget (bounds.go).
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
	cost   *costGraph
}

// refuseLoader loads nothing: a schema's $ref may point only inside it.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%w: %s: a schema may refer only to itself (no file, no URL)", ErrSchema, url)
}

// Compile compiles the JSON Schema doc (draft 2020-12 unless its $schema
// says otherwise) declared as version. The returned error wraps ErrSchema.
// Besides a document that is not a schema, it refuses one that would
// check a value against more than MaxFanOut subschemas, one with a cycle
// of in-place applicators ($ref back to itself on the same value), more
// than MaxSubschemas subschemas, a number beyond MaxNumberLen or
// MaxNumberExponent, a regular expression beyond MaxPatternSize (or all
// of them beyond MaxPatternsSize), and a $dynamicRef or $recursiveRef
// whose target depends on the dynamic scope across resources (bounds.go),
// naming what and where.
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
	if err := checkDoc(v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	const url = "mesh:///schema.json"
	pats := newPatterns()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	c.UseRegexpEngine(pats.compile)
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	sch, err := c.Compile(url)
	pats.compiling.Store(false) // from now on, it compiles bodies' strings ("format": "regex")
	if err != nil {
		if errors.Is(err, ErrSchema) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrSchema, strings.ReplaceAll(err.Error(), url, "schema"))
	}
	cost, err := buildGraph(sch, pats)
	if err != nil {
		return nil, err
	}
	if err := cost.check(); err != nil {
		return nil, err
	}
	return &Compiled{Version: version, Digest: Digest(doc), sch: sch, cost: cost}, nil
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
// 0 but found -1"), and how many more it breaks (it formats that one
// only).
//
// Before validating, it estimates what checking the body would cost, and
// refuses a body over its budget (MaxSteps, or StepsPerByte for each of
// its bytes, whichever is more) without checking it, and a body holding a
// number beyond MaxNumberLen or MaxNumberExponent; both errors wrap
// ErrBody.
func (c *Compiled) Validate(body []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w (version %s): not JSON: %v", ErrBody, c.Version, err)
	}
	if err := c.withinBudget(v, len(body)); err != nil {
		return err
	}
	err = c.sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("%w (version %s): %v", ErrBody, c.Version, err)
	}
	first, n := firstViolation(ve)
	msg := first.String()
	if n > 1 {
		msg += fmt.Sprintf(" (and %d more)", n-1)
	}
	return fmt.Errorf("%w (version %s): %s", ErrBody, c.Version, msg)
}

// budget is the budget of checking a body of size bytes, in ticks.
func budget(size int) uint64 {
	return satMul(max(MaxSteps, satMul(StepsPerByte, uint64(size))), stepTicks)
}

// withinBudget refuses v, decoded from a body of size bytes, if checking
// it would cost more than its budget or it holds a number out of bounds.
func (c *Compiled) withinBudget(v any, size int) error {
	if c.cost == nil {
		return nil
	}
	limit := budget(size)
	_, over, at, depth, err := c.cost.estimate(v, limit)
	if err != nil {
		return fmt.Errorf("%w (version %s): %v", ErrBody, c.Version, err)
	}
	if over {
		return fmt.Errorf("%w (version %s): too costly to check: more than %s steps, the budget of a body of %s bytes (MaxSteps, StepsPerByte); the estimate passed it at %s, %s deep",
			ErrBody, c.Version, printer.Sprint(limit/stepTicks), printer.Sprint(size), shorten(at), levels(depth))
	}
	return nil
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
	walkLeaves(ve, func(e *jsonschema.ValidationError) { out = append(out, violationOf(e)) })
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Pointer != out[j].Pointer {
			return out[i].Pointer < out[j].Pointer
		}
		return out[i].Keyword < out[j].Keyword
	})
	return out
}

// firstViolation is the first of ve's leaf errors by pointer, then
// keyword (Violations' first), and how many leaves ve has: it formats the
// message of that one only, and sorts nothing.
func firstViolation(ve *jsonschema.ValidationError) (Violation, int) {
	var first *jsonschema.ValidationError
	var ptr, kw string
	n := 0
	walkLeaves(ve, func(e *jsonschema.ValidationError) {
		n++
		p, k := pointerOf(e), keywordOf(e)
		if first == nil || p < ptr || p == ptr && k < kw {
			first, ptr, kw = e, p, k
		}
	})
	return violationOf(first), n
}

// walkLeaves calls leaf for each of ve's errors without causes, in the
// library's order.
func walkLeaves(ve *jsonschema.ValidationError, leaf func(*jsonschema.ValidationError)) {
	if len(ve.Causes) == 0 {
		leaf(ve)
		return
	}
	for _, c := range ve.Causes {
		walkLeaves(c, leaf)
	}
}

func pointerOf(e *jsonschema.ValidationError) string {
	var p strings.Builder
	for _, tok := range e.InstanceLocation {
		p.WriteByte('/')
		p.WriteString(escape(tok))
	}
	return p.String()
}

func keywordOf(e *jsonschema.ValidationError) string {
	if _, ok := e.ErrorKind.(*kind.FalseSchema); ok {
		return "false"
	}
	if path := e.ErrorKind.KeywordPath(); len(path) > 0 {
		return path[len(path)-1]
	}
	return "schema"
}

func violationOf(e *jsonschema.ValidationError) Violation {
	kw := keywordOf(e)
	msg := strings.TrimPrefix(e.ErrorKind.LocalizedString(printer), kw+": ") // some of the library's messages name it already
	return Violation{Pointer: pointerOf(e), Keyword: kw, Message: msg}
}
