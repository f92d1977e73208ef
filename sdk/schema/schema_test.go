package schema_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	invopop "github.com/invopop/jsonschema"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/schema"
)

// Address is nested in Order, twice.
type Address struct {
	Street string `json:"street"`
	City   string `json:"city,omitempty"`
}

// Order has a field of each kind Of describes.
type Order struct {
	ID      string            `json:"id"`
	Note    string            `json:"note,omitempty"`
	Placed  time.Time         `json:"placed"`
	Lines   []Line            `json:"lines"`
	Tags    []string          `json:"tags,omitempty"`
	Attrs   map[string]string `json:"attrs,omitempty"`
	Ship    Address           `json:"ship"`
	Bill    *Address          `json:"bill,omitempty"`
	Cents   int64             `json:"cents" jsonschema:"minimum=0"`
	Paid    bool              `json:"paid"`
	Secret  string            `json:"-"`
	private string
	Embedded
}

// Line is an element of Order's slice.
type Line struct {
	SKU string  `json:"sku"`
	Qty float64 `json:"qty"`
}

// Embedded's fields are Order's, as encoding/json marshals them.
type Embedded struct {
	Channel string `json:"channel"`
}

// compile compiles doc as the host does: 2020-12 by default, no loading.
func compile(t *testing.T, doc []byte) *jsonschema.Schema {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatalf("schema is not JSON: %v\n%s", err, doc)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no scheme: nothing loads
	if err := c.AddResource("mesh:///schema.json", v); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mesh:///schema.json")
	if err != nil {
		t.Fatalf("schema does not compile: %v\n%s", err, doc)
	}
	return sch
}

func valid(t *testing.T, sch *jsonschema.Schema, body string) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
	if err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return sch.Validate(v)
}

// TestOfOrder: the schema of a struct with required and optional fields,
// a nested struct (by $defs), a slice, time.Time and a map, read back.
func TestOfOrder(t *testing.T) {
	s := schema.Of[Order]("order.placed", "3")
	if s.Event != "order.placed" || s.Version != "3" {
		t.Errorf("declaration %s %s", s.Event, s.Version)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, s.JSON); err != nil || !bytes.Equal(compact.Bytes(), s.JSON) {
		t.Errorf("not compact JSON (%v): %s", err, s.JSON)
	}
	var got struct {
		Schema               string                     `json:"$schema"`
		ID                   *string                    `json:"$id"`
		Ref                  *string                    `json:"$ref"`
		Type                 string                     `json:"type"`
		Required             []string                   `json:"required"`
		AdditionalProperties *json.RawMessage           `json:"additionalProperties"`
		Properties           map[string]json.RawMessage `json:"properties"`
		Defs                 map[string]json.RawMessage `json:"$defs"`
	}
	if err := json.Unmarshal(s.JSON, &got); err != nil {
		t.Fatal(err)
	}
	if got.Schema != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema %q", got.Schema)
	}
	if got.ID != nil || got.Ref != nil {
		t.Errorf("root has $id %v or $ref %v, want neither: %s", got.ID, got.Ref, s.JSON)
	}
	if got.Type != "object" || got.AdditionalProperties != nil {
		t.Errorf("root type %q, additionalProperties %s: want an open object", got.Type, deref(got.AdditionalProperties))
	}
	if want := []string{"id", "placed", "lines", "ship", "cents", "paid", "channel"}; fmt.Sprint(got.Required) != fmt.Sprint(want) {
		t.Errorf("required %q, want %q", got.Required, want)
	}
	props := map[string]string{
		"id":      `{"type":"string"}`,
		"note":    `{"type":"string"}`,
		"placed":  `{"type":"string","format":"date-time"}`,
		"lines":   `{"items":{"$ref":"#/$defs/Line"},"type":"array"}`,
		"tags":    `{"items":{"type":"string"},"type":"array"}`,
		"attrs":   `{"additionalProperties":{"type":"string"},"type":"object"}`,
		"ship":    `{"$ref":"#/$defs/Address"}`,
		"bill":    `{"$ref":"#/$defs/Address"}`,
		"cents":   `{"type":"integer","minimum":0}`,
		"paid":    `{"type":"boolean"}`,
		"channel": `{"type":"string"}`,
	}
	for name, want := range props {
		if g := string(got.Properties[name]); g != want {
			t.Errorf("property %s: %s, want %s", name, g, want)
		}
	}
	if len(got.Properties) != len(props) {
		t.Errorf("%d properties, want %d (no Secret, no private): %s", len(got.Properties), len(props), s.JSON)
	}
	defs := map[string]string{
		"Address": `{"properties":{"street":{"type":"string"},"city":{"type":"string"}},"type":"object","required":["street"]}`,
		"Line":    `{"properties":{"sku":{"type":"string"},"qty":{"type":"number"}},"type":"object","required":["sku","qty"]}`,
	}
	for name, want := range defs {
		if g := string(got.Defs[name]); g != want {
			t.Errorf("$defs/%s: %s, want %s", name, g, want)
		}
	}
	if len(got.Defs) != len(defs) {
		t.Errorf("$defs %s, want Address and Line", s.JSON)
	}
	if again := schema.Of[Order]("order.placed", "3"); !bytes.Equal(again.JSON, s.JSON) {
		t.Errorf("a second Of differs:\n%s\n%s", again.JSON, s.JSON)
	}
}

