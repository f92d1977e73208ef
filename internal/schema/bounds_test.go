package schema

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// chain is the schema of issue 47: $defs a0…a(n-1), each applying kw
// (anyOf, oneOf, allOf) to two $refs to the next, a(n) leaf; the root
// refers to a0. One value is checked against about 2^(n+2) subschemas.
func chain(n int, kw, leaf string) string {
	var b strings.Builder
	b.WriteString(`{"$ref":"#/$defs/a0","$defs":{`)
	for i := range n {
		fmt.Fprintf(&b, `"a%d":{%q:[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]},`, i, kw, i+1, i+1)
	}
	fmt.Fprintf(&b, `"a%d":%s}}`, n, leaf)
	return b.String()
}

// nest wraps inner in n levels of {"key": …}.
func nest(n int, key, inner string) string {
	return strings.Repeat(`{"`+key+`":`, n) + inner + strings.Repeat(`}`, n)
}

func wantErr(t *testing.T, err error, sentinel error, says ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("got %v, want %v", err, sentinel)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%v\ndoes not say %q", err, s)
		}
	}
}

// TestFanOutRefusedAtLoad: the attacker's schema of issue 47, at 18
// levels, is refused by Compile, which names the bound and where it fans
// out; so are its oneOf and allOf variants. At 8 levels (about a
// thousand subschemas) it compiles and validates, and its hundreds of
// violations are reported as the first and how many more.
func TestFanOutRefusedAtLoad(t *testing.T) {
	for _, kw := range []string{"anyOf", "oneOf", "allOf"} {
		_, err := Compile("1", []byte(chain(18, kw, `{"type":"string"}`)))
		wantErr(t, err, ErrSchema, "invalid schema: one value would be checked against 1,048,574 subschemas (",
			kw+" at /$defs/a0, "+kw+" at /$defs/a1, "+kw+" at /$defs/a2, …), at most 10,000 (MaxFanOut)")
	}
	c, err := Compile("1", []byte(chain(8, "anyOf", `{"type":"string"}`)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]byte(`"s"`)); err != nil {
		t.Errorf("a string: %v", err)
	}
	wantErr(t, c.Validate([]byte(`1`)), ErrBody, "/: type: got number, want string (and 255 more)")
}

// TestFanOutThroughDescent: fan-out that compounds level by level of the
// body (two applicators for one member or item, or an allOf of two
// subschemas each applying the same schema to the member) is refused at
// load, naming the path; what only looks like it (a tree written as an
// allOf of its branches, applicators of which the library applies one to
// a member, or item) is not, and validates deep bodies.
func TestFanOutThroughDescent(t *testing.T) {
	for _, tc := range []struct{ name, doc, says string }{
		{"properties and patternProperties", `{"$ref":"#/$defs/n","$defs":{"n":{"properties":{"x":{"$ref":"#/$defs/n"}},"patternProperties":{"^x$":{"$ref":"#/$defs/n"}}}}}`,
			"a value at /x/x/x/x/x/x/x/x/x/x/x/x/x (13 levels deep) would be checked against 16,384 subschemas (/$defs/n/properties/x applied 4,096 times by the levels above)"},
		{"items and contains", `{"items":{"$ref":"#"},"contains":{"$ref":"#"}}`,
			"a value at /*/*/*/*/*/*/*/*/*/*/*/*/* (13 levels deep) would be checked against 16,384 subschemas"},
		{"allOf of two", `{"$ref":"#/$defs/a","$defs":{"a":{"allOf":[{"$ref":"#/$defs/b"},{"$ref":"#/$defs/b"}]},"b":{"properties":{"x":{"$ref":"#/$defs/a"}}}}}`,
			"a value at /x/x/x/x/x/x/x/x/x/x/x (11 levels deep) would be checked against 12,288 subschemas (/$defs/b/properties/x applied 2,048 times by the levels above, allOf at /$defs/a)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("1", []byte(tc.doc))
			wantErr(t, err, ErrSchema, tc.says, "at most 10,000 (MaxFanOut)")
		})
	}
	for _, tc := range []struct{ name, doc, body string }{
		{"a tree as an allOf of its branches", `{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","required":["v"],"properties":{"v":{"type":"integer"}},
			"allOf":[{"properties":{"left":{"$ref":"#/$defs/node"}}},{"properties":{"right":{"$ref":"#/$defs/node"}}}]}}}`,
			strings.Repeat(`{"v":1,"left":`, 100) + `{"v":2}` + strings.Repeat(`}`, 100)},
		// a name matches the pattern or takes additionalProperties, not both
		{"patternProperties and additionalProperties", `{"type":"object","patternProperties":{"^x-":{"$ref":"#"}},"additionalProperties":{"$ref":"#"}}`,
			nest(100, "x-a", nest(100, "b", `{}`))},
		// what properties evaluates, unevaluatedProperties does not
		{"properties and unevaluatedProperties", `{"type":"object","properties":{"a":{"$ref":"#"}},"unevaluatedProperties":{"$ref":"#"}}`,
			nest(100, "a", nest(100, "b", `{}`))},
		{"prefixItems and unevaluatedItems", `{"type":"array","prefixItems":[{"$ref":"#"}],"unevaluatedItems":{"$ref":"#"}}`,
			strings.Repeat("[[],", 100) + "[]" + strings.Repeat("]", 100)},
	} {
		c, err := Compile("1", []byte(tc.doc))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if err := c.Validate([]byte(tc.body)); err != nil {
			t.Errorf("%s, a body 100 levels deep or more: %v", tc.name, err)
		}
	}
}

