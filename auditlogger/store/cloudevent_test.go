package store

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/cloudevents"
)

// TestCloudEvent: what the export writes, mesh's CloudEvents reader reads
// back as the same event.
func TestCloudEvent(t *testing.T) {
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	for _, ev := range []Event{
		{ID: "01J", Type: "module.shop.order.paid", Source: "shop", Node: "anchor", Schema: "2", Time: at, Body: []byte(`{"order":7}`),
			Headers: map[string]string{"x-event-id": "01J", "x-tenant-id": "acme", "traceparent": "00-abc-def-01", "specversion": "0.3",
				"x-partition-key": "acct-7", "mesh-slot-12": "1"}},
		{ID: "01K", Type: "mesh.raw.bytes", Node: "n", Body: []byte{0, 1, 2}},
	} {
		b, err := json.Marshal(ev.CloudEvent())
		if err != nil {
			t.Fatal(err)
		}
		ce, ok, err := cloudevents.Read(nil, cloudevents.ContentTypeStructured, b)
		if err != nil || !ok {
			t.Fatalf("%s: %s: %v", ev.ID, b, err)
		}
		if ce.ID != ev.ID || ce.Type != ev.Type || ce.Source != "mesh://"+ev.Node+"/"+ev.Source || string(ce.Data) != string(ev.Body) || ce.DataSchema != ev.Schema || !ce.Time.Equal(ev.Time) {
			t.Errorf("%s: read back %+v from %s", ev.ID, ce, b)
		}
		if ev.ID == "01J" && (ce.Extensions["xtenantid"] != "acme" || ce.Extensions["traceparent"] != "00-abc-def-01" || ce.SpecVersion != "1.0") {
			t.Errorf("extensions %v, specversion %q (a header named specversion must not replace it)", ce.Extensions, ce.SpecVersion)
		}
		if _, slot := ce.Extensions["meshslot12"]; ev.ID == "01J" && (ce.Extensions["partitionkey"] != "acct-7" || ce.Extensions["xpartitionkey"] != "" || slot) {
			t.Errorf("extensions %v: want the key as partitionkey (the partitioning extension's), and no slot", ce.Extensions)
		}
	}
}
