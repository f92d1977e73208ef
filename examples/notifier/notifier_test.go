package notifier_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshkit/mesh/examples/billing"
	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// The notifier's unit tests, on the in-memory mesh: no broker, no meshd.

func load(t *testing.T, mt *meshtest.Mesh, withBilling bool) {
	t.Helper()
	mods := []func() error{func() error { return mt.Load(notifier.Module(nil), meshtest.ModuleConfig{}) }}
	if withBilling {
		mods = append(mods,
			func() error { return mt.Load(billing.Tax(), meshtest.ModuleConfig{}) },
			func() error { return mt.Load(billing.Module(), meshtest.ModuleConfig{}) })
	}
	for _, load := range mods {
		if err := load(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNotifiesWithTheFirstInvoice: a new site gets a notification that
// quotes its first invoice, caused by the site event; billing is asked
// once.
func TestNotifiesWithTheFirstInvoice(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	load(t, mt, true)
	site, err := mt.Emit(context.Background(), "umami", "module.umami.site.created", map[string]any{"id": 1, "name": "example.org"}, sdk.WithSchema("1"))
	if err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	var sent []string
	for _, ev := range mt.Emitted() {
		if ev.Type == "module.notifier.notification.sent" {
			var n notifier.Sent
			if err := ev.Decode(&n); err != nil {
				t.Fatal(err)
			}
			if ev.CausationID != site || n.To != "owner@example.org" {
				t.Errorf("notification %+v caused by %s, want one to owner@example.org caused by %s", n, ev.CausationID, site)
			}
			sent = append(sent, n.Subject)
		}
	}
	if len(sent) != 1 || !strings.Contains(sent[0], "first invoice") {
		t.Errorf("notifications %q, want one quoting the invoice", sent)
	}
	invoices := 0
	for _, c := range mt.Calls() {
		if c.Tool == "invoice.create" && c.Ran {
			invoices++
			if c.Caller != "notifier" || c.CausationID != site || c.Err != nil {
				t.Errorf("call %+v", c)
			}
		}
	}
	if invoices != 1 {
		t.Errorf("billing made %d invoices, want 1", invoices)
	}
}

// TestNotifiesWithoutBilling: with nobody serving invoice.create the
// notifier still notifies, without an invoice.
func TestNotifiesWithoutBilling(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	load(t, mt, false)
	if _, err := mt.Emit(context.Background(), "umami", "module.umami.site.created", map[string]any{"id": 1, "name": "example.org"}, sdk.WithSchema("1")); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if evs := mt.Emitted(); len(evs) != 2 || strings.Contains(string(evs[1].Body), "invoice") {
		t.Errorf("emitted %+v, want one notification without an invoice", evs)
	}
}

// TestUnreadableSiteIsDeadLettered: a body the notifier cannot read is set
// aside at once, not retried.
func TestUnreadableSiteIsDeadLettered(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	load(t, mt, false)
	if _, err := mt.Emit(context.Background(), "umami", "module.umami.site.created", "not a site", sdk.WithSchema("1")); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if dl := mt.DeadLetters(); len(dl) != 1 || dl[0].Reason != "permanent" || dl[0].Attempts != 1 {
		t.Errorf("dead letters %+v, want one, permanent, after 1 attempt", dl)
	}
}

// TestReadsVersionOne: the notifier reads version 1 of site.created
// (Reads); a site of another version is dead-lettered with reason
// "schema", its handler never run, and nothing is notified.
func TestReadsVersionOne(t *testing.T) {
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	load(t, mt, false)
	if _, err := mt.Emit(context.Background(), "umami", "module.umami.site.created", map[string]any{"id": 1, "site": "example.org"}, sdk.WithSchema("2")); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	if dl := mt.DeadLetters(); len(dl) != 1 || dl[0].Reason != "schema" || dl[0].Module != "notifier" {
		t.Errorf("dead letters %+v, want one, for schema, from the notifier", dl)
	}
	if evs := mt.Emitted(); len(evs) != 1 {
		t.Errorf("emitted %+v, want only the site", evs)
	}
}
