// Package filter parses and evaluates subscription filters: the predicates
// a module attaches to a handler (sdk.Filter) so that the host hands it only
// the events it wants. Every host (the runtime in-process, a module process's
// host in meshd, and sdk/meshtest) evaluates them with this package, before
// the handler runs: an event no filter accepts is acknowledged and counted,
// and costs no attempt.
//
// A filter is an expression over the event's attributes, headers and JSON
// body, in the manner of a JMS or Service Bus SQL selector:
//
//	source = 'billing' and body.total >= 100
//	header.x-tenant in ('acme', 'globex') or not schema exists
//	not (node = 'edge-1' or body.order.status = "cancelled")
//
// Operands are the attributes type, source, node, schema, user (the
// publishing broker user) and queue (a consumed queue's name), header.NAME
// (one of the event's other headers, by its exact name) and body or
// body.PATH (a field of the JSON body: PATH is dot-separated keys, and a
// number indexes an array). Operators are = (or ==), != (or <>), <, <=, >,
// >=, in (a parenthesised list of up to 64 literals), not in, and exists;
// and, or, not and parentheses combine them (keywords in any case). Literals
// are strings in single or double quotes (a backslash escapes the quote or
// itself), numbers, true, false and null.
//
// Comparisons are typed. An attribute or header is text: against a string
// literal it compares as text (< and > in byte order), against a number as
// the number the text spells, against true or false as the text "true" or
// "false". A body field compares with a literal of its JSON type. A
// comparison whose operand is missing (no such header or field, an empty
// attribute, a body that is not JSON), or whose types differ, is false,
// for != and not in too; not inverts it, so "not body.x = 1" holds where x
// is missing. Any JSON value compares with null: "body.x != null" holds
// where x is there and not null. Text that is to be a number is read as a
// literal is (no hexadecimal, underscores or infinities).
//
// Parse bounds what a filter may cost, since a module is untrusted and its
// host evaluates the filter: at most MaxBytes of text, MaxDepth levels of
// nesting and MaxTerms comparisons.
package filter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Bounds of a filter.
const (
	MaxBytes = 1024 // text of the expression
	MaxDepth = 16   // nesting of parentheses and not
	MaxTerms = 64   // comparisons, and literals in one in list
)

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("invalid filter")

// Event is what a filter reads of an event.
type Event struct {
	Type, Source, Node, Schema, User, Queue string
	Headers                                 map[string]string
	Body                                    []byte

	parsed bool // the body was parsed (into body, or found not JSON: body nil and bodyOK false)
	bodyOK bool
	body   any
}

// Filter is a parsed filter expression. Its zero value is not usable; a nil
// *Filter accepts every event.
type Filter struct {
	text string
	root node
}

// String is the filter's text as it was parsed.
func (f *Filter) String() string {
	if f == nil {
		return ""
	}
	return f.text
}

// Match reports whether the filter accepts ev. A nil filter accepts every
// event. ev's body is parsed at most once, however many filters read it.
func (f *Filter) Match(ev *Event) bool {
	if f == nil {
		return true
	}
	return f.root.eval(ev)
}

// Parse parses a filter expression. Every error wraps ErrInvalid and says
// where the expression breaks which rule.
func Parse(text string) (*Filter, error) {
	if len(text) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes is over %d", ErrInvalid, len(text), MaxBytes)
	}
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("%w: the expression is empty", ErrInvalid)
	}
	toks, err := lex(text)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	root, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tEOF {
		return nil, p.errAt(t, "expected and, or or the end of the filter")
	}
	return &Filter{text: text, root: root}, nil
}

// node is a parsed expression.
type node interface{ eval(*Event) bool }

type (
	andNode struct{ a, b node }
	orNode  struct{ a, b node }
	notNode struct{ a node }
	// cmpNode compares an operand with literals: op is one of = != < <= >
	// >= in, or exists (no literal).
	cmpNode struct {
		operand operand
		op      string
		lits    []literal
	}
)

func (n andNode) eval(ev *Event) bool { return n.a.eval(ev) && n.b.eval(ev) }
func (n orNode) eval(ev *Event) bool  { return n.a.eval(ev) || n.b.eval(ev) }
func (n notNode) eval(ev *Event) bool { return !n.a.eval(ev) }

// operand is what a comparison reads: an attribute, a header, or the body
// (path nil for the whole body).
type operand struct {
	attr   string // "type", "source", ..., "header", "body"
	header string
	path   []string
}

