// Package umami is an example module that only emits: it announces a new
// site every interval as module.umami.site.created, whose body's schema it
// declares (version 1, from Site).
package umami

import (
	"context"
	"fmt"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/schema"
)

// Site is the body of a site.created event, version 1 of its schema.
type Site struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// Module returns the module, emitting every interval until it is stopped.
func Module(interval time.Duration) sdk.Module {
	return sdk.Module{
		Name:  "umami",
		Emits: []string{"site.created"},
		// The host validates each site.created against it, and sets the
		// event's x-schema to "1".
		Schemas: []sdk.Schema{schema.Of[Site]("site.created", "1")},
		Run: func(ctx context.Context, m sdk.Mesh) error {
			t := time.NewTicker(interval)
			defer t.Stop()
			for i := 1; ; i++ {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
				site := Site{ID: i, Name: fmt.Sprintf("site-%d.example", i)}
				if _, err := m.Emit(ctx, "site.created", site); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("emit site.created: %w", err)
				}
			}
		},
	}
}
