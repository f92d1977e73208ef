package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Short names for the tables.
const (
	vOK      = VerdictCompatible
	vBreaks  = VerdictIncompatible
	vUnknown = VerdictUnknown
)

// compatChanges is the table of schema changes every rule is held to: the
// verdict of BACKWARD (the new schema reads the old one's bodies), FORWARD
// (the old reads the new's) and FULL. bodies are samples: each compatible
// direction must read every sample its writer accepts (that uses only the
// writer's declared properties, the open model's premise), each
// incompatible one must refuse at least one.
var compatChanges = []struct {
	name                    string
	old, new                string
	backward, forward, full Verdict
	bodies                  []string
}{
	{
		name:     "add an optional field",
		old:      `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"]}`,
		backward: vOK, forward: vOK, full: vOK,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "add an optional field, the old schema closed",
		old:      `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"],"additionalProperties":false}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "add a required field",
		old:      `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id","note"]}`,
		backward: vBreaks, forward: vOK, full: vBreaks,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "remove an optional field",
		old:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`,
		backward: vOK, forward: vOK, full: vOK,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "remove a required field",
		old:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id","note"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "make an optional field required",
		old:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id","note"]}`,
		backward: vBreaks, forward: vOK, full: vBreaks,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "make a required field optional",
		old:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id","note"]}`,
		new:      `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"]}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{"id":"a"}`, `{"id":"a","note":"n"}`},
	},
	{
		name:     "change a field's type, string to integer",
		old:      `{"type":"object","properties":{"note":{"type":"string"}}}`,
		new:      `{"type":"object","properties":{"note":{"type":"integer"}}}`,
		backward: vBreaks, forward: vBreaks, full: vBreaks,
		bodies: []string{`{}`, `{"note":"n"}`, `{"note":5}`},
	},
	{
		name:     "change a field's type, integer to number",
		old:      `{"type":"object","properties":{"qty":{"type":"integer"}}}`,
		new:      `{"type":"object","properties":{"qty":{"type":"number"}}}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{}`, `{"qty":2}`, `{"qty":2.5}`},
	},
	{
		name:     "widen an enum",
		old:      `{"type":"object","properties":{"status":{"enum":["new","paid"]}}}`,
		new:      `{"type":"object","properties":{"status":{"enum":["new","paid","lost"]}}}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{"status":"new"}`, `{"status":"paid"}`, `{"status":"lost"}`},
	},
	{
		name:     "narrow an enum",
		old:      `{"type":"object","properties":{"status":{"enum":["new","paid","lost"]}}}`,
		new:      `{"type":"object","properties":{"status":{"enum":["new","paid"]}}}`,
		backward: vBreaks, forward: vOK, full: vBreaks,
		bodies: []string{`{"status":"new"}`, `{"status":"paid"}`, `{"status":"lost"}`},
	},
	{
		name:     "tighten a bound, maximum 100 to 10",
		old:      `{"type":"object","properties":{"qty":{"type":"integer","maximum":100}}}`,
		new:      `{"type":"object","properties":{"qty":{"type":"integer","maximum":10}}}`,
		backward: vBreaks, forward: vOK, full: vBreaks,
		bodies: []string{`{"qty":5}`, `{"qty":50}`, `{"qty":100}`},
	},
	{
		name:     "loosen a bound, maximum 10 to 100",
		old:      `{"type":"object","properties":{"qty":{"type":"integer","maximum":10}}}`,
		new:      `{"type":"object","properties":{"qty":{"type":"integer","maximum":100}}}`,
		backward: vOK, forward: vBreaks, full: vBreaks,
		bodies: []string{`{"qty":5}`, `{"qty":50}`, `{"qty":100}`},
	},
	{
		name:     "oneOf in the new schema",
		old:      `{"type":"object","properties":{"note":{"type":"string"}}}`,
		new:      `{"type":"object","properties":{"note":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}`,
		backward: vUnknown, forward: vUnknown, full: vUnknown,
	},
	{
		name:     "oneOf in the old schema",
		old:      `{"type":"object","properties":{"note":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}`,
		new:      `{"type":"object","properties":{"note":{"type":"string"}}}`,
		backward: vUnknown, forward: vUnknown, full: vUnknown,
	},
	{
		name:     "change nothing, oneOf and all",
		old:      `{"type":"object","properties":{"note":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}`,
		new:      `{"type":"object","properties":{"note":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}`,
		backward: vOK, forward: vOK, full: vOK,
		bodies: []string{`{}`, `{"note":"n"}`, `{"note":5}`},
	},
}

