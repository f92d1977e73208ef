package wire_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/meshkit/mesh/internal/wire"
)

var (
	testTime = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	testBody = []byte(`{"a":1}`)
)

// validHeaders returns a fresh, valid header map and its event id.
func validHeaders() (map[string]any, string) {
	id := ulid.Make().String()
	return map[string]any{
		wire.HeaderEventID: id,
		wire.HeaderSource:  "umami",
		wire.HeaderNode:    "anchor",
		wire.HeaderTime:    testTime.Format(time.RFC3339),
	}, id
}

func TestDecodeMetaValid(t *testing.T) {
	h, id := validHeaders()
	m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
	if err != nil {
		t.Fatalf("DecodeMeta: %v", err)
	}
	if m.ID != id {
		t.Errorf("ID = %q, want %q", m.ID, id)
	}
	if m.Source != "umami" {
		t.Errorf("Source = %q, want umami", m.Source)
	}
	if m.Node != "anchor" {
		t.Errorf("Node = %q, want anchor", m.Node)
	}
	if !m.Time.Equal(testTime) || m.Time.Location() != time.UTC {
		t.Errorf("Time = %v, want %v in UTC", m.Time, testTime)
	}
	if m.CausationID != "" || m.Schema != "" || m.RoutingKey != "" || m.Attempt != 0 {
		t.Errorf("optional fields set without headers: %+v", m)
	}
	if len(m.Extra) != 0 {
		t.Errorf("Extra = %v, want empty", m.Extra)
	}
}

func TestDecodeMetaFractionalTime(t *testing.T) {
	h, _ := validHeaders()
	want := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	h[wire.HeaderTime] = want.Format(time.RFC3339Nano)
	m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
	if err != nil {
		t.Fatalf("DecodeMeta: %v", err)
	}
	if !m.Time.Equal(want) {
		t.Errorf("Time = %v, want %v", m.Time, want)
	}
}

func TestDecodeMetaContentTypeParams(t *testing.T) {
	for _, ct := range []string{
		"application/json; charset=utf-8",
		"application/json;charset=UTF-8",
		"Application/JSON",
	} {
		h, _ := validHeaders()
		if _, err := wire.DecodeMeta(h, ct, testBody); err != nil {
			t.Errorf("content type %q: %v", ct, err)
		}
	}
}

