// Command schemamodule is a module binary for meshctl schema check's
// tests: it declares two versions of each of its events, order.shipped
// compatibly (version 2 adds an optional field), order.placed not
// (version 2 retypes its id), and a schema of the tool it serves, which
// schema check leaves alone.
package main

import (
	"context"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/process"
)

func main() {
	process.Run(sdk.Module{
		Name:  "shop",
		Emits: []string{"order.placed", "order.shipped"},
		Schemas: []sdk.Schema{
			{Event: "order.placed", Version: "1", JSON: []byte(`{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}`)},
			{Event: "order.shipped", Version: "1", JSON: []byte(`{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}`)},
			{Event: "order.placed", Version: "2", JSON: []byte(`{"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}`)},
			{Event: "order.shipped", Version: "2", JSON: []byte(`{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "carrier": {"type": "string"}}}`)},
			{Tool: "shop.quote", Version: "1", Response: []byte(`{"type": "number"}`)},
		},
		Setup: func(m sdk.Mesh) error {
			return m.Serve("shop.quote", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return 1, nil }))
		},
	})
}
