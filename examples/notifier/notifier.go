// Package notifier is an example module that consumes and emits: for every
// site umami creates it sends a welcome notification and emits
// module.notifier.notification.sent, which carries the site event's id as
// its causation id without the module doing anything for it.
package notifier

import (
	"context"
	"fmt"
	"io"

	"github.com/meshkit/mesh/sdk"
)

// Sent is the body of a notification.sent event.
type Sent struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Module returns the module; it reports what it handles on out.
func Module(out io.Writer) sdk.Module {
	var mesh sdk.Mesh
	return sdk.Module{
		Name:  "notifier",
		Emits: []string{"notification.sent"},
		Setup: func(m sdk.Mesh) error {
			mesh = m
			return m.On("module.umami.site.created", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				var site struct {
					ID   int    `json:"id"`
					Name string `json:"name"`
				}
				if err := ev.Decode(&site); err != nil {
					return sdk.Permanent(err) // retrying cannot fix a body we cannot read
				}
				fmt.Fprintf(out, "notifier: handled %s %s (site %d, attempt %d)\n", ev.Type, ev.ID, site.ID, ev.Attempt)
				_, err := mesh.Emit(ctx, "notification.sent", Sent{To: "owner@" + site.Name, Subject: "Your site is live"})
				return err
			}))
		},
	}
}