// TestCompatRules: each change of the table, under BACKWARD, FORWARD and
// FULL, checked against the old version; and each transitive rule over
// three versions, the last two the same.
func TestCompatRules(t *testing.T) {
	for _, tc := range compatChanges {
		for _, rc := range []struct {
			rule Rule
			want Verdict
			dirs []string
		}{
			{RuleBackward, tc.backward, []string{DirectionBackward}},
			{RuleForward, tc.forward, []string{DirectionForward}},
			{RuleFull, tc.full, []string{DirectionBackward, DirectionForward}},
		} {
			res, err := Check(rc.rule, []byte(tc.new), []Earlier{{Version: "1", JSON: []byte(tc.old)}})
			if err != nil {
				t.Fatalf("%s, %s: %v", tc.name, rc.rule, err)
			}
			if res.Verdict != rc.want {
				t.Errorf("%s, %s: %s, want %s: %+v", tc.name, rc.rule, res.Verdict, rc.want, res.Against)
			}
			var dirs []string
			for _, a := range res.Against {
				dirs = append(dirs, a.Direction)
				if a.Version != "1" {
					t.Errorf("%s, %s: against version %q", tc.name, rc.rule, a.Version)
				}
				if (a.Verdict == VerdictCompatible) != (len(a.Findings) == 0) {
					t.Errorf("%s, %s: verdict %s with findings %+v", tc.name, rc.rule, a.Verdict, a.Findings)
				}
			}
			if !slices.Equal(dirs, rc.dirs) {
				t.Errorf("%s, %s: directions %v, want %v", tc.name, rc.rule, dirs, rc.dirs)
			}
		}
		// The new schema declared again as version 3: each plain rule
		// passes against version 2, the same; the transitive one is the
		// row's verdict, against version 1.
		versions := []Earlier{{Version: "1", JSON: []byte(tc.old)}, {Version: "2", JSON: []byte(tc.new)}}
		for rule, want := range map[Rule]Verdict{
			RuleBackward: vOK, RuleForward: vOK, RuleFull: vOK,
			RuleBackwardTransitive: tc.backward, RuleForwardTransitive: tc.forward, RuleFullTransitive: tc.full,
		} {
			res, err := Check(rule, []byte(tc.new), versions)
			if err != nil || res.Verdict != want {
				t.Errorf("%s, %s over versions 1, 2, 3: %s, %v, want %s", tc.name, rule, res.Verdict, err, want)
			}
		}
	}
}

// TestCompatEmpirical holds the table's verdicts to a validator
// (santhosh-tekuri/jsonschema/v6): what is compatible reads each sample
// the writer accepts, what breaks refuses one.
func TestCompatEmpirical(t *testing.T) {
	for _, tc := range compatChanges {
		if len(tc.bodies) == 0 {
			continue
		}
		for _, d := range []struct {
			dir            string
			reader, writer string
			want           Verdict
		}{
			{DirectionBackward, tc.new, tc.old, tc.backward},
			{DirectionForward, tc.old, tc.new, tc.forward},
		} {
			reader, writer := compileForTest(t, d.reader), compileForTest(t, d.writer)
			declared := declaredForTest(t, d.writer)
			refused := false
			for _, body := range tc.bodies {
				v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if writer.Validate(v) != nil || !keysIn(v, declared) {
					continue
				}
				err = reader.Validate(v)
				if err != nil && d.want == VerdictCompatible {
					t.Errorf("%s, %s: compatible, yet the reader refuses %s: %v", tc.name, d.dir, body, err)
				}
				refused = refused || err != nil
			}
			if d.want == VerdictIncompatible && !refused {
				t.Errorf("%s, %s: incompatible, yet the reader reads every sample", tc.name, d.dir)
			}
		}
	}
}

func compileForTest(t *testing.T, doc string) *jsonschema.Schema {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem:///s.json", v); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("mem:///s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func declaredForTest(t *testing.T, doc string) map[string]any {
	t.Helper()
	var s struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal([]byte(doc), &s); err != nil {
		t.Fatal(err)
	}
	return s.Properties
}

func keysIn(v any, declared map[string]any) bool {
	m, _ := v.(map[string]any)
	for k := range m {
		if _, ok := declared[k]; !ok {
			return false
		}
	}
	return true
}

