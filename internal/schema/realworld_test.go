package schema_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/sdk"
	sdkschema "github.com/meshkit/mesh/sdk/schema"
	"github.com/meshkit/mesh/test/conformance"
)

// Types as a module describes them with sdk/schema.Of: named types under
// $defs, a recursive one, maps, times, pointers, embedded structs.
type (
	money struct {
		Amount   float64 `json:"amount" jsonschema:"minimum=0"`
		Currency string  `json:"currency" jsonschema:"enum=EUR,enum=USD,enum=GBP"`
	}
	line struct {
		SKU   string `json:"sku" jsonschema:"pattern=^[A-Z]{3}-[0-9]{1,12}$"`
		Qty   int    `json:"qty" jsonschema:"minimum=1,maximum=1000"`
		Price money  `json:"price"`
	}
	audit struct {
		At time.Time `json:"at"`
		By string    `json:"by" jsonschema:"format=email"`
	}
	category struct {
		Name string     `json:"name"`
		Subs []category `json:"subs,omitempty"`
	}
	orderPlaced struct {
		audit
		ID       string            `json:"id" jsonschema:"format=uuid"`
		Lines    []line            `json:"lines" jsonschema:"minItems=1"`
		Total    money             `json:"total"`
		Ship     *line             `json:"ship,omitempty"`
		Labels   map[string]string `json:"labels,omitempty"`
		Category category          `json:"category"`
		Notes    []string          `json:"notes,omitempty" jsonschema:"uniqueItems=true"`
	}
)

// Hand-written schemas of the shapes real ones take.
var handWritten = map[string]struct{ doc, body string }{
	"geojson": {`{"$ref":"#/$defs/geometry","$defs":{
		"position":{"type":"array","minItems":2,"maxItems":3,"items":{"type":"number"}},
		"ring":{"type":"array","minItems":4,"items":{"$ref":"#/$defs/position"}},
		"geometry":{"oneOf":[
			{"type":"object","required":["type","coordinates"],"properties":{"type":{"const":"Point"},"coordinates":{"$ref":"#/$defs/position"}}},
			{"type":"object","required":["type","coordinates"],"properties":{"type":{"const":"LineString"},"coordinates":{"type":"array","items":{"$ref":"#/$defs/position"}}}},
			{"type":"object","required":["type","coordinates"],"properties":{"type":{"const":"Polygon"},"coordinates":{"type":"array","items":{"$ref":"#/$defs/ring"}}}},
			{"type":"object","required":["type","coordinates"],"properties":{"type":{"const":"MultiPolygon"},"coordinates":{"type":"array","items":{"type":"array","items":{"$ref":"#/$defs/ring"}}}}},
			{"type":"object","required":["type","geometries"],"properties":{"type":{"const":"GeometryCollection"},"geometries":{"type":"array","items":{"$ref":"#/$defs/geometry"}}}}]}}}`,
		`{"type":"GeometryCollection","geometries":[{"type":"Point","coordinates":[1,2]},{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,0]]]},
			{"type":"GeometryCollection","geometries":[{"type":"LineString","coordinates":[[0,0],[3,4.5]]}]}]}`},
	"json patch": {`{"type":"array","items":{"oneOf":[
		{"type":"object","additionalProperties":false,"required":["op","path","value"],"properties":{"op":{"enum":["add","replace","test"]},"path":{"$ref":"#/$defs/ptr"},"value":{}}},
		{"type":"object","additionalProperties":false,"required":["op","path"],"properties":{"op":{"const":"remove"},"path":{"$ref":"#/$defs/ptr"}}},
		{"type":"object","additionalProperties":false,"required":["op","path","from"],"properties":{"op":{"enum":["move","copy"]},"path":{"$ref":"#/$defs/ptr"},"from":{"$ref":"#/$defs/ptr"}}}]},
		"$defs":{"ptr":{"type":"string","pattern":"^(/([^~/]|~[01])*)*$"}}}`,
		`[{"op":"add","path":"/a/b","value":{"x":[1,2]}},{"op":"remove","path":"/c"},{"op":"move","from":"/d","path":"/e~1f"}]`},
	"cloudevent": {`{"type":"object","required":["specversion","id","source","type"],"properties":{
		"specversion":{"const":"1.0"},"id":{"type":"string","minLength":1},"source":{"type":"string","format":"uri-reference"},
		"type":{"type":"string","pattern":"^[a-z0-9]+(\\.[a-z0-9-]+)+$"},"time":{"type":"string","format":"date-time"},
		"datacontenttype":{"type":"string"},"data":{}},
		"patternProperties":{"^[a-z0-9]{1,20}$":{"type":["string","integer","boolean"]}},
		"dependentRequired":{"data":["datacontenttype"]}}`,
		`{"specversion":"1.0","id":"1","source":"/shop","type":"com.shop.order","time":"2026-12-05T10:00:00Z","ext":1,"data":{"n":1},"datacontenttype":"application/json"}`},
	"if then else": {`{"type":"object","properties":{"country":{"enum":["US","CA","NL"]}},
		"if":{"properties":{"country":{"const":"US"}}},"then":{"properties":{"zip":{"pattern":"^[0-9]{5}(-[0-9]{4})?$"}}},
		"else":{"if":{"properties":{"country":{"const":"CA"}}},"then":{"properties":{"zip":{"pattern":"^[A-Z][0-9][A-Z] [0-9][A-Z][0-9]$"}}},
		"else":{"properties":{"zip":{"pattern":"^[0-9]{4} ?[A-Z]{2}$"}}}},
		"unevaluatedProperties":false}`,
		`{"country":"NL","zip":"1011 AB"}`},
	"draft-07 meta-schema": {`{"$schema":"http://json-schema.org/draft-07/schema#","$ref":"http://json-schema.org/draft-07/schema#"}`,
		`{"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"items":{"$ref":"#"}}]}},"definitions":{"x":{"allOf":[true,{"not":{"const":1}}]}}}`},
	"draft-04": {`{"$schema":"http://json-schema.org/draft-04/schema#","type":"object","properties":{"n":{"type":"integer","minimum":0,"exclusiveMinimum":true},
		"tags":{"type":"array","items":[{"type":"string"}],"additionalItems":{"type":"integer"}}},"dependencies":{"n":{"required":["tags"]}}}`,
		`{"n":1,"tags":["a",1,2]}`},
}

