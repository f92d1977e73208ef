// Package billing is an example module that serves tools: invoice.create,
// which itself calls the tax module's tax.rate, and tax.rate in a second
// module, Tax.
package billing

import (
	"context"
	"fmt"

	"github.com/meshkit/mesh/sdk"
)

// Order is the request of invoice.create.
type Order struct {
	Site  string `json:"site"`
	Cents int    `json:"cents"`
}

// Invoice is its response.
type Invoice struct {
	Site       string `json:"site"`
	TotalCents int    `json:"total_cents"`
	RatePct    int    `json:"rate_pct"`
}

// Module returns the billing module: it serves invoice.create and calls
// tax.rate.
func Module() sdk.Module {
	var mesh sdk.Mesh
	return sdk.Module{
		Name:  "billing",
		Kind:  "agent",
		Calls: []string{"tax.rate"},
		Setup: func(m sdk.Mesh) error {
			mesh = m
			return m.Serve("invoice.create", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
				var o Order
				if err := req.Decode(&o); err != nil || o.Cents < 0 {
					return nil, &sdk.ToolError{Code: "bad_order", Message: fmt.Sprintf("cannot bill %s", req.Body), Permanent: true}
				}
				var rate int
				if err := mesh.Call(ctx, "tax.rate", o.Site, &rate); err != nil {
					return nil, fmt.Errorf("tax rate: %w", err)
				}
				mesh.Logger().Info("invoice created", "site", o.Site, "caller", req.Caller)
				return Invoice{Site: o.Site, TotalCents: o.Cents * (100 + rate) / 100, RatePct: rate}, nil
			}))
		},
	}
}

// Tax returns the tax module: it serves tax.rate.
func Tax() sdk.Module {
	return sdk.Module{
		Name: "tax",
		Kind: "agent",
		Setup: func(m sdk.Mesh) error {
			return m.Serve("tax.rate", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
				return 20, nil
			}))
		},
	}
}
