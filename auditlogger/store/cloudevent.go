package store

import (
	"encoding/json"
	"strings"
	"time"
)

// CloudEvent is the event as a CloudEvents 1.0 JSON object, structured
// mode (meshctl audit export --format cloudevents; ADR 34): id is
// x-event-id, source mesh://NODE/SOURCE, type the routing key, time
// x-time, dataschema x-schema, datacontenttype the content type; the body
// is data when it is JSON, data_base64 otherwise. The other headers are
// extension attributes, named as CloudEvents allows (lower-case letters
// and digits: "x-tenant-id" is "xtenantid"); traceparent keeps its name,
// the distributed tracing extension's, and x-partition-key is partitionkey,
// the partitioning extension's (the slot headers, mesh-slot-S, are left
// out: they are the key's, for routing). A header whose name would take an
// attribute's name, or another header's, is left out.
func (ev Event) CloudEvent() map[string]any {
	out := map[string]any{"specversion": "1.0", "id": ev.ID, "type": ev.Type, "source": "mesh://" + ev.Node + "/" + ev.Source}
	if !ev.Time.IsZero() {
		out["time"] = ev.Time.UTC().Format(time.RFC3339Nano)
	}
	if ev.Schema != "" {
		out["dataschema"] = ev.Schema
	}
	switch {
	case len(ev.Body) == 0:
	case json.Valid(ev.Body):
		out["data"] = json.RawMessage(ev.Body)
		out["datacontenttype"] = "application/json"
	default:
		out["data_base64"] = ev.Body // encoding/json writes []byte as base64
	}
	if ct := ev.Headers["content-type"]; ct != "" {
		out["datacontenttype"] = ct
	}
	if key := ev.Headers["x-partition-key"]; key != "" {
		out["partitionkey"] = key // the partitioning extension's
	}
	for k, v := range ev.Headers {
		switch {
		case k == "x-event-id", k == "x-source", k == "x-node", k == "x-time", k == "x-schema", k == "content-type", k == "x-partition-key":
			continue // mapped above
		case strings.HasPrefix(k, "mesh-slot-"):
			continue // the key's slot, for routing alone
		}
		name := attributeName(k)
		if _, taken := out[name]; taken || name == "" {
			continue
		}
		out[name] = v
	}
	return out
}

// attributeName is a header's name as a CloudEvents extension attribute:
// lower-case ASCII letters and digits only.
func attributeName(header string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(header) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}