// linear is a schema whose fan-out grows by one per level of the body: A
// applies C in place, and both apply themselves to x; a value n levels
// deep is checked against n+2 subschemas, which no load bound refuses,
// and a body n levels deep costs about n²/2 subschemas (n³ for the
// library's errors, whose locations it copies).
const linear = `{"$ref":"#/$defs/A","$defs":{
	"A":{"allOf":[{"$ref":"#/$defs/C"}],"properties":{"x":{"$ref":"#/$defs/A"}}},
	"C":{"type":"object","required":["y"],"properties":{"x":{"$ref":"#/$defs/C"}}}}}`

// TestBudgetRefusesADeepBody: the linear schema compiles; a body 20
// levels deep validates (and breaks it at every level); one 3,000 levels
// deep (18 KB) is refused by the budget without being checked, naming the
// numbers and where the estimate passed the budget.
func TestBudgetRefusesADeepBody(t *testing.T) {
	c, err := Compile("1", []byte(linear))
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.Validate([]byte(nest(20, "x", `{"y":1}`))), ErrBody, `/: required: missing property 'y' (and 209 more)`)
	if err := c.Validate([]byte(strings.ReplaceAll(nest(20, "x", `{"y":1}`), `{"x"`, `{"y":0,"x"`))); err != nil {
		t.Errorf("a conforming body 20 levels deep: %v", err)
	}
	body := nest(3000, "x", `{}`)
	wantErr(t, c.Validate([]byte(body)), ErrBody, "too costly to check: more than 100,000 steps, the budget of a body of 18,002 bytes (MaxSteps, StepsPerByte); the estimate passed it at /x/x/x/", "/x…, ", " levels deep")
	// the estimate is made before the library validates anything: a
	// conforming body that deep is refused the same
	ok := strings.ReplaceAll(body, `{"x"`, `{"y":0,"x"`)
	wantErr(t, c.Validate([]byte(ok)), ErrBody, "too costly to check")
}