// TestCompatTransitive: v1 → v2 drops an optional field and v2 → v3 adds
// it back with another type. Each step passes every plain rule; the
// transitive ones fail against v1.
func TestCompatTransitive(t *testing.T) {
	versions := []Earlier{
		{Version: "1", JSON: []byte(`{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"integer"}}}`)},
		{Version: "2", JSON: []byte(`{"type":"object","properties":{"id":{"type":"string"}}}`)},
	}
	v3 := []byte(`{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"string"}}}`)
	type against struct {
		version, dir string
		verdict      Verdict
	}
	for _, tc := range []struct {
		rule Rule
		want Verdict
		each []against
	}{
		{RuleBackward, vOK, []against{{"2", "backward", vOK}}},
		{RuleForward, vOK, []against{{"2", "forward", vOK}}},
		{RuleFull, vOK, []against{{"2", "backward", vOK}, {"2", "forward", vOK}}},
		{RuleBackwardTransitive, vBreaks, []against{{"1", "backward", vBreaks}, {"2", "backward", vOK}}},
		{RuleForwardTransitive, vBreaks, []against{{"1", "forward", vBreaks}, {"2", "forward", vOK}}},
		{RuleFullTransitive, vBreaks, []against{{"1", "backward", vBreaks}, {"1", "forward", vBreaks}, {"2", "backward", vOK}, {"2", "forward", vOK}}},
	} {
		res, err := Check(tc.rule, v3, versions)
		if err != nil {
			t.Fatalf("%s: %v", tc.rule, err)
		}
		var each []against
		for _, a := range res.Against {
			each = append(each, against{a.Version, a.Direction, a.Verdict})
			if a.Verdict == VerdictIncompatible && (len(a.Findings) != 1 || a.Findings[0].Pointer != "/properties/n") {
				t.Errorf("%s: findings %+v, want one at /properties/n", tc.rule, a.Findings)
			}
		}
		if res.Rule != tc.rule || res.Verdict != tc.want || !slices.Equal(each, tc.each) {
			t.Errorf("%s: %s %v, want %s %v", tc.rule, res.Verdict, each, tc.want, tc.each)
		}
	}
}