// literalKind is a literal's type.
type literalKind int

const (
	litString literalKind = iota
	litNumber
	litBool
	litNull
)

type literal struct {
	kind literalKind
	s    string
	n    float64
	b    bool
}

// value is what an operand reads: text (attributes, headers), or a JSON
// value (the body). ok is false where it is missing.
func (o operand) value(ev *Event) (text string, jsonValue any, isJSON, ok bool) {
	switch o.attr {
	case "type":
		return ev.Type, nil, false, ev.Type != ""
	case "source":
		return ev.Source, nil, false, ev.Source != ""
	case "node":
		return ev.Node, nil, false, ev.Node != ""
	case "schema":
		return ev.Schema, nil, false, ev.Schema != ""
	case "user":
		return ev.User, nil, false, ev.User != ""
	case "queue":
		return ev.Queue, nil, false, ev.Queue != ""
	case "header":
		v, ok := ev.Headers[o.header]
		return v, nil, false, ok
	}
	v, ok := ev.field(o.path)
	return "", v, true, ok
}

// field is the body's value at path, if the body is JSON and has one.
func (ev *Event) field(path []string) (any, bool) {
	if !ev.parsed {
		ev.parsed = true
		d := json.NewDecoder(bytes.NewReader(ev.Body))
		d.UseNumber()
		if json.Valid(ev.Body) && d.Decode(&ev.body) == nil {
			ev.bodyOK = true
		} else {
			ev.body = nil
		}
	}
	if !ev.bodyOK {
		return nil, false
	}
	v := ev.body
	for _, k := range path {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[k]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func (n cmpNode) eval(ev *Event) bool {
	text, jv, isJSON, ok := n.operand.value(ev)
	if !ok {
		return false
	}
	switch n.op {
	case "exists":
		return true
	case "in", "notin":
		in, comparable := false, false
		for _, l := range n.lits {
			c, ok := compare(text, jv, isJSON, l)
			comparable = comparable || ok
			in = in || (ok && c == 0)
		}
		if n.op == "notin" {
			return comparable && !in // as !=: false when nothing in the list compares
		}
		return in
	}
	c, ok := compare(text, jv, isJSON, n.lits[0])
	if !ok {
		return false
	}
	switch n.op {
	case "=":
		return c == 0
	case "!=":
		return c != 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	case ">=":
		return c >= 0
	}
	return false
}

// compare orders the operand's value against l: -1, 0 or 1, and ok false
// where the two are not of one type. Booleans and nulls are only equal or
// not (Parse allows no ordering of them).
func compare(text string, jv any, isJSON bool, l literal) (int, bool) {
	if !isJSON {
		switch l.kind {
		case litString:
			return strings.Compare(text, l.s), true
		case litNumber:
			f, ok := decimal(strings.TrimSpace(text))
			if !ok {
				return 0, false
			}
			return cmpFloat(f, l.n)
		case litBool:
			if text != "true" && text != "false" {
				return 0, false
			}
			return eqOnly((text == "true") == l.b), true
		}
		return 0, false // null: an attribute is there or not (exists)
	}
	switch v := jv.(type) {
	case string:
		if l.kind == litString {
			return strings.Compare(v, l.s), true
		}
	case json.Number:
		if l.kind == litNumber {
			f, err := v.Float64()
			if err != nil {
				return 0, false
			}
			return cmpFloat(f, l.n)
		}
	case bool:
		if l.kind == litBool {
			return eqOnly(v == l.b), true
		}
	}
	if l.kind == litNull { // any JSON value is null or not
		return eqOnly(jv == nil), true
	}
	return 0, false
}

// decimal reads s as a decimal number, as a number literal is written
// (no hexadecimal, underscores, infinities or NaN).
func decimal(s string) (float64, bool) {
	if s == "" || strings.IndexFunc(s, func(r rune) bool {
		return !(r >= '0' && r <= '9' || r == '.' || r == '-' || r == '+' || r == 'e' || r == 'E')
	}) >= 0 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// cmpFloat orders two numbers; a NaN (text may spell one) is not ordered.
func cmpFloat(a, b float64) (int, bool) {
	switch {
	case a < b:
		return -1, true
	case a > b:
		return 1, true
	case a == b:
		return 0, true
	}
	return 0, false
}

// eqOnly is 0 for equal values and 1 otherwise.
func eqOnly(eq bool) int {
	if eq {
		return 0
	}
	return 1
}
