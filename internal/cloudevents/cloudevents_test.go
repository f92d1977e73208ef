package cloudevents

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReadBinary(t *testing.T) {
	for _, p := range Prefixes {
		h := map[string]any{p + "specversion": "1.0", p + "id": "A-1", p + "source": "/shop", p + "type": "com.example.order.created",
			p + "time": "2026-12-01T10:00:00Z", p + "dataschema": "https://example.com/order/2", p + "traceparent": "00-x", "x-other": "kept apart"}
		ev, ok, err := Read(h, "application/json", []byte(`{"order":7}`))
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", p, ok, err)
		}
		if ev.ID != "A-1" || ev.Source != "/shop" || ev.Type != "com.example.order.created" || !ev.Time.Equal(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)) ||
			ev.DataSchema != "https://example.com/order/2" || string(ev.Data) != `{"order":7}` || ev.DataContentType != "application/json" ||
			ev.Extensions["traceparent"] != "00-x" || len(ev.Extensions) != 1 || ev.Mode != "binary" {
			t.Errorf("%s: %+v", p, ev)
		}
	}
	// An AMQP timestamp for time, bytes for a string.
	ev, _, err := Read(map[string]any{"cloudEvents:specversion": []byte("1.0"), "cloudEvents:id": "1", "cloudEvents:source": "s", "cloudEvents:type": "t",
		"cloudEvents:time": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, "", nil)
	if err != nil || ev.Time.Year() != 2026 {
		t.Errorf("typed values: %+v %v", ev, err)
	}
}

func TestReadStructured(t *testing.T) {
	for _, tc := range []struct {
		body, data string
	}{
		{`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":1}}`, `{"a":1}`},
		{`{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"text/plain","data":"hello"}`, `hello`},
		{`{"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"application/json","data":"hello"}`, `"hello"`},
		{`{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAEC"}`, "\x00\x01\x02"},
		{`{"specversion":"1.0","id":"1","source":"s","type":"t","count":3,"flag":true}`, ``},
	} {
		ev, ok, err := Read(nil, "application/cloudevents+json; charset=utf-8", []byte(tc.body))
		if err != nil || !ok || string(ev.Data) != tc.data || ev.Mode != "structured" {
			t.Errorf("%s: %q %v %v", tc.body, ev.Data, ok, err)
		}
	}
}

func TestNotACloudEvent(t *testing.T) {
	for _, h := range []map[string]any{nil, {"x-event-id": "01J"}, {"ce-id": "1"}} { // no specversion: not one
		if _, ok, err := Read(h, "application/json", []byte(`{}`)); ok || err != nil {
			t.Errorf("%v: %v %v", h, ok, err)
		}
	}
}

func TestReadRefusesMalformed(t *testing.T) {
	good := func(p string) map[string]any {
		return map[string]any{p + "specversion": "1.0", p + "id": "1", p + "source": "s", p + "type": "t"}
	}
	with := func(h map[string]any, k string, v any) map[string]any { h[k] = v; return h }
	without := func(h map[string]any, k string) map[string]any { delete(h, k); return h }
	for name, tc := range map[string]struct {
		h    map[string]any
		ct   string
		body string
		want string
	}{
		"mixed prefixes":       {h: with(good("ce-"), "cloudEvents_subject", "x"), want: "mixes"},
		"two specversions":     {h: with(good("ce-"), "cloudEvents:specversion", "1.0"), want: "both prefixes"},
		"specversion 0.3":      {h: with(good("ce-"), "ce-specversion", "0.3"), want: "want 1.0"},
		"no id":                {h: without(good("ce-"), "ce-id"), want: "id is missing"},
		"empty source":         {h: with(good("ce-"), "ce-source", ""), want: "source is missing"},
		"bad time":             {h: with(good("ce-"), "ce-time", "yesterday"), want: "not RFC 3339"},
		"upper-case attribute": {h: with(good("ce-"), "ce-Foo", "x"), want: "attribute name"},
		"a table value":        {h: with(good("ce-"), "ce-foo", map[string]any{}), want: "not an attribute value"},
		"long id":              {h: with(good("ce-"), "ce-id", strings.Repeat("x", 5000)), want: "over"},
		"batch":                {ct: ContentTypeBatch, body: `[]`, want: "batch"},
		"not JSON":             {ct: ContentTypeStructured, body: `{`, want: "not a JSON object"},
		"both datas":           {ct: ContentTypeStructured, body: `{"specversion":"1.0","id":"1","source":"s","type":"t","data":1,"data_base64":"AA=="}`, want: "both"},
		"bad base64":           {ct: ContentTypeStructured, body: `{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"!!"}`, want: "data_base64"},
		"object attribute":     {ct: ContentTypeStructured, body: `{"specversion":"1.0","id":"1","source":"s","type":"t","ext":{}}`, want: "not a string"},
	} {
		_, ok, err := Read(tc.h, tc.ct, []byte(tc.body))
		if !ok || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ok %v, err %v; want ErrMalformed saying %q", name, ok, err, tc.want)
		}
	}
}

// FuzzRead: any message is read, refused with ErrMalformed, or not a
// CloudEvent; what is read has the required attributes.
func FuzzRead(f *testing.F) {
	f.Add("ce-", "1.0", "id", "src", "type", "2026-12-01T00:00:00Z", "application/json", []byte(`{}`))
	f.Add("cloudEvents:", "1.0", "", "s", "t", "", "", []byte(nil))
	f.Add("", "", "", "", "", "", ContentTypeStructured, []byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AA=="}`))
	f.Fuzz(func(t *testing.T, prefix, spec, id, src, typ, tm, ct string, body []byte) {
		h := map[string]any{prefix + "specversion": spec, prefix + "id": id, prefix + "source": src, prefix + "type": typ}
		if tm != "" {
			h[prefix+"time"] = tm
		}
		ev, ok, err := Read(h, ct, body)
		switch {
		case err != nil:
			if !ok || !errors.Is(err, ErrMalformed) {
				t.Fatalf("an error that is not ErrMalformed, or ok false: %v %v", ok, err)
			}
		case ok:
			if ev.SpecVersion != "1.0" || ev.ID == "" || ev.Source == "" || ev.Type == "" {
				t.Fatalf("read without its required attributes: %+v", ev)
			}
		}
	})
}