// TestCompatCheck: NONE and a first version check nothing; a bad rule or
// document is an error naming it.
func TestCompatCheck(t *testing.T) {
	v1 := []Earlier{{Version: "1", JSON: []byte(`{"type":"string"}`)}}
	for _, tc := range []struct {
		rule    Rule
		earlier []Earlier
	}{{RuleNone, v1}, {RuleFull, nil}} {
		res, err := Check(tc.rule, []byte(`{"type":"integer"}`), tc.earlier)
		if err != nil || res.Verdict != VerdictCompatible || res.Against == nil || len(res.Against) != 0 {
			t.Errorf("%s against %d: %+v, %v", tc.rule, len(tc.earlier), res, err)
		}
	}
	if _, err := Check("sideways", []byte(`{}`), v1); err == nil || !strings.Contains(err.Error(), "backward_transitive") {
		t.Errorf("a bad rule: %v, want the rules listed", err)
	}
	if _, err := Check(RuleBackward, []byte(`{`), v1); !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "new schema") {
		t.Errorf("a bad new schema: %v", err)
	}
	bad := []Earlier{{Version: "0", JSON: []byte(`[]`)}, {Version: "1", JSON: []byte(`{}`)}}
	if _, err := Check(RuleBackward, []byte(`{}`), bad); err != nil {
		t.Errorf("a plain rule read version 0: %v", err)
	}
	if _, err := Check(RuleBackwardTransitive, []byte(`{}`), bad); !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "version 0") {
		t.Errorf("a bad earlier schema: %v", err)
	}
	res, err := Check(RuleBackward, []byte(`{"type":"object","required":["a"]}`), []Earlier{{Version: "1", JSON: []byte(`{"type":"object"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res)
	want := `{"rule":"backward","verdict":"incompatible","against":[{"version":"1","direction":"backward","verdict":"incompatible","findings":[{"pointer":"/properties/a","problem":"the reader requires \"a\", which the writer may omit","verdict":"incompatible"}]}]}`
	if string(b) != want {
		t.Errorf("JSON:\n%s\nwant\n%s", b, want)
	}
}

// TestCompatParseRule: case and "-" or "_" do not matter.
func TestCompatParseRule(t *testing.T) {
	for in, want := range map[string]Rule{
		"none": RuleNone, "BACKWARD": RuleBackward, "backward-transitive": RuleBackwardTransitive,
		"Forward": RuleForward, "FORWARD_TRANSITIVE": RuleForwardTransitive, "full": RuleFull, "Full-Transitive": RuleFullTransitive,
	} {
		if got, err := ParseRule(in); got != want || err != nil {
			t.Errorf("ParseRule(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "back", "full transitive"} {
		if _, err := ParseRule(in); err == nil || !strings.Contains(err.Error(), "none, backward, backward_transitive, forward, forward_transitive, full, full_transitive") {
			t.Errorf("ParseRule(%q): %v, want an error listing the rules", in, err)
		}
	}
}

// TestCompatCanRead: each keyword CanRead decides, and those it does not.
// want is the verdict, and a finding's pointer and a piece of its problem
// where one is wanted.
func TestCompatCanRead(t *testing.T) {
	const (
		tree = `{"type":"object","properties":{"v":{"type":"%s"},"kids":{"type":"array","items":{"$ref":"#"}}}}`
		defs = `{"type":"object","properties":{"x":{"$ref":"#/$defs/p"}},"$defs":{"p":{"type":"%s"}}}`
	)
	tmpl := func(f, v string) string { return strings.Replace(f, "%s", v, 1) }
	for _, tc := range []struct {
		name, reader, writer string
		want                 Verdict
		pointer, problem     string
	}{
		{"integer in number", `{"type":"number"}`, `{"type":"integer"}`, vOK, "", ""},
		{"number in integer", `{"type":"integer"}`, `{"type":"number"}`, vBreaks, "", "may write non-integer number, which the reader does not accept (its type is integer)"},
		{"type list", `{"type":["string","null"]}`, `{"type":"string"}`, vOK, "", ""},
		{"type list, writer wider", `{"type":"string"}`, `{"type":["string","null"]}`, vBreaks, "", "may write null"},
		{"writer without type", `{"type":"string"}`, `{}`, vBreaks, "", "its type is string"},
		{"reader true", `true`, `{"type":"string"}`, vOK, "", ""},
		{"reader false", `false`, `{}`, vBreaks, "", "accepts nothing"},
		{"writer false", `{"type":"string"}`, `false`, vOK, "", ""},
		{"annotations", `{"type":"string","title":"t","description":"d","examples":["a"],"default":"a","$comment":"c","x-go":"s","$schema":"https://json-schema.org/draft/2020-12/schema","$id":"urn:a"}`, `{"type":"string"}`, vOK, "", ""},
		{"required", `{"type":"object","required":["price"]}`, `{"type":"object"}`, vBreaks, "/properties/price", `the reader requires "price", which the writer may omit`},
		{"required by both", `{"type":"object","required":["price"]}`, `{"type":"object","required":["price"]}`, vOK, "", ""},
		{"required, writer not an object", `{"type":["object","string"],"required":["price"]}`, `{"type":"string"}`, vOK, "", ""},
		{"required by the writer, undeclared", `{"type":"object","properties":{"a":{"type":"string"}}}`, `{"type":"object","required":["a"]}`, vBreaks, "/properties/a", "its type is string"},
		{"closed reader, open writer", `{"type":"object","properties":{"a":{}},"additionalProperties":false}`, `{"type":"object","properties":{"a":{}}}`, vOK, "", ""},
		{"closed reader, writer's other field", `{"type":"object","additionalProperties":false}`, `{"type":"object","properties":{"a":{}}}`, vBreaks, "/properties/a", "additionalProperties: false"},
		{"closed reader, writer's false field", `{"type":"object","additionalProperties":false}`, `{"type":"object","properties":{"a":false}}`, vOK, "", ""},
		{"reader's extras read the writer's field", `{"type":"object","additionalProperties":{"type":"string"}}`, `{"type":"object","properties":{"a":{"type":"string"}}}`, vOK, "", ""},
		{"reader's extras refuse the writer's field", `{"type":"object","additionalProperties":{"type":"string"}}`, `{"type":"object","properties":{"a":{"type":"integer"}}}`, vBreaks, "/properties/a", "integer"},
		{"writer's extras, reader closed", `{"type":"object","additionalProperties":false}`, `{"type":"object","additionalProperties":{"type":"integer"}}`, vBreaks, "/additionalProperties", "does not declare"},
		{"writer's extras, reader's wider", `{"type":"object","additionalProperties":{"type":"number"}}`, `{"type":"object","additionalProperties":{"type":"integer"}}`, vOK, "", ""},
		{"writer's extras, reader's field", `{"type":"object","properties":{"a":{"type":"string"}}}`, `{"type":"object","additionalProperties":{"type":"integer"}}`, vBreaks, "/properties/a", "integer"},
		{"writer's extras {} are open", `{"type":"object","properties":{"a":{"type":"string"}}}`, `{"type":"object","additionalProperties":{"description":"any"}}`, vOK, "", ""},
		{"$ref", tmpl(defs, "number"), tmpl(defs, "integer"), vOK, "", ""},
		{"$ref, narrower", tmpl(defs, "integer"), tmpl(defs, "number"), vBreaks, "/properties/x", `the writer may write non-integer number`},
		{"$ref on one side", `{"type":"object","properties":{"x":{"type":"integer"}}}`, tmpl(defs, "number"), vBreaks, "/properties/x", ""},
		{"recursive", tmpl(tree, "number"), tmpl(tree, "integer"), vOK, "", ""},
		{"recursive, narrower", tmpl(tree, "integer"), tmpl(tree, "number"), vBreaks, "/properties/v", ""},
		{"recursive, itself", tmpl(tree, "integer"), tmpl(tree, "integer"), vOK, "", ""},
		{"$ref loop", `{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}}`, `{}`, vUnknown, "", "loops"},
		{"remote $ref", `{"$ref":"https://example.com/a.json"}`, `{}`, vUnknown, "", "https://example.com/a.json"},
		{"$ref to an anchor", `{"$ref":"#a","$defs":{"a":{"$anchor":"a"}}}`, `{}`, vUnknown, "", "$ref"},
		{"$ref beside type", `{"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}}`, `{"type":"object"}`, vUnknown, "", "$ref beside type"},
		{"$ref under a nested $id", `{"$ref":"#/$defs/a","$defs":{"a":{"$id":"urn:b","type":"string"}}}`, `{"type":"string"}`, vUnknown, "", "$ref"},
		{"$ref to a missing $defs", `{"$ref":"#/$defs/nope"}`, `{}`, vUnknown, "", "#/$defs/nope"},
		{"$ref to an unresolvable name, escaped", `{"$ref":"#/$defs/a~1b","$defs":{"a/b":{"type":"number"}}}`, `{"type":"integer"}`, vOK, "", ""},
		{"single allOf", `{"allOf":[{"type":"number"}]}`, `{"type":"integer"}`, vOK, "", ""},
		{"allOf of two", `{"allOf":[{"type":"number"},{"minimum":0}]}`, `{"type":"integer"}`, vUnknown, "", "allOf"},
		{"pattern equal", `{"type":"string","pattern":"^o-"}`, `{"type":"string","pattern":"^o-"}`, vOK, "", ""},
		{"pattern in the writer only", `{"type":"string"}`, `{"type":"string","pattern":"^o-"}`, vOK, "", ""},
		{"pattern in the reader only", `{"type":"string","pattern":"^o-"}`, `{"type":"string"}`, vUnknown, "", `pattern "^o-"`},
		{"patterns differ", `{"type":"string","pattern":"^o-"}`, `{"type":"string","pattern":"^o-1"}`, vUnknown, "", "does not compare patterns"},
		{"pattern of a string not written", `{"type":["string","integer"],"pattern":"^o-"}`, `{"type":"integer"}`, vOK, "", ""},
		{"format in the writer only", `{"type":"string"}`, `{"type":"string","format":"email"}`, vOK, "", ""},
		{"format equal", `{"type":"string","format":"email"}`, `{"type":"string","format":"email"}`, vOK, "", ""},
		{"format in the reader only", `{"type":"string","format":"email"}`, `{"type":"string"}`, vBreaks, "", `format "email"`},
		{"formats differ", `{"type":"string","format":"email"}`, `{"type":"string","format":"uri"}`, vBreaks, "", `"uri"`},
		{"maximum", `{"type":"number","maximum":10}`, `{"type":"number","maximum":100}`, vBreaks, "", "the reader needs numbers <= 10 and the writer allows numbers <= 100"},
		{"maximum, writer none", `{"type":"number","maximum":10}`, `{"type":"number"}`, vBreaks, "", "the writer allows any number"},
		{"exclusiveMinimum, writer minimum", `{"type":"number","exclusiveMinimum":0}`, `{"type":"number","minimum":0}`, vBreaks, "", "> 0"},
		{"exclusiveMinimum, writer too", `{"type":"number","exclusiveMinimum":0}`, `{"type":"number","exclusiveMinimum":0}`, vOK, "", ""},
		{"exclusiveMinimum, writer minimum above", `{"type":"number","exclusiveMinimum":0}`, `{"type":"number","minimum":0.5}`, vOK, "", ""},
		{"integers, exclusiveMinimum 0 is minimum 1", `{"type":"integer","minimum":1}`, `{"type":"integer","exclusiveMinimum":0}`, vOK, "", ""},
		{"numbers, exclusiveMinimum 0 is not minimum 1", `{"type":"number","minimum":1}`, `{"type":"number","exclusiveMinimum":0}`, vBreaks, "", ""},
		{"the tighter of minimum and exclusiveMinimum", `{"type":"number","minimum":5}`, `{"type":"number","minimum":0,"exclusiveMinimum":6}`, vOK, "", ""},
		{"bounds on numbers not written", `{"type":["number","string"],"maximum":1}`, `{"type":"string"}`, vOK, "", ""},
		{"maxLength", `{"type":"string","maxLength":5}`, `{"type":"string","maxLength":3}`, vOK, "", ""},
		{"maxLength, writer none", `{"type":"string","maxLength":5}`, `{"type":"string"}`, vBreaks, "", "maxLength"},
		{"minLength", `{"type":"string","minLength":2}`, `{"type":"string","minLength":1}`, vBreaks, "", "minLength"},
		{"minItems", `{"type":"array","minItems":1}`, `{"type":"array","minItems":2}`, vOK, "", ""},
		{"maxItems", `{"type":"array","maxItems":1}`, `{"type":"array","maxItems":2}`, vBreaks, "", "maxItems"},
		{"uniqueItems", `{"type":"array","uniqueItems":true}`, `{"type":"array"}`, vBreaks, "", "unique"},
		{"uniqueItems, writer too", `{"type":"array","uniqueItems":true}`, `{"type":"array","uniqueItems":true}`, vOK, "", ""},
		{"items", `{"type":"array","items":{"type":"number"}}`, `{"type":"array","items":{"type":"integer"}}`, vOK, "", ""},
		{"items, narrower", `{"type":"array","items":{"type":"integer"}}`, `{"type":"array","items":{"type":"number"}}`, vBreaks, "/items", ""},
		{"items, writer none", `{"type":"array","items":{"type":"integer"}}`, `{"type":"array"}`, vBreaks, "/items", ""},
		{"multipleOf, writer's a multiple", `{"type":"integer","multipleOf":2}`, `{"type":"integer","multipleOf":4}`, vOK, "", ""},
		{"multipleOf mismatch", `{"type":"integer","multipleOf":2}`, `{"type":"integer","multipleOf":3}`, vUnknown, "", "multipleOf"},
		{"multipleOf, writer none", `{"type":"integer","multipleOf":2}`, `{"type":"integer"}`, vUnknown, "", "multipleOf"},
		{"multipleOf 1 of integers", `{"multipleOf":1}`, `{"type":"integer"}`, vOK, "", ""},
		{"const in the reader's enum", `{"enum":["a","b"]}`, `{"const":"a"}`, vOK, "", ""},
		{"enum against a const", `{"const":"a"}`, `{"enum":["a","b"]}`, vBreaks, "", `the writer may write "b", which the reader does not accept (it is not its const)`},
		{"enum against a type", `{"type":"string"}`, `{"enum":["a",1]}`, vBreaks, "", `may write 1`},
		{"enum, a value its own type refuses", `{"type":"string"}`, `{"type":"string","enum":["a",1]}`, vOK, "", ""},
		{"enum against bounds", `{"type":"integer","maximum":5}`, `{"enum":[1,5]}`, vOK, "", ""},
		{"enum against a bound", `{"type":"integer","exclusiveMaximum":5}`, `{"enum":[1,5]}`, vBreaks, "", "numbers < 5"},
		{"enum against a pattern", `{"pattern":"^o-"}`, `{"enum":["o-1","o-2"]}`, vOK, "", ""},
		{"enum against a pattern, refused", `{"pattern":"^o-"}`, `{"enum":["o-1","x"]}`, vBreaks, "", `may write "x"`},
		{"enum against an ECMA pattern", `{"pattern":"(?=o)"}`, `{"enum":["o-1"]}`, vUnknown, "", "ECMA 262"},
		{"enum against a format", `{"format":"email"}`, `{"enum":["a@b.c"]}`, vUnknown, "", "format"},
		{"enum against maxLength", `{"maxLength":2}`, `{"enum":["ab","abc"]}`, vBreaks, "", `"abc"`},
		{"enum of objects", `{"type":"object","required":["a"]}`, `{"enum":[{"a":1}]}`, vUnknown, "", "object value"},
		{"enum of objects, equal", `{"enum":[{"a":1},{"a":2}]}`, `{"enum":[{"a":1}]}`, vOK, "", ""},
		{"enum, integer as 1.0", `{"enum":[1]}`, `{"const":1.0}`, vOK, "", ""},
		{"enum, writer unbounded", `{"enum":["a","b"]}`, `{"type":"string"}`, vBreaks, "", "enum"},
		{"booleans against an enum", `{"enum":[true,false]}`, `{"type":"boolean"}`, vOK, "", ""},
		{"booleans against a narrower enum", `{"enum":[true]}`, `{"type":"boolean"}`, vBreaks, "", "false"},
		{"oneOf in the reader", `{"oneOf":[{"type":"string"}]}`, `{"type":"string"}`, vUnknown, "", "the reader uses oneOf"},
		{"oneOf in the writer, what else breaks is unknown", `{"type":"string"}`, `{"type":["string","integer"],"anyOf":[{"type":"string"}]}`, vUnknown, "", "unless keywords the checker does not decide rule it out"},
		{"oneOf in the reader, what else breaks stands", `{"type":"string","anyOf":[{"minLength":1}]}`, `{"type":"integer"}`, vBreaks, "", ""},
		{"oneOf through a $ref", `{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"$defs":{"a":{"oneOf":[{}]}}}`, `{"type":"object","properties":{"a":{}}}`, vUnknown, "/properties/a", `the reader (at "/$defs/a") uses oneOf`},
		{"patternProperties in the reader may read what additionalProperties refuses", `{"type":"object","patternProperties":{"^x":{}},"additionalProperties":false}`, `{"type":"object","properties":{"xa":{}}}`, vUnknown, "/properties/xa", "(additionalProperties: false), unless keywords"},
		{"prefixItems in the reader may read what items refuses", `{"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"}}`, `{"type":"array","items":{"type":"string"},"maxItems":1}`, vUnknown, "/items", "unless keywords"},
		{"not", `{"not":{"type":"null"}}`, `{}`, vUnknown, "", "not"},
		{"if", `{}`, `{"if":{},"then":{}}`, vUnknown, "", "if"},
		{"patternProperties", `{"type":"object","patternProperties":{"^a":{}}}`, `{"type":"object"}`, vUnknown, "", "patternProperties"},
		{"minProperties", `{"type":"object","minProperties":1}`, `{"type":"object"}`, vUnknown, "", "minProperties"},
		{"prefixItems", `{"type":"array"}`, `{"type":"array","prefixItems":[{}]}`, vUnknown, "", "prefixItems"},
		{"malformed", `{"type":"strang"}`, `{}`, vUnknown, "", "malformed type"},
		{"malformed items", `{"type":"array","items":[{}]}`, `{"type":"array"}`, vUnknown, "", "malformed items"},
		{"not a schema inside", `{"type":"object","properties":{"a":5}}`, `{"type":"object","properties":{"a":{}}}`, vUnknown, "/properties/a", "neither an object nor a boolean"},
		{"escaped pointer", `{"type":"object","required":["a/b~c"]}`, `{"type":"object"}`, vBreaks, "/properties/a~1b~0c", ""},
	} {
		v, fs, err := CanRead([]byte(tc.reader), []byte(tc.writer))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if v != tc.want {
			t.Errorf("%s: %s, want %s: %+v", tc.name, v, tc.want, fs)
			continue
		}
		if tc.want == VerdictCompatible {
			if len(fs) != 0 {
				t.Errorf("%s: compatible with findings %+v", tc.name, fs)
			}
			continue
		}
		if !slices.ContainsFunc(fs, func(f Finding) bool {
			return f.Verdict == tc.want && f.Pointer == tc.pointer && strings.Contains(f.Problem, tc.problem)
		}) {
			t.Errorf("%s: findings %+v, want one at %q saying %q", tc.name, fs, tc.pointer, tc.problem)
		}
	}
}

// TestCompatFindingsSorted: findings come by pointer, whatever the order
// of the properties in the documents.
func TestCompatFindingsSorted(t *testing.T) {
	reader := `{"type":"object","required":["z","a","m"],"properties":{"b":{"type":"string"},"y":{"type":"string"}}}`
	writer := `{"type":"object","properties":{"y":{"type":"integer"},"b":{"type":"integer"}}}`
	for range 5 {
		_, fs, err := CanRead([]byte(reader), []byte(writer))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range fs {
			got = append(got, f.Pointer)
		}
		want := []string{"/properties/a", "/properties/b", "/properties/m", "/properties/y", "/properties/z"}
		if !slices.Equal(got, want) {
			t.Fatalf("pointers %v, want %v", got, want)
		}
	}
}

// TestCompatBounded: $refs that pair every reader subschema with every
// writer one stop at maxDepth, or maxVisits, unknown.
func TestCompatBounded(t *testing.T) {
	ring := func(n int) []byte {
		var b strings.Builder
		b.WriteString(`{"$ref":"#/$defs/d0","$defs":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"d%d":{"type":"object","properties":{"a":{"$ref":"#/$defs/d%d"}}}`, i, (i+1)%n)
		}
		b.WriteString(`}}`)
		return []byte(b.String())
	}
	// Rings of 181 and 182 pair (k mod 181, k mod 182) for k < 181·182,
	// each one level deeper.
	v, fs, err := CanRead(ring(181), ring(182))
	if err != nil || v != VerdictUnknown || len(fs) != 1 || !strings.Contains(fs[0].Problem, "stopped") || strings.Count(fs[0].Pointer, "/a") != maxDepth {
		t.Fatalf("%s %+v %v", v, fs, err)
	}
	if v, fs, err := CanRead(ring(181), ring(181)); err != nil || v != VerdictCompatible {
		t.Fatalf("a ring reading itself: %s %+v %v", v, fs, err)
	}
	defer func(n int) { maxVisits = n }(maxVisits)
	maxVisits = 100
	v, fs, err = CanRead(ring(181), ring(182))
	if err != nil || v != VerdictUnknown || len(fs) != 1 || strings.Count(fs[0].Pointer, "/a") != 100 {
		t.Fatalf("at most 100 visits: %s %+v %v", v, fs, err)
	}
}

// TestCompatNotASchema: only a document that is not JSON or not an object
// or a boolean is an error, and it names the side.
func TestCompatNotASchema(t *testing.T) {
	for _, tc := range []struct{ reader, writer, side string }{
		{`{`, `{}`, "reader"},
		{`{}`, `[1]`, "writer"},
		{`5`, `{}`, "reader"},
		{`{}`, `"s"`, "writer"},
		{`{}`, `null`, "writer"},
	} {
		_, _, err := CanRead([]byte(tc.reader), []byte(tc.writer))
		if !errors.Is(err, ErrSchema) || !strings.HasPrefix(err.Error(), tc.side+":") {
			t.Errorf("CanRead(%s, %s): %v, want ErrSchema naming the %s", tc.reader, tc.writer, err, tc.side)
		}
	}
}

// FuzzCanRead: nothing panics, a verdict agrees with its findings, and a
// schema always reads itself (compared keyword by keyword, not as equal
// documents): compatible or unknown, never incompatible.
func FuzzCanRead(f *testing.F) {
	f.Add([]byte(order), []byte(`{"type":"object","properties":{"id":{"type":"string"}}}`))
	for _, tc := range compatChanges {
		f.Add([]byte(tc.old), []byte(tc.new))
	}
	f.Add([]byte(`{"type":"object","properties":{"v":{"type":"integer","exclusiveMinimum":0},"kids":{"type":"array","items":{"$ref":"#"}}}}`), []byte(`true`))
	f.Add([]byte(`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}`), []byte(`false`))
	f.Add([]byte(`{"enum":[1,"a",null,{"a":[1]}],"type":["integer","string"],"pattern":"^a","maximum":3,"multipleOf":0.5}`), []byte(`{"const":2.5}`))
	f.Add([]byte(`{"type":"object","additionalProperties":{"type":"number"},"required":["x"],"properties":{"y":false}}`), []byte(`{"type":"object","additionalProperties":false,"required":["x"]}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		for i, pair := range [][2][]byte{{a, b}, {b, a}, {a, a}, {b, b}} {
			v, fs, err := canRead(pair[0], pair[1], false)
			if err != nil {
				if !errors.Is(err, ErrSchema) {
					t.Fatalf("%v is not ErrSchema", err)
				}
				continue
			}
			want := VerdictCompatible
			for _, f := range fs {
				if f.Verdict != VerdictIncompatible && f.Verdict != VerdictUnknown {
					t.Fatalf("a finding %+v", f)
				}
				want = worse(want, f.Verdict)
			}
			if v != want {
				t.Fatalf("verdict %s with findings %+v", v, fs)
			}
			if i >= 2 && v == VerdictIncompatible {
				t.Fatalf("%s cannot read itself: %+v", pair[0], fs)
			}
		}
	})
}