func TestDecodeMetaByteStrings(t *testing.T) {
	id := ulid.Make().String()
	h := map[string]any{
		wire.HeaderEventID:     []byte(id),
		wire.HeaderSource:      []byte("umami"),
		wire.HeaderNode:        []byte("anchor"),
		wire.HeaderTime:        []byte(testTime.Format(time.RFC3339)),
		wire.HeaderCausationID: []byte("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
		wire.HeaderSchema:      []byte("v2"),
		"x-tenant":             []byte("acme"),
	}
	m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
	if err != nil {
		t.Fatalf("DecodeMeta: %v", err)
	}
	if m.ID != id || m.Source != "umami" || m.Node != "anchor" || !m.Time.Equal(testTime) {
		t.Errorf("got %+v", m)
	}
	if m.CausationID != "01ARZ3NDEKTSV4RRFFQ69G5FAV" || m.Schema != "v2" {
		t.Errorf("CausationID = %q, Schema = %q", m.CausationID, m.Schema)
	}
	if m.Extra["x-tenant"] != "acme" {
		t.Errorf("Extra[x-tenant] = %q, want acme", m.Extra["x-tenant"])
	}
}

func TestDecodeMetaOptional(t *testing.T) {
	h, _ := validHeaders()
	cause := ulid.Make().String()
	h[wire.HeaderCausationID] = cause
	h[wire.HeaderSchema] = "2"
	h[wire.HeaderRoutingKey] = "module.umami.site.created"
	m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
	if err != nil {
		t.Fatalf("DecodeMeta: %v", err)
	}
	if m.CausationID != cause {
		t.Errorf("CausationID = %q, want %q", m.CausationID, cause)
	}
	if m.Schema != "2" {
		t.Errorf("Schema = %q, want 2", m.Schema)
	}
	if m.RoutingKey != "module.umami.site.created" {
		t.Errorf("RoutingKey = %q", m.RoutingKey)
	}
	if len(m.Extra) != 0 {
		t.Errorf("contract headers leaked into Extra: %v", m.Extra)
	}
}

func TestDecodeMetaExtra(t *testing.T) {
	h, _ := validHeaders()
	h["x-tenant"] = "acme"
	h["x-count"] = int32(7)
	h["x-flag"] = true
	h["x-when"] = time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	h["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	h["tracestate"] = "vendor=x"
	h["content-encoding"] = "gzip"
	h["X-Upper"] = "not an x- header: AMQP keys are case-sensitive"
	h[wire.HeaderAttempt] = int32(2)
	h[wire.HeaderRoutingKey] = "module.umami.site.created"
	h[wire.HeaderDeadReason] = wire.DeadReasonPermanent
	h["x-mesh-future"] = "kept by the runtime"
	m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
	if err != nil {
		t.Fatalf("DecodeMeta with unknown headers: %v", err)
	}
	want := map[string]string{
		"x-tenant": "acme",
		"x-count":  "7",
		"x-flag":   "true",
		"x-when":   "2025-01-02T02:04:05Z",
	}
	if len(m.Extra) != len(want) {
		t.Errorf("Extra = %v, want %v", m.Extra, want)
	}
	for k, v := range want {
		if got, ok := m.Extra[k]; !ok || got != v {
			t.Errorf("Extra[%q] = %q (present %v), want %q", k, got, ok, v)
		}
	}
	for k := range m.Extra {
		if !strings.HasPrefix(k, "x-") || strings.HasPrefix(k, "x-mesh-") {
			t.Errorf("Extra holds %q", k)
		}
	}
	for _, k := range []string{wire.HeaderEventID, wire.HeaderSource, wire.HeaderNode, wire.HeaderTime} {
		if _, ok := m.Extra[k]; ok {
			t.Errorf("contract header %q in Extra", k)
		}
	}
}

func TestDecodeMetaAttempt(t *testing.T) {
	for _, v := range []any{int8(3), int16(3), int32(3), int64(3), int(3), uint8(3), uint16(3), uint32(3)} {
		h, _ := validHeaders()
		h[wire.HeaderAttempt] = v
		m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
		if err != nil {
			t.Errorf("x-mesh-attempt %T: %v", v, err)
			continue
		}
		if m.Attempt != 3 {
			t.Errorf("x-mesh-attempt %T: Attempt = %d, want 3", v, m.Attempt)
		}
	}
	h, _ := validHeaders()
	h[wire.HeaderAttempt] = int64(0)
	if m, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody); err != nil || m.Attempt != 0 {
		t.Errorf("x-mesh-attempt 0: Attempt %d, err %v", m.Attempt, err)
	}
}

// checkMalformed asserts that err wraps wire.ErrMalformed and that its
// reason mentions want.
func checkMalformed(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one mentioning %q", want)
	}
	if !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("errors.Is(err, ErrMalformed) is false for %v", err)
	}
	var me *wire.MalformedError
	if !errors.As(err, &me) {
		t.Fatalf("error %T %v is not a *wire.MalformedError", err, err)
	}
	if !strings.Contains(me.Reason, want) {
		t.Errorf("reason %q does not mention %q", me.Reason, want)
	}
	if !strings.Contains(err.Error(), me.Reason) {
		t.Errorf("Error() %q does not contain the reason %q", err.Error(), me.Reason)
	}
}

