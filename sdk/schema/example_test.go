package schema_test

import (
	"context"
	"fmt"
	"testing/fstest"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/schema"
)

// SiteCreated is the body of umami's site.created.
type SiteCreated struct {
	ID    int    `json:"id"`
	Name  string `json:"name"`
	Owner string `json:"owner,omitempty"` // optional: added later, compatible both ways
}

// A producer declares the schema of what it emits, from the body's Go
// type; the host validates every site.created against it and sets its
// x-schema to "1". A consumer declares which versions its handler of a
// pattern reads: an event of another version is dead-lettered with reason
// "schema", never handed to it.
func Example() {
	umami := sdk.Module{
		Name:    "umami",
		Emits:   []string{"site.created"},
		Schemas: []sdk.Schema{schema.Of[SiteCreated]("site.created", "1")},
	}
	billing := sdk.Module{
		Name: "billing",
		// The key is the pattern exactly as Setup passes it to On.
		Reads: map[string][]string{"module.umami.site.created": {"1"}},
		Setup: func(m sdk.Mesh) error {
			return m.On("module.umami.site.created", sdk.Typed(func(ctx context.Context, ev sdk.Event, s SiteCreated) error {
				return nil
			}))
		},
	}
	for _, s := range umami.Schemas {
		fmt.Printf("%s emits %s version %s: %s\n", umami.Name, s.Event, s.Version, s.JSON)
	}
	fmt.Println(billing.Name, "reads", billing.Reads)
	// Output:
	// umami emits site.created version 1: {"$schema":"https://json-schema.org/draft/2020-12/schema","properties":{"id":{"type":"integer"},"name":{"type":"string"},"owner":{"type":"string"}},"type":"object","required":["id","name"]}
	// billing reads map[module.umami.site.created:[1]]
}

// Of describes a Go type as encoding/json marshals it: fields without
// omitempty are required, nested named types go under $defs, and objects
// take properties they do not list.
func ExampleOf() {
	type Address struct {
		Street string `json:"street"`
	}
	type Customer struct {
		Email string   `json:"email" jsonschema:"format=email"`
		Home  Address  `json:"home"`
		Tags  []string `json:"tags,omitempty"`
	}
	s := schema.Of[Customer]("customer.created", "1")
	fmt.Println(string(s.JSON))
	// Output:
	// {"$schema":"https://json-schema.org/draft/2020-12/schema","$defs":{"Address":{"properties":{"street":{"type":"string"}},"type":"object","required":["street"]}},"properties":{"email":{"type":"string","format":"email"},"home":{"$ref":"#/$defs/Address"},"tags":{"items":{"type":"string"},"type":"array"}},"type":"object","required":["email","home"]}
}

// File reads a schema written by hand, typically from an embed.FS:
//
//	//go:embed schemas
//	var schemas embed.FS
//
// Here version 1 of site.created was written by hand, and version 2, the
// one emitted now because it is listed last, comes from the Go type.
func ExampleFile() {
	schemas := fstest.MapFS{ // an embed.FS in a module
		"schemas/site.created.1.json": {Data: []byte(`{"type": "object", "required": ["id"]}`)},
	}
	v1, err := schema.File(schemas, "schemas/site.created.1.json", "site.created", "1")
	if err != nil {
		fmt.Println(err)
		return
	}
	m := sdk.Module{
		Name:    "umami",
		Emits:   []string{"site.created"},
		Schemas: []sdk.Schema{v1, schema.Of[SiteCreated]("site.created", "2")},
	}
	for _, s := range m.Schemas {
		fmt.Println(s.Event, s.Version, len(s.JSON) > 0)
	}
	_, err = schema.File(schemas, "schemas/site.created.3.json", "site.created", "3")
	fmt.Println(err)
	// Output:
	// site.created 1 true
	// site.created 2 true
	// schema of site.created version 3: open schemas/site.created.3.json: file does not exist
}

// MustFile suits a package-level variable: a schema file missing from the
// embedded files panics at start, and in the module's first test.
func ExampleMustFile() {
	schemas := fstest.MapFS{"schemas/invoice.paid.json": {Data: []byte(`{"type": "object"}`)}}
	paid := schema.MustFile(schemas, "schemas/invoice.paid.json", "invoice.paid", "2024-06")
	fmt.Println(paid.Event, paid.Version, string(paid.JSON))
	// Output: invoice.paid 2024-06 {"type": "object"}
}