func deref(m *json.RawMessage) string {
	if m == nil {
		return "none"
	}
	return string(*m)
}

// TestOfValidates: what encoding/json makes of an Order conforms to its
// schema as the host compiles it; a body without a required field, with
// a wrong type or breaking a tag's keyword does not; one with a field the
// type does not know does (an open content model).
func TestOfValidates(t *testing.T) {
	sch := compile(t, schema.Of[Order]("order.placed", "1").JSON)
	o := Order{ID: "o-1", Placed: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), Lines: []Line{{SKU: "a", Qty: 2}},
		Attrs: map[string]string{"gift": "yes"}, Ship: Address{Street: "Main St"}, Bill: &Address{Street: "Side St", City: "Oslo"}, Cents: 900}
	body, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := valid(t, sch, string(body)); err != nil {
		t.Errorf("an Order %s: %v", body, err)
	}
	const base = `"id":"o-1","placed":"2026-12-03T10:00:00Z","lines":[],"ship":{"street":"x"},"cents":1,"paid":false,"channel":"web"`
	for _, c := range []struct {
		name, body string
		ok         bool
	}{
		{"every required field", `{` + base + `}`, true},
		{"a field added later", `{` + base + `,"coupon":"XMAS"}`, true},
		{"a nested field added later", `{` + strings.Replace(base, `"street":"x"`, `"street":"x","zip":"0150"`, 1) + `}`, true},
		{"no id", `{` + strings.Replace(base, `"id":"o-1",`, "", 1) + `}`, false},
		{"no street in ship", `{` + strings.Replace(base, `"street":"x"`, "", 1) + `}`, false},
		{"cents a string", `{` + strings.Replace(base, `"cents":1`, `"cents":"1"`, 1) + `}`, false},
		{"cents below the tag's minimum", `{` + strings.Replace(base, `"cents":1`, `"cents":-1`, 1) + `}`, false},
		{"a line's qty a string", `{` + strings.Replace(base, `"lines":[]`, `"lines":[{"sku":"a","qty":"2"}]`, 1) + `}`, false},
		{"an attr not a string", `{` + base + `,"attrs":{"gift":true}}`, false},
		// The documented trap: a nil slice without omitempty is null.
		{"lines null", `{` + strings.Replace(base, `"lines":[]`, `"lines":null`, 1) + `}`, false},
	} {
		if err := valid(t, sch, c.body); (err == nil) != c.ok {
			t.Errorf("%s: %s: %v, want ok %v", c.name, c.body, err, c.ok)
		}
	}
}

// Tree refers to itself.
type Tree struct {
	Name     string `json:"name"`
	Children []Tree `json:"children,omitempty"`
}

// Page is generic.
type Page[T any] struct {
	Items []T `json:"items"`
}

