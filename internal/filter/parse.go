package filter

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

type tokenKind int

const (
	tEOF tokenKind = iota
	tName
	tString
	tNumber
	tOp
	tLParen
	tRParen
	tComma
)

type token struct {
	kind tokenKind
	text string // as written (a string's value, unquoted)
	pos  int    // byte offset in the expression
}

// keyword reports whether t is the keyword kw, in any case.
func (t token) keyword(kw string) bool { return t.kind == tName && strings.EqualFold(t.text, kw) }

func isKeyword(s string) bool {
	switch strings.ToLower(s) {
	case "and", "or", "not", "in", "exists", "true", "false", "null":
		return true
	}
	return false
}

func lex(s string) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(':
			toks, i = append(toks, token{tLParen, "(", i}), i+1
		case c == ')':
			toks, i = append(toks, token{tRParen, ")", i}), i+1
		case c == ',':
			toks, i = append(toks, token{tComma, ",", i}), i+1
		case c == '=' || c == '!' || c == '<' || c == '>':
			written := opText(s[i:])
			op := written
			switch written {
			case "!":
				return nil, fmt.Errorf("%w: '!' at byte %d: write != for not equal, or not before a comparison", ErrInvalid, i+1)
			case "==":
				op = "="
			case "<>":
				op = "!="
			}
			toks, i = append(toks, token{tOp, op, i}), i+len(written)
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' {
					if j+1 >= len(s) || (s[j+1] != c && s[j+1] != '\\') {
						return nil, fmt.Errorf("%w: a backslash at byte %d escapes only the quote or a backslash", ErrInvalid, j+1)
					}
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("%w: the string that opens at byte %d is not closed", ErrInvalid, i+1)
			}
			toks, i = append(toks, token{tString, b.String(), i}), j+1
		case c == '-' || c == '.' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(s) && (isNameByte(s[j]) || ((s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E'))) {
				j++
			}
			toks, i = append(toks, token{tNumber, s[i:j], i}), j
		case c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z'):
			j := i + 1
			for j < len(s) && isNameByte(s[j]) {
				j++
			}
			toks, i = append(toks, token{tName, s[i:j], i}), j
		default:
			return nil, fmt.Errorf("%w: unexpected %q at byte %d", ErrInvalid, rune(c), i+1)
		}
	}
	return append(toks, token{tEOF, "", len(s)}), nil
}

// opText is the comparison operator s begins with, as written.
func opText(s string) string {
	if len(s) > 1 && (s[1] == '=' || (s[0] == '<' && s[1] == '>')) {
		return s[:2]
	}
	return s[:1]
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c == '.' || (c >= '0' && c <= '9') || (c|0x20 >= 'a' && c|0x20 <= 'z')
}

type parser struct {
	toks  []token
	i     int
	terms int
}

func (p *parser) peek() token { return p.toks[p.i] }
func (p *parser) next() token { t := p.toks[p.i]; p.i = min(p.i+1, len(p.toks)-1); return t }

func (p *parser) errAt(t token, msg string) error {
	if t.kind == tEOF {
		return fmt.Errorf("%w: %s, at the end", ErrInvalid, msg)
	}
	return fmt.Errorf("%w: %s, at byte %d (%q)", ErrInvalid, msg, t.pos+1, t.text)
}

func (p *parser) or(depth int) (node, error) {
	a, err := p.and(depth)
	if err != nil {
		return nil, err
	}
	for p.peek().keyword("or") {
		p.next()
		b, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		a = orNode{a, b}
	}
	return a, nil
}

func (p *parser) and(depth int) (node, error) {
	a, err := p.unary(depth)
	if err != nil {
		return nil, err
	}
	for p.peek().keyword("and") {
		p.next()
		b, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		a = andNode{a, b}
	}
	return a, nil
}

func (p *parser) unary(depth int) (node, error) {
	if depth >= MaxDepth {
		return nil, p.errAt(p.peek(), fmt.Sprintf("nested more than %d levels deep", MaxDepth))
	}
	t := p.peek()
	switch {
	case t.keyword("not"):
		p.next()
		a, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return notNode{a}, nil
	case t.kind == tLParen:
		p.next()
		a, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if c := p.next(); c.kind != tRParen {
			return nil, p.errAt(c, "expected ) to close the ( at byte "+strconv.Itoa(t.pos+1))
		}
		return a, nil
	}
	return p.comparison()
}

