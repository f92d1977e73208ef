// Command schemamodule is a module binary for meshctl schema check's
// tests: it declares two versions of each of its events, order.shipped
// compatibly (version 2 adds an optional field), order.placed not
// (version 2 retypes its id).
package main

import (
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
		},
	})
}