func TestDecodeMetaHeaderFailures(t *testing.T) {
	required := []string{wire.HeaderEventID, wire.HeaderSource, wire.HeaderNode, wire.HeaderTime}
	for _, k := range required {
		t.Run("missing "+k, func(t *testing.T) {
			h, _ := validHeaders()
			delete(h, k)
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
			checkMalformed(t, err, k)
		})
		for _, bad := range []struct {
			name string
			v    any
		}{
			{"int", 42},
			{"int32", int32(42)},
			{"bool", true},
			{"nil", nil},
			{"float", 1.5},
			{"time", testTime},
			{"table", map[string]any{"a": "b"}},
			{"empty string", ""},
			{"empty bytes", []byte{}},
		} {
			t.Run(k+" "+bad.name, func(t *testing.T) {
				h, _ := validHeaders()
				h[k] = bad.v
				_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
				checkMalformed(t, err, k)
			})
		}
	}
	for _, k := range []string{wire.HeaderCausationID, wire.HeaderSchema, wire.HeaderRoutingKey} {
		t.Run(k+" wrong type", func(t *testing.T) {
			h, _ := validHeaders()
			h[k] = int64(5)
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
			checkMalformed(t, err, k)
		})
	}

	t.Run("nil map", func(t *testing.T) {
		_, err := wire.DecodeMeta(nil, wire.ContentTypeJSON, testBody)
		checkMalformed(t, err, wire.HeaderEventID)
	})

	for _, id := range []string{
		"123",
		"6ba7b810-9dad-11d1-80b4-00c04fd430c8",            // a UUID
		"01ARZ3NDEKTSV4RRFFQ69G5FA",                       // 25 characters
		"01ARZ3NDEKTSV4RRFFQ69G5FAVX",                     // 27 characters
		"01ARZ3NDEKTSV4RRFFQ69G5FAU",                      // U is not Crockford base32
		"81ARZ3NDEKTSV4RRFFQ69G5FAV",                      // overflows 128 bits
		" 01ARZ3NDEKTSV4RRFFQ69G5FAV",                     // padded
		"01ARZ3NDEKTSV4RRFFQ69G5FAV\x00",                  // trailing NUL
		"module.umami.site.created",                       // not an id at all
		"{\"id\":\"01ARZ3NDEKTSV4RRFFQ69G5FAV\"}",         // JSON
		strings.Repeat("0", 26) + strings.Repeat("0", 26), // doubled
	} {
		t.Run("x-event-id "+id, func(t *testing.T) {
			h, _ := validHeaders()
			h[wire.HeaderEventID] = id
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
			checkMalformed(t, err, wire.HeaderEventID)
		})
	}

	for _, ts := range []string{
		"yesterday",
		"2025-03-04",
		"2025-03-04 05:06:07Z",
		"2025-03-04T05:06:07",           // no offset
		"Tue, 04 Mar 2025 05:06:07 GMT", // RFC 1123
		"1741064767",                    // Unix seconds
		"2025-13-04T05:06:07Z",
		"2025-03-04T25:06:07Z",
		"2025-03-04T05:06:07+0000",
	} {
		t.Run("x-time "+ts, func(t *testing.T) {
			h, _ := validHeaders()
			h[wire.HeaderTime] = ts
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
			checkMalformed(t, err, wire.HeaderTime)
		})
	}

	for _, bad := range []struct {
		name string
		v    any
	}{
		{"negative int32", int32(-1)},
		{"negative int64", int64(-7)},
		{"string", "3"},
		{"bool", true},
		{"float", 3.0},
		{"nil", nil},
	} {
		t.Run("x-mesh-attempt "+bad.name, func(t *testing.T) {
			h, _ := validHeaders()
			h[wire.HeaderAttempt] = bad.v
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody)
			checkMalformed(t, err, wire.HeaderAttempt)
		})
	}
}

func TestDecodeMetaContentTypeFailures(t *testing.T) {
	for _, ct := range []string{
		"",
		"text/plain",
		"application/xml",
		"application/json-patch+json",
		"application/jsonx",
		"application/",
		"json",
		"application/json; charset", // unparsable parameter
	} {
		t.Run(ct, func(t *testing.T) {
			h, _ := validHeaders()
			_, err := wire.DecodeMeta(h, ct, testBody)
			checkMalformed(t, err, "content type")
		})
	}
}

func TestDecodeMetaBodyFailures(t *testing.T) {
	for _, body := range []string{
		"not json",
		"",
		`{"a":`,
		`{"a":1}}`,
		`{'a':1}`,
		"\xff",
		`{"a":1} {"b":2}`,
	} {
		t.Run(body, func(t *testing.T) {
			h, _ := validHeaders()
			_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, []byte(body))
			checkMalformed(t, err, "body")
		})
	}
	t.Run("nil body", func(t *testing.T) {
		h, _ := validHeaders()
		_, err := wire.DecodeMeta(h, wire.ContentTypeJSON, nil)
		checkMalformed(t, err, "body")
	})
}

func TestDecodeMetaBodyJSONValues(t *testing.T) {
	for _, body := range []string{`{}`, `[]`, `null`, `"text"`, `1`, ` {"a": [1, 2, {"b": null}]} `} {
		h, _ := validHeaders()
		if _, err := wire.DecodeMeta(h, wire.ContentTypeJSON, []byte(body)); err != nil {
			t.Errorf("body %q: %v", body, err)
		}
	}
}

func TestDecodeMetaDoesNotModifyHeaders(t *testing.T) {
	h, _ := validHeaders()
	h["x-tenant"] = "acme"
	n := len(h)
	if _, err := wire.DecodeMeta(h, wire.ContentTypeJSON, testBody); err != nil {
		t.Fatal(err)
	}
	if len(h) != n {
		t.Errorf("DecodeMeta changed the header map: %v", h)
	}
}
