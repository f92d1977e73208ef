// Package notifier is an example module that consumes, calls and emits:
// for every site umami creates it asks billing for a first invoice
// (invoice.create, if billing runs) and emits
// module.notifier.notification.sent, which carries the site event's id as
// its causation id without the module doing anything for it. It declares
// the schema of what it emits (version 1, from Sent) and the version of
// site.created it reads (1: another is dead-lettered with reason "schema").
package notifier

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/schema"
)

// sites is the pattern the notifier subscribes, and the key of what it
// reads of it in Reads: the same string.
const sites = "module.umami.site.created"

// Sent is the body of a notification.sent event, version 1 of its
// schema.
type Sent struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Module returns the module; it also reports what it handles on out, if
// out is not nil.
func Module(out io.Writer) sdk.Module {
	var mesh sdk.Mesh
	return sdk.Module{
		Name:    "notifier",
		Emits:   []string{"notification.sent"},
		Schemas: []sdk.Schema{schema.Of[Sent]("notification.sent", "1")},
		// The handler reads the site.created umami emits, version 1.
		Reads: map[string][]string{sites: {"1"}},
		Calls: []string{"invoice.create"},
		Setup: func(m sdk.Mesh) error {
			mesh = m
			return m.On(sites, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				var site struct {
					ID   int    `json:"id"`
					Name string `json:"name"`
				}
				if err := ev.Decode(&site); err != nil {
					return sdk.Permanent(err) // retrying cannot fix a body we cannot read
				}
				if out != nil {
					fmt.Fprintf(out, "notifier: handled %s %s (site %d, attempt %d)\n", ev.Type, ev.ID, site.ID, ev.Attempt)
				}
				mesh.Logger().Info("handling a new site", "site", site.Name, "event_id", ev.ID, "attempt", ev.Attempt)
				subject := "Your site is live"
				var invoice struct {
					TotalCents int `json:"total_cents"`
				}
				switch err := mesh.Call(ctx, "invoice.create", map[string]any{"site": site.Name, "cents": 900}, &invoice); {
				case err == nil:
					subject += fmt.Sprintf("; your first invoice is %d cents", invoice.TotalCents)
				case errors.Is(err, sdk.ErrNoServer):
					// billing is not running here: notify without an invoice
				default:
					return err // retried with back-off
				}
				_, err := mesh.Emit(ctx, "notification.sent", Sent{To: "owner@" + site.Name, Subject: subject})
				return err
			}))
		},
	}
}