// TestBudgetScalesWithTheBody: a body of a few kilobytes against a real
// schema costs a small part of MaxSteps; a large body gets StepsPerByte
// for each byte, so that 256 KiB of small values, each checked against a
// few subschemas (more than MaxSteps in all), validates.
func TestBudgetScalesWithTheBody(t *testing.T) {
	c, err := Compile("1", []byte(order))
	if err != nil {
		t.Fatal(err)
	}
	if used := c.estimate(t, `{"id":"o-1","price":2.5,"status":"new","tags":["a","b"],"ship":{"city":"Oslo"},"alt":1,"note":"a@b.c"}`); used > 100 {
		t.Errorf("an order costs %d steps", used)
	}
	items, err := Compile("1", []byte(`{"type":"array","items":{"$ref":"#/$defs/n"},"$defs":{"n":{"type":"number"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	body := "[" + strings.TrimSuffix(strings.Repeat("1,", 1<<17), ",") + "]"
	if err := items.Validate([]byte(body)); err != nil {
		t.Errorf("256 KiB of numbers: %v", err)
	}
	if used, limit := items.estimate(t, body), budget(len(body))/stepTicks; used <= MaxSteps || used > limit {
		t.Errorf("256 KiB of numbers costs %d steps, its budget %d, MaxSteps %d", used, limit, MaxSteps)
	}
}

// estimate is what checking body costs, in steps.
func (c *Compiled) estimate(t *testing.T, body string) uint64 {
	t.Helper()
	v, err := decodeForTest(body)
	if err != nil {
		t.Fatal(err)
	}
	used, _, _, _, err := c.cost.estimate(v, satMax)
	if err != nil {
		t.Fatal(err)
	}
	return used / stepTicks
}

// TestSuperLinearKeywords: the keywords whose work grows faster than the
// body are in the estimate: a pattern of a large program over a long
// string, uniqueItems over nested arrays (each level hashes all below it),
// a wide object under many subschemas with unevaluatedProperties, an enum
// of many numbers behind a fan-out (each number compared costs as much as
// a subschema). Each big body is refused by the budget; a small one of
// the same shape is not. A schema whose one value would cost more than a
// whole body may is refused at load.
func TestSuperLinearKeywords(t *testing.T) {
	enum := "[" + strings.TrimSuffix(strings.Repeat("1.5,", 5000), ",") + "]"
	enums := func(n int) string {
		return `{"$defs":{"e":{"enum":` + enum + `},"all":{"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/e"},`, n), ",") + `]}},"items":{"$ref":"#/$defs/all"}}`
	}
	for _, tc := range []struct{ name, schema, small, big string }{
		{"pattern", `{"pattern":"[a-z]{1000}b"}`, `"` + strings.Repeat("a", 100) + `"`, `"` + strings.Repeat("a", 1<<16) + `"`},
		{"uniqueItems", `{"uniqueItems":true,"items":{"$ref":"#"}}`, nest2(10), nest2(1000)},
		{"unevaluatedProperties", `{"unevaluatedProperties":false,"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"properties":{"a":true}},`, 200), ",") + `]}`,
			`{"a":1}`, `{"a":1` + keys(5000) + "}"},
		{"enum", enums(8), `[1.5]`, `[1.5,1.5]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Compile("1", []byte(tc.schema))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate([]byte(tc.small)); err != nil && strings.Contains(err.Error(), "too costly") {
				t.Errorf("a small body: %v", err)
			}
			wantErr(t, c.Validate([]byte(tc.big)), ErrBody, "too costly to check")
		})
	}
	_, err := Compile("1", []byte(enums(50)))
	wantErr(t, err, ErrSchema, "checking a value at /* (1 level deep) would take 500,", "more than a whole body may (MaxSteps, 100,000)")
}

// nest2 is n levels of arrays, each of 20 distinct numbers and the next.
func nest2(n int) string {
	return strings.Repeat("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,", n) + "0" + strings.Repeat("]", n)
}

func keys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `,"k%d":1`, i)
	}
	return b.String()
}

// TestCyclesRefused: a cycle of in-place applicators (which the library
// would stop, for every body, with an error) is refused at load, naming
// it; a reference that descends into the value is no cycle.
func TestCyclesRefused(t *testing.T) {
	for _, doc := range []string{
		`{"$ref":"#"}`,
		`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}`,
		`{"$ref":"#/$defs/a","$defs":{"a":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/b"}]},"b":{"not":{"$ref":"#/$defs/a"}}}}`,
	} {
		_, err := Compile("1", []byte(doc))
		wantErr(t, err, ErrSchema, "leads back to", "a cycle")
	}
	if _, err := Compile("1", []byte(`{"properties":{"next":{"$ref":"#"}},"items":{"$ref":"#"}}`)); err != nil {
		t.Errorf("recursion through properties: %v", err)
	}
}

// TestNumbersBounded: a number the library would read at a cost beyond
// its length (or panic on: 1e10000000 against minimum) is refused, in a
// body and in a schema; numbers of every real use pass.
func TestNumbersBounded(t *testing.T) {
	c, err := Compile("1", []byte(`{"items":{"minimum":0,"multipleOf":0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"1e10000000", "1e999999", "1e401", "1.5e-400", "0." + strings.Repeat("0", 400) + "1", strings.Repeat("9", 101), "1e99999999999999999999"} {
		wantErr(t, c.Validate([]byte("[0,"+n+"]")), ErrBody, "/1: number ", "is out of bounds: ")
	}
	for _, n := range []string{"1e308", "5e-324", "1.7976931348623157e308", strings.Repeat("9", 78), "-0.5", "1E+2", "4.5e-10"} {
		if err := c.Validate([]byte("[0," + n + "]")); err != nil && strings.Contains(err.Error(), "number") {
			t.Errorf("%s: %v", n, err)
		}
	}
	for _, doc := range []string{`{"minimum":1e10000000}`, `{"const":1e999999}`, `{"enum":[1,2,1e-500]}`} {
		_, err := Compile("1", []byte(doc))
		wantErr(t, err, ErrSchema, "number")
	}
}

// TestPatternsBounded: a regular expression that compiles to more than
// MaxPatternSize instructions is refused at load, and so are expressions
// that add up to more than MaxPatternsSize; a large one within the bound
// compiles, and what it costs to match is in each body's estimate.
func TestPatternsBounded(t *testing.T) {
	_, err := Compile("1", []byte(`{"pattern":"`+strings.Repeat("[a-z]{1,1000}", 6)+`"}`))
	wantErr(t, err, ErrSchema, "at most 10,000 (MaxPatternSize)")
	var props []string
	for i := range 60 {
		props = append(props, fmt.Sprintf(`"p%d":{"pattern":"^%d[a-z]{1,1000}$"}`, i, i))
	}
	_, err = Compile("1", []byte(`{"properties":{`+strings.Join(props, ",")+`}}`))
	wantErr(t, err, ErrSchema, "MaxPatternsSize")
	c, err := Compile("1", []byte(`{"pattern":"^[a-z]{1,1000}$"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]byte(`"abc"`)); err != nil {
		t.Error(err)
	}
	wantErr(t, c.Validate([]byte(`"`+strings.Repeat("a", 100_000)+`"`)), ErrBody, "too costly")
	// "format": "regex" (asserted before draft 2019-09) compiles a body's
	// string: one beyond a thousand instructions is not a regex it takes
	c, err = Compile("1", []byte(`{"$schema":"http://json-schema.org/draft-07/schema#","format":"regex"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]byte(`"^a+$"`)); err != nil {
		t.Error(err)
	}
	wantErr(t, c.Validate([]byte(`"[a-z]{1,1000}"`)), ErrBody, "format")
}

// TestDynamicReferences: a $dynamicRef or $recursiveRef within one
// resource resolves to its own target and is bounded; one whose target
// depends on the dynamic scope across resources (the 2020-12 meta-schema)
// is refused; a reference to the draft-07 meta-schema (no dynamic
// reference) compiles and validates a schema.
func TestDynamicReferences(t *testing.T) {
	tree := `{"$dynamicAnchor":"node","type":"object","properties":{"kids":{"type":"array","items":{"$dynamicRef":"#node"}}}}`
	c, err := Compile("1", []byte(tree))
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.Validate([]byte(`{"kids":[{"kids":[1]}]}`)), ErrBody, "/kids/0/kids/0: type:")
	rec := `{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"type":"object","additionalProperties":{"$recursiveRef":"#"}}`
	if c, err = Compile("1", []byte(rec)); err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.Validate([]byte(`{"a":{"b":1}}`)), ErrBody, "/a/b: type:")
	_, err = Compile("1", []byte(`{"$ref":"https://json-schema.org/draft/2020-12/schema"}`))
	wantErr(t, err, ErrSchema, "$dynamicRef at https://json-schema.org/draft/2020-12/", "depends on the dynamic scope")
	c, err = Compile("1", []byte(`{"$schema":"http://json-schema.org/draft-07/schema#","$ref":"http://json-schema.org/draft-07/schema#"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate([]byte(order)); err != nil {
		t.Errorf("the order schema as a body: %v", err)
	}
	wantErr(t, c.Validate([]byte(`{"properties":{"a":{"type":3}}}`)), ErrBody, "/properties/a/type")
}

// TestViolationsCapped: a body that breaks its schema 5,000 times is
// reported as the first violation (Violations' first) and how many more;
// only that one is formatted, and nothing sorted.
func TestViolationsCapped(t *testing.T) {
	c, err := Compile("1", []byte(`{"items":{"type":"string"}}`))
	if err != nil {
		t.Fatal(err)
	}
	body := "[" + strings.TrimSuffix(strings.Repeat("1,", 5000), ",") + "]"
	wantErr(t, c.Validate([]byte(body)), ErrBody, "/0: type: got number, want string (and 4999 more)")
	v, _ := decodeForTest(body)
	ve := validationError(t, c, v)
	all := Violations(ve)
	if first, n := firstViolation(ve); first != all[0] || n != 5000 || len(all) != 5000 {
		t.Errorf("first %v of %d, Violations %d, its first %v", first, n, len(all), all[0])
	}
}

// TestToolRequestsBounded: a tool's request and response schemas go
// through Compile and Validate: the attacker's schema is refused when the
// module's declarations are compiled, and a request over the budget is
// refused as a request that does not conform (ErrBody).
func TestToolRequestsBounded(t *testing.T) {
	_, err := New("shop", nil, []Decl{{Tool: "shop.quote", Version: "1", JSON: []byte(chain(18, "anyOf", `{"type":"string"}`))}}, nil, true)
	wantErr(t, err, ErrSchema, "its request: invalid schema: one value would be checked against")
	c, err := New("shop", nil, []Decl{{Tool: "shop.quote", Version: "1", JSON: []byte(linear)}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, c.Request("shop.quote", []byte(nest(3000, "x", `{}`))), ErrBody, "request to shop.quote: ", "too costly to check")
}

// TestValidateConcurrently checks one compiled schema from many
// goroutines (run with -race): the estimate's engines are pooled.
func TestValidateConcurrently(t *testing.T) {
	c, err := Compile("1", []byte(linear))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				body := nest(1+(g+i)%30, "x", `{"y":1}`)
				if err := c.Validate([]byte(body)); !errors.Is(err, ErrBody) || strings.Contains(err.Error(), "costly") {
					t.Errorf("%d levels: %v", 1+(g+i)%30, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func decodeForTest(body string) (any, error) {
	return jsonschema.UnmarshalJSON(strings.NewReader(body))
}

// validationError is the library's error for v, not bounded.
func validationError(t *testing.T, c *Compiled, v any) *jsonschema.ValidationError {
	t.Helper()
	var ve *jsonschema.ValidationError
	if err := c.sch.Validate(v); !errors.As(err, &ve) {
		t.Fatalf("got %v, want a validation error", err)
	}
	return ve
}

// schemaOf builds a schema document from fuzz bytes: $defs d0…d5, each a
// tree of applicators (in place and descending), enums, patterns and
// uniqueItems, referring to each other; the root refers to d0.
func schemaOf(data []byte) string {
	g := &fuzzGen{b: data}
	var defs []string
	for i := range 6 {
		defs = append(defs, fmt.Sprintf(`"d%d":%s`, i, g.node(0)))
	}
	draft := ""
	if g.next()%8 == 0 {
		draft = `"$schema":"http://json-schema.org/draft-07/schema#",`
	}
	return `{` + draft + `"$ref":"#/$defs/d0","$defs":{` + strings.Join(defs, ",") + `}}`
}

type fuzzGen struct {
	b []byte
	i int
}

func (g *fuzzGen) next() byte {
	if g.i >= len(g.b) {
		return 0
	}
	g.i++
	return g.b[g.i-1]
}

func (g *fuzzGen) node(depth int) string {
	if depth > 3 {
		return []string{`true`, `{"type":"string"}`, `{"minimum":1}`, `{"type":"object"}`}[g.next()%4]
	}
	sub := func() string { return g.node(depth + 1) }
	list := func() string {
		n := 1 + int(g.next()%3)
		var out []string
		for range n {
			out = append(out, sub())
		}
		return "[" + strings.Join(out, ",") + "]"
	}
	switch g.next() % 20 {
	case 0, 1:
		return fmt.Sprintf(`{"$ref":"#/$defs/d%d"}`, g.next()%6)
	case 2:
		return `{"allOf":` + list() + `}`
	case 3:
		return `{"anyOf":` + list() + `}`
	case 4:
		return `{"oneOf":` + list() + `}`
	case 5:
		return `{"not":` + sub() + `}`
	case 6:
		return `{"if":` + sub() + `,"then":` + sub() + `,"else":` + sub() + `}`
	case 7:
		return `{"properties":{"a":` + sub() + `,"b":` + sub() + `},"additionalProperties":` + sub() + `}`
	case 8:
		return `{"patternProperties":{"^a":` + sub() + `,"b+":` + sub() + `}}`
	case 9:
		return `{"items":` + sub() + `}`
	case 10:
		return `{"prefixItems":` + list() + `,"items":` + sub() + `}`
	case 11:
		return `{"contains":` + sub() + `,"minContains":2}`
	case 12:
		return `{"uniqueItems":true,"items":` + sub() + `}`
	case 13:
		return `{"enum":[1,"a",[1,2],{"a":1},null,2.5]}`
	case 14:
		return `{"type":["integer","string"],"minimum":0,"multipleOf":0.5,"pattern":"^[a-z]{1,20}$","maxLength":5}`
	case 15:
		return `{"unevaluatedProperties":` + sub() + `,"allOf":` + list() + `}`
	case 16:
		return `{"unevaluatedItems":` + sub() + `,"anyOf":` + list() + `}`
	case 17:
		return `{"dependentSchemas":{"a":` + sub() + `},"propertyNames":` + sub() + `}`
	case 18:
		return `{"required":["a"],"const":{"a":[1,2]}}`
	default:
		return `{"$dynamicAnchor":"x","properties":{"x":{"$dynamicRef":"#x"}}}`
	}
}

// FuzzCompileAndValidate: a schema built from the fuzzer's bytes (every
// applicator, nested, referring to each other) and any body: Compile and
// Validate never panic and refuse with the package's sentinels, and the
// estimate bounds the library's work: a body within its budget gets no
// more of the library's errors than 64 per step estimated (each
// subschema applied makes at most a few dozen). Validate terminating is
// the fuzzer's to see: each run is bounded by the budget.
func FuzzCompileAndValidate(f *testing.F) {
	f.Add([]byte{3, 0, 0}, []byte(`1`))
	f.Add([]byte{2, 2, 0, 0, 1, 0, 7, 1, 1}, []byte(`{"a":{"a":[1,2]},"b":"x"}`))
	f.Add([]byte{12, 9, 0, 11, 1}, []byte(`[[1,2],[1,2],[3]]`))
	f.Add([]byte{15, 3, 8, 1, 17, 5}, []byte(`{"ab":1,"bb":{"a":null},"c":[true]}`))
	f.Add([]byte{19, 6, 14, 13, 4}, []byte(`{"x":{"x":{"x":"abc"}}}`))
	f.Add([]byte(chain(6, "anyOf", `{}`)), []byte(`"s"`))
	f.Fuzz(func(t *testing.T, data, body []byte) {
		c, err := Compile("1", []byte(schemaOf(data)))
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("compile: %v is not ErrSchema", err)
			}
			return
		}
		err = c.Validate(body)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrBody) {
			t.Fatalf("validate: %v is not ErrBody", err)
		}
		v, err := decodeForTest(string(body))
		if err != nil {
			return
		}
		used, over, _, _, err := c.cost.estimate(v, budget(len(body)))
		if err != nil || over {
			return
		}
		var ve *jsonschema.ValidationError
		if !errors.As(c.sch.Validate(v), &ve) {
			return
		}
		if n := errorNodes(ve); uint64(n) > 64*(used/stepTicks+1) {
			t.Fatalf("the library made %d errors, the estimate was %d steps", n, used/stepTicks)
		}
	})
}

func errorNodes(ve *jsonschema.ValidationError) int {
	n := 1
	for _, c := range ve.Causes {
		n += errorNodes(c)
	}
	return n
}
