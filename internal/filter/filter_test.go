package filter

import (
	"errors"
	"strings"
	"testing"
)

func order() *Event {
	return &Event{
		Type: "module.billing.invoice.paid", Source: "billing", Node: "alpha", Schema: "2", User: "node-alpha",
		Headers: map[string]string{"x-tenant": "acme", "x-count": "12", "x-flag": "true", "x-empty": "", "x-inf": "inf", "x-hex": "0x1p10"},
		Body:    []byte(`{"total": 150.5, "currency": "EUR", "paid": true, "note": null, "items": [{"sku": "a-1", "qty": 2}], "order": {"status": "open"}}`),
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		expr string
		want bool
	}{
		{"source = 'billing'", true},
		{"source == \"billing\"", true},
		{"source != 'billing'", false},
		{"source <> 'shop'", true},
		{"node = 'alpha' and schema = '2'", true},
		{"type = 'module.billing.invoice.paid'", true},
		{"user = 'node-alpha'", true},
		{"queue exists", false},    // an empty attribute is missing
		{"queue = ''", false},      // so no comparison holds
		{"not queue exists", true}, // but not inverts it
		{"header.x-tenant = 'acme'", true},
		{"header.x-tenant in ('globex', 'acme')", true},
		{"header.x-tenant not in ('globex', 'acme')", false},
		{"header.x-missing = 'x'", false},
		{"header.x-missing != 'x'", false}, // missing: false for != too
		{"not header.x-missing = 'x'", true},
		{"header.x-empty exists", true}, // a header that is there, empty
		{"header.x-empty = ''", true},
		{"header.x-count > 10", true},   // text compared as the number it spells
		{"header.x-count > '2'", false}, // text compared as text: "12" < "2"
		{"header.x-tenant > 3", false},  // not a number: false
		{"header.x-flag = true", true},
		{"body.total >= 100", true},
		{"body.total > 150.5", false},
		{"body.total <= 150.5", true},
		{"body.total < 1e3", true},
		{"body.total = '150.5'", false}, // a number is not a string
		{"body.currency = 'EUR'", true},
		{"body.currency in ('USD', 'EUR')", true},
		{"body.paid = true", true},
		{"body.paid != false", true},
		{"body.note = null", true},
		{"body.note exists", true},
		{"body.nothing exists", false},
		{"body.items.0.sku = 'a-1'", true},
		{"body.items.0.qty = 2", true},
		{"body.items.1.sku exists", false},
		{"body.items.x exists", false},
		{"body.order.status = 'open'", true},
		{"body.order exists", true},
		{"body.order = 'open'", false}, // an object compares with nothing
		{"body exists", true},
		{"source = 'billing' and (body.total > 1000 or header.x-tenant = 'acme')", true},
		{"not (node = 'alpha' or body.order.status = 'cancelled')", false},
		{"NOT source = 'shop' AND body.total > 100", true},
		{"source = 'shop' or source = 'billing' and body.paid = false", false}, // and binds tighter
		{"(source = 'shop' or source = 'billing') and body.paid = true", true},
		{"body.total > -1", true},
		{"body.currency = 'E\\'UR'", false},
		{"body.nothing not in ('a')", false}, // missing: false, as !=
		{"body.currency not in ('USD')", true},
		{"body.total not in ('x')", false}, // nothing in the list compares with a number
		{"not body.nothing in ('a')", true},
		{"body.total != null", true},
		{"body.note != null", false},
		{"body.nothing != null", false},
		{"body.total = null", false},
		{"header.x-inf > 100", false}, // "inf" is no number here
		{"header.x-hex > 100", false},
		{"header.x-count <= 12e0", true},
	} {
		f, err := Parse(c.expr)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.expr, err)
			continue
		}
		if got := f.Match(order()); got != c.want {
			t.Errorf("%q matched %v, want %v", c.expr, got, c.want)
		}
		if f.String() != c.expr {
			t.Errorf("String() = %q, want %q", f.String(), c.expr)
		}
	}
}

func TestBodyThatIsNotJSON(t *testing.T) {
	for _, body := range []string{"not json", "", `{"a":1} trailing`, `{"a":`, `{"a":1}]`, `{"a":1}}`, `{"a":1} {"a":1}`} {
		ev := &Event{Source: "s", Body: []byte(body)}
		for _, expr := range []string{"body exists", "body.a = 1", "body.a exists"} {
			f, err := Parse(expr)
			if err != nil {
				t.Fatal(err)
			}
			if f.Match(ev) {
				t.Errorf("%q matched the body %q", expr, body)
			}
		}
	}
	// The body is parsed once however many comparisons read it.
	ev := &Event{Body: []byte(`{"a": 1}`)}
	f, _ := Parse("body.a = 1 and body.a exists")
	if !f.Match(ev) || !ev.parsed {
		t.Fatal("body not read")
	}
	ev.Body = []byte(`{"a": 2}`) // not read again
	if !f.Match(ev) {
		t.Error("the body was parsed again")
	}
}