// events is a discriminated union of n event types, as a generated
// OpenAPI document has them: oneOf of n, each an allOf of a base and its
// own properties, its payload a $ref.
func events(n int) string {
	var variants, defs []string
	for i := range n {
		variants = append(variants, fmt.Sprintf(`{"allOf":[{"$ref":"#/$defs/base"},{"properties":{"kind":{"const":"e%d"},"payload":{"$ref":"#/$defs/p%d"}}}]}`, i, i))
		defs = append(defs, fmt.Sprintf(`"p%d":{"type":"object","required":["id"],"properties":{"id":{"type":"string"},"n%d":{"type":"integer","minimum":0},"at":{"type":"string","format":"date-time"}}}`, i, i))
	}
	return `{"oneOf":[` + strings.Join(variants, ",") + `],"$defs":{"base":{"type":"object","required":["kind","payload"],"properties":{"kind":{"type":"string"},"v":{"type":"integer"}}},` + strings.Join(defs, ",") + `}}`
}

// mesh is a schema of n object types, each of 8 properties referring to
// other types (a DAG of many paths) and an array of the next: a large
// schema, as a module generated from a big domain model would declare.
func mesh(n int) string {
	var defs []string
	for i := range n {
		var props []string
		for j := 1; j <= 6; j++ {
			props = append(props, fmt.Sprintf(`"f%d":{"$ref":"#/$defs/t%d"}`, j, (i+j)%n))
		}
		props = append(props, `"name":{"type":"string","maxLength":64}`, fmt.Sprintf(`"items":{"type":"array","items":{"$ref":"#/$defs/t%d"}}`, (i+1)%n))
		defs = append(defs, fmt.Sprintf(`"t%d":{"type":"object","properties":{%s}}`, i, strings.Join(props, ",")))
	}
	return `{"$ref":"#/$defs/t0","$defs":{` + strings.Join(defs, ",") + `}}`
}

// TestRealSchemasCompile: the schemas of the repository's modules, tests
// and examples, schemas sdk/schema generates, and hand-written ones of
// the shapes real schemas take (GeoJSON, JSON Patch, a CloudEvent, a
// discriminated union of 300 types, if/then/else, the draft-07
// meta-schema, a 200 KiB domain model) compile within the bounds, and
// their bodies validate (or break them) without reaching the budget.
func TestRealSchemasCompile(t *testing.T) {
	type decl struct {
		name string
		doc  []byte
		body string
	}
	var decls []decl
	for _, m := range []sdk.Module{umami.Module(time.Second), notifier.Module(nil)} {
		for _, s := range m.Schemas {
			decls = append(decls, decl{m.Name + " " + s.Event, s.JSON, `{"id":1,"name":"a","to":"b","subject":"c"}`})
		}
	}
	for _, e := range conformance.PriceEmits {
		body, _ := json.Marshal(e.Body)
		decls = append(decls, decl{"conformance price v2 " + e.Name, conformance.PriceSchemaV2, string(body)},
			decl{"conformance price v1 " + e.Name, conformance.PriceSchemaV1, string(body)})
	}
	decls = append(decls, decl{"conformance quote request", conformance.QuoteRequestSchema, `{"n":2}`},
		decl{"conformance quote response", conformance.QuoteResponseSchema, `{"total":2}`})
	generated := sdkschema.Of[orderPlaced]("order.placed", "1")
	orderBody, _ := json.Marshal(orderPlaced{ID: "5b3a3c52-0f2a-4d0f-9a43-5c8d2c1a6b0e", Lines: []line{{SKU: "ABC-1", Qty: 2, Price: money{1, "EUR"}}},
		Labels: map[string]string{"a": "b"}, Category: category{Name: "a", Subs: []category{{Name: "b", Subs: []category{{Name: "c"}}}}}, Notes: []string{"x", "y"}})
	decls = append(decls, decl{"sdk/schema.Of", generated.JSON, string(orderBody)})
	for name, h := range handWritten {
		decls = append(decls, decl{name, []byte(h.doc), h.body})
	}
	union := events(300)
	decls = append(decls, decl{"300 events", []byte(union), `{"kind":"e299","payload":{"id":"1","n299":3,"at":"2026-12-05T10:00:00Z"}}`})
	model := mesh(600)
	decls = append(decls, decl{"domain model", []byte(model), `{"f1":{"f2":{"name":"x","items":[{"f3":{}},{"f6":{"name":"y"}}]}},"name":"n"}`})
	for _, d := range decls {
		start := time.Now()
		c, err := schema.Compile("1", d.doc)
		if err != nil {
			t.Errorf("%s: %v", d.name, err)
			continue
		}
		took := time.Since(start)
		if err := c.Validate([]byte(d.body)); err != nil && (!errors.Is(err, schema.ErrBody) || strings.Contains(err.Error(), "too costly")) {
			t.Errorf("%s: %v", d.name, err)
		}
		if len(d.doc) > 10_000 {
			t.Logf("%s: %d bytes, compiled in %v", d.name, len(d.doc), took)
		}
	}
}