func (p *parser) comparison() (node, error) {
	t := p.next()
	if t.kind != tName || isKeyword(t.text) {
		return nil, p.errAt(t, "expected an operand (type, source, node, schema, user, queue, header.NAME, body or body.PATH)")
	}
	o, err := operandOf(t)
	if err != nil {
		return nil, err
	}
	if p.terms++; p.terms > MaxTerms {
		return nil, p.errAt(t, fmt.Sprintf("more than %d comparisons", MaxTerms))
	}
	op := p.next()
	switch {
	case op.keyword("exists"):
		return cmpNode{operand: o, op: "exists"}, nil
	case op.keyword("not"):
		if in := p.next(); !in.keyword("in") {
			return nil, p.errAt(in, "expected in after not (write not before the comparison to negate it)")
		}
		n, err := p.inList(o)
		if err != nil {
			return nil, err
		}
		n.op = "notin" // false where the operand is missing, as != is
		return n, nil
	case op.keyword("in"):
		n, err := p.inList(o)
		if err != nil {
			return nil, err
		}
		return n, nil
	case op.kind == tOp:
		l, lt, err := p.literal()
		if err != nil {
			return nil, err
		}
		if op.text != "=" && op.text != "!=" && (l.kind == litBool || l.kind == litNull) {
			return nil, p.errAt(lt, op.text+" orders numbers and strings, not "+lt.text)
		}
		return cmpNode{operand: o, op: op.text, lits: []literal{l}}, nil
	}
	return nil, p.errAt(op, "expected =, !=, <, <=, >, >=, in, not in or exists after "+t.text)
}

func (p *parser) inList(o operand) (cmpNode, error) {
	if t := p.next(); t.kind != tLParen {
		return cmpNode{}, p.errAt(t, "expected ( to open the list of in")
	}
	n := cmpNode{operand: o, op: "in"}
	for {
		l, lt, err := p.literal()
		if err != nil {
			return cmpNode{}, err
		}
		if len(n.lits) >= MaxTerms {
			return cmpNode{}, p.errAt(lt, fmt.Sprintf("more than %d values in one list", MaxTerms))
		}
		n.lits = append(n.lits, l)
		switch t := p.next(); t.kind {
		case tComma:
			continue
		case tRParen:
			return n, nil
		default:
			return cmpNode{}, p.errAt(t, "expected , or ) in the list of in")
		}
	}
}

func (p *parser) literal() (literal, token, error) {
	t := p.next()
	switch {
	case t.kind == tString:
		return literal{kind: litString, s: t.text}, t, nil
	case t.kind == tNumber:
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || strings.ContainsAny(t.text, "_xXpP") {
			return literal{}, t, p.errAt(t, "not a number")
		}
		return literal{kind: litNumber, n: f}, t, nil
	case t.keyword("true"), t.keyword("false"):
		return literal{kind: litBool, b: strings.EqualFold(t.text, "true")}, t, nil
	case t.keyword("null"):
		return literal{kind: litNull}, t, nil
	case t.kind == tName:
		return literal{}, t, p.errAt(t, "expected a literal; quote text: '"+t.text+"'")
	}
	return literal{}, t, p.errAt(t, "expected a literal (a quoted string, a number, true, false or null)")
}

// operandOf reads an operand's name: an attribute, header.NAME, body or
// body.PATH.
func operandOf(t token) (operand, error) {
	head, rest, dotted := strings.Cut(t.text, ".")
	switch strings.ToLower(head) {
	case "type", "source", "node", "schema", "user", "queue":
		if dotted {
			return operand{}, fmt.Errorf("%w: %s at byte %d is an attribute with no fields: write %s", ErrInvalid, t.text, t.pos+1, head)
		}
		return operand{attr: strings.ToLower(head)}, nil
	case "header":
		if !dotted || rest == "" {
			return operand{}, fmt.Errorf("%w: header at byte %d needs a name: header.x-tenant", ErrInvalid, t.pos+1)
		}
		return operand{attr: "header", header: rest}, nil
	case "body":
		if !dotted {
			return operand{attr: "body"}, nil
		}
		path := strings.Split(rest, ".")
		for _, k := range path {
			if k == "" {
				return operand{}, fmt.Errorf("%w: %s at byte %d has an empty field name", ErrInvalid, t.text, t.pos+1)
			}
		}
		return operand{attr: "body", path: path}, nil
	}
	return operand{}, fmt.Errorf("%w: unknown operand %q at byte %d: the operands are type, source, node, schema, user, queue, header.NAME and body.PATH (did you mean body.%s or header.%s?)",
		ErrInvalid, t.text, t.pos+1, t.text, t.text)
}