func TestNilFilterAcceptsEverything(t *testing.T) {
	var f *Filter
	if !f.Match(&Event{}) || f.String() != "" {
		t.Error("a nil filter must accept every event")
	}
}

// TestParseErrors: each mistake is refused with ErrInvalid and a message
// that names what to write instead.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ expr, says string }{
		{"", "empty"},
		{"   ", "empty"},
		{"total > 3", "did you mean body.total"},
		{"source", "expected =, !="},
		{"source =", "expected a literal"},
		{"source = billing", "quote text: 'billing'"},
		{"source = 'billing", "not closed"},
		{"source ! 'x'", "write != for not equal"},
		{"source = 'a' and", "expected an operand"},
		{"(source = 'a'", "expected ) to close"},
		{"source = 'a')", "expected and, or or the end"},
		{"header = 'a'", "header.x-tenant"},
		{"source.x = 'a'", "no fields"},
		{"body..x = 1", "empty field name"},
		{"body.x > true", "orders numbers and strings"},
		{"body.x < null", "orders numbers and strings"},
		{"body.x = 1.2.3", "not a number"},
		{"body.x = 0x10", "not a number"},
		{"body.x = -Inf", "not a number"},
		{"body.x = 1e999", "not a number"},
		{"body.x in 1", "expected ( to open"},
		{"body.x in (1 2)", "expected , or )"},
		{"body.x not 1", "expected in after not"},
		{"body.x = 'a\\b'", "escapes only"},
		{"source = 'a' ; drop", "unexpected"},
		{"and = 1", "expected an operand"},
		{strings.Repeat("(", MaxDepth+1) + "source = 'a'" + strings.Repeat(")", MaxDepth+1), "nested more than"},
		{strings.Repeat("not ", MaxDepth+1) + "source = 'a'", "nested more than"},
		{strings.TrimSuffix(strings.Repeat("type='a' or ", MaxTerms+1), " or "), "more than 64 comparisons"},
		{"source in (" + strings.TrimSuffix(strings.Repeat("'a',", MaxTerms+1), ",") + ")", "more than 64 values"},
		{strings.Repeat(" ", MaxBytes) + "source = 'a'", "is over 1024"},
	} {
		_, err := Parse(c.expr)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%.60q) = %v, want ErrInvalid", c.expr, err)
			continue
		}
		if !strings.Contains(err.Error(), c.says) {
			t.Errorf("Parse(%.60q): %v; want it to say %q", c.expr, err, c.says)
		}
	}
	// At the bounds, not past them.
	for _, expr := range []string{
		strings.Repeat("(", MaxDepth-1) + "source = 'a'" + strings.Repeat(")", MaxDepth-1),
		strings.TrimSuffix(strings.Repeat("type='a' or ", MaxTerms), " or "),
	} {
		if _, err := Parse(expr); err != nil {
			t.Errorf("Parse(%.60q): %v", expr, err)
		}
	}
}

// FuzzFilter: Parse never panics; a filter it accepts evaluates on any body
// without panicking, reads the same after being parsed again from its text,
// and obeys the laws of not, and and or.
func FuzzFilter(f *testing.F) {
	for _, s := range []string{
		"source = 'billing' and body.total >= 100",
		"header.x-tenant in ('acme', 'globex') or not schema exists",
		"not (node = 'edge-1' or body.order.status = \"cancelled\")",
		"body.items.0.qty > 1", "body = null", "header.x-count <= -2.5e1", "user != 'a\\'b'",
	} {
		f.Add(s, `{"total": 150, "items": [{"qty": 2}], "order": {"status": "open"}}`, "12")
	}
	f.Fuzz(func(t *testing.T, expr, body, header string) {
		flt, err := Parse(expr)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q): %v does not wrap ErrInvalid", expr, err)
			}
			return
		}
		ev := func() *Event {
			return &Event{Type: "module.a.b", Source: "a", Node: "n", Schema: header, Headers: map[string]string{"x-count": header, "x-tenant": header}, Body: []byte(body)}
		}
		got := flt.Match(ev())
		again, err := Parse(flt.String())
		if err != nil || again.Match(ev()) != got {
			t.Fatalf("%q parsed again: %v, match %v", expr, err, got)
		}
		if len(expr)+8 > MaxBytes {
			return
		}
		if not, err := Parse("not (" + expr + ")"); err == nil && not.Match(ev()) == got {
			t.Fatalf("not (%q) matched as %q did", expr, expr)
		}
		if both, err := Parse("(" + expr + ") and (" + expr + ")"); err == nil && both.Match(ev()) != got {
			t.Fatalf("(%q) and itself differs from it", expr)
		}
	})
}

// BenchmarkMatch: what a filter costs a delivery, on attributes and
// headers only, and with a body field (the body parsed once).
func BenchmarkMatch(b *testing.B) {
	for name, expr := range map[string]string{
		"attributes": "source = 'billing' and header.x-tenant in ('acme', 'globex')",
		"body":       "source = 'billing' and body.total >= 100",
	} {
		f, err := Parse(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !f.Match(order()) {
					b.Fatal("no match")
				}
			}
		})
	}
}