// TestOfShapes: a recursive type stays under $defs and the root refers to
// it; a pointer is its element; a slice, a map and an interface at the
// root; a generic type's name is made fit for a JSON pointer; two types
// of one name get two definitions. Every one compiles, refers only inside
// itself, and validates a body of its type.
func TestOfShapes(t *testing.T) {
	type Address struct { // another Address than the package's
		Line1 string `json:"line1"`
	}
	type Both struct {
		Here  Address `json:"here"`
		There struct {
			A Address `json:"a"`
		} `json:"there"`
		Pkg Address2 `json:"pkg"`
	}
	for _, c := range []struct {
		name     string
		s        sdk.Schema
		contains []string
		good     string
		bad      string
	}{
		{"recursive", schema.Of[Tree]("t", "1"), []string{`"$ref":"#/$defs/Tree"`, `"items":{"$ref":"#/$defs/Tree"}`},
			`{"name":"a","children":[{"name":"b"}]}`, `{"name":"a","children":[{}]}`},
		{"pointer", schema.Of[*Line]("t", "1"), []string{`"required":["sku","qty"]`},
			`{"sku":"a","qty":1}`, `{"sku":"a"}`},
		{"slice", schema.Of[[]Line]("t", "1"), []string{`"type":"array"`},
			`[{"sku":"a","qty":1}]`, `[{"sku":"a"}]`},
		{"map", schema.Of[map[string]int]("t", "1"), []string{`"additionalProperties":{"type":"integer"}`},
			`{"a":1}`, `{"a":"1"}`},
		{"interface", schema.Of[any]("t", "1"), nil, `[1,"two"]`, ``},
		{"generic", schema.Of[Page[Line]]("t", "1"), []string{`"$ref":"#/$defs/Line"`},
			`{"items":[{"sku":"a","qty":1}]}`, `{"items":[{"qty":1}]}`},
		{"one name twice", schema.Of[Both]("t", "1"), []string{`"Address":`, `"schema_test.Address":`},
			`{"here":{"line1":"x"},"there":{"a":{"line1":"y"}},"pkg":{"street":"z"}}`, `{"here":{"street":"x"},"there":{"a":{"line1":"y"}},"pkg":{"street":"z"}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, want := range c.contains {
				if !strings.Contains(string(c.s.JSON), want) {
					t.Errorf("%s, want %s in it", c.s.JSON, want)
				}
			}
			if strings.Contains(string(c.s.JSON), `"$id"`) {
				t.Errorf("an $id: %s", c.s.JSON)
			}
			sch := compile(t, c.s.JSON)
			if err := valid(t, sch, c.good); err != nil {
				t.Errorf("%s: %v\n%s", c.good, err, c.s.JSON)
			}
			if c.bad != "" {
				if err := valid(t, sch, c.bad); err == nil {
					t.Errorf("%s conforms, want it refused\n%s", c.bad, c.s.JSON)
				}
			}
		})
	}
}

// Address2 is the package's Address, under a name that does not hide it
// inside TestOfShapes.
type Address2 = Address

// TestOfPanics: a type that JSON cannot describe is a programming error,
// and the panic names the type and the declaration.
func TestOfPanics(t *testing.T) {
	type Bad struct {
		Done chan bool `json:"done"`
	}
	defer func() {
		p := recover()
		if msg := fmt.Sprint(p); p == nil || !strings.Contains(msg, "schema_test.Bad") || !strings.Contains(msg, `"x.y"`) || !strings.Contains(msg, "chan bool") {
			t.Errorf("panic %v, want one naming schema_test.Bad, x.y and chan bool", p)
		}
	}()
	schema.Of[Bad]("x.y", "1")
}

// Remote refers outside its schema, by its own JSONSchema method.
type Remote struct{}

// JSONSchema describes Remote by a URL, which the host would refuse.
func (Remote) JSONSchema() *invopop.Schema {
	return &invopop.Schema{Ref: "https://example.com/remote.json"}
}

// TestOfRefusesRemoteRef: a $ref outside the schema is refused when the
// schema is made, not first when the host loads it.
func TestOfRefusesRemoteRef(t *testing.T) {
	type HasRemote struct {
		R Remote `json:"r"`
	}
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "https://example.com/remote.json") {
			t.Errorf("panic %v, want one naming the URL", p)
		}
	}()
	schema.Of[HasRemote]("x.y", "1")
}

// TestFile: a schema file read from an fs.FS, as written; the errors of
// a missing file, one that is not JSON, and JSON that is not a schema.
func TestFile(t *testing.T) {
	fsys := fstest.MapFS{
		"schemas/site.created.1.json": {Data: []byte("{\n  \"type\": \"object\"\n}\n")},
		"schemas/any.json":            {Data: []byte("true")},
		"schemas/broken.json":         {Data: []byte(`{"type": "object"`)},
		"schemas/empty.json":          {Data: nil},
		"schemas/list.json":           {Data: []byte(`[{"type": "object"}]`)},
		"schemas/string.json":         {Data: []byte(`"object"`)},
		"schemas/null.json":           {Data: []byte(`null`)},
		"schemas/trailing.json":       {Data: []byte(`{} {}`)},
	}
	s, err := schema.File(fsys, "schemas/site.created.1.json", "site.created", "1")
	if err != nil {
		t.Fatal(err)
	}
	if s.Event != "site.created" || s.Version != "1" || string(s.JSON) != "{\n  \"type\": \"object\"\n}\n" {
		t.Errorf("File: %+v", s)
	}
	if s, err := schema.File(fsys, "schemas/any.json", "site.created", "1"); err != nil || string(s.JSON) != "true" {
		t.Errorf("a boolean schema: %q, %v", s.JSON, err)
	}
	for _, c := range []struct {
		path    string
		is      error
		mention string
	}{
		{"schemas/missing.json", fs.ErrNotExist, "schemas/missing.json"},
		{"schemas/broken.json", sdk.ErrInvalid, "not JSON"},
		{"schemas/empty.json", sdk.ErrInvalid, "not JSON"},
		{"schemas/trailing.json", sdk.ErrInvalid, "not JSON"},
		{"schemas/list.json", sdk.ErrInvalid, "array"},
		{"schemas/string.json", sdk.ErrInvalid, "string"},
		{"schemas/null.json", sdk.ErrInvalid, "null"},
	} {
		s, err := schema.File(fsys, c.path, "site.created", "2")
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.mention) || !strings.Contains(err.Error(), "site.created version 2") {
			t.Errorf("%s: %v, want an error wrapping %v, naming site.created version 2 and saying %q", c.path, err, c.is, c.mention)
		}
		if s.JSON != nil {
			t.Errorf("%s: a schema with the error: %+v", c.path, s)
		}
	}
}

// TestMustFile: MustFile returns File's schema, and panics with its
// error.
func TestMustFile(t *testing.T) {
	fsys := fstest.MapFS{"a.json": {Data: []byte(`{}`)}}
	if s := schema.MustFile(fsys, "a.json", "a.b", "1"); string(s.JSON) != `{}` {
		t.Errorf("MustFile: %+v", s)
	}
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("panic %v, want File's error", err)
		}
	}()
	schema.MustFile(fsys, "b.json", "a.b", "1")
}

// FuzzFile: File never panics, and accepts exactly the documents that are
// a JSON object or boolean, as they are.
func FuzzFile(f *testing.F) {
	for _, s := range []string{`{}`, `true`, `false`, `[]`, `null`, `1`, `"s"`, `{"type":"object"}`, `{`, ``, `{} {}`, ` {"a":[1,{"b":null}]} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := schema.File(fstest.MapFS{"s.json": {Data: doc}}, "s.json", "a.b", "1")
		var v any
		isSchema := json.Unmarshal(doc, &v) == nil
		switch v.(type) {
		case map[string]any, bool:
		default:
			isSchema = false
		}
		if (err == nil) != isSchema {
			t.Fatalf("File(%q): %v, want accepted %v", doc, err, isSchema)
		}
		if err == nil && !bytes.Equal(s.JSON, doc) {
			t.Fatalf("File(%q) = %q, want it as written", doc, s.JSON)
		}
		if err != nil && !errors.Is(err, sdk.ErrInvalid) {
			t.Fatalf("File(%q): %v, want ErrInvalid", doc, err)
		}
	})
}

// TestForTool: a tool's declaration holds its request's and its
// response's schemas, each as Of makes them.
func TestForTool(t *testing.T) {
	type quoteRequest struct {
		Qty int `json:"qty"`
	}
	type quote struct {
		Price float64 `json:"price"`
	}
	s := schema.ForTool[quoteRequest, quote]("shop.quote", "1")
	if s.Tool != "shop.quote" || s.Event != "" || s.Version != "1" ||
		string(s.JSON) != string(schema.Of[quoteRequest]("x", "1").JSON) || string(s.Response) != string(schema.Of[quote]("x", "1").JSON) {
		t.Errorf("ForTool: %+v", s)
	}
}
