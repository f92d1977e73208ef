// Package cloudevents reads CloudEvents 1.0 from AMQP messages, for the
// messages a module consumes from a queue it does not own (sdk.Mesh.Consume,
// the dispatcher): binary mode, whose attributes are headers with one of
// the prefixes "cloudEvents_" or "cloudEvents:" (the CloudEvents AMQP
// binding) or "ce-" (Knative's RabbitMQ binding), never mixed; and
// structured mode, a body of content type application/cloudevents+json.
// Batch mode is refused. mesh's own wire contract is not CloudEvents: a
// message with mesh's headers is mesh's (ADR 34).
//
//	ev, ok, err := cloudevents.Read(d.Headers, d.ContentType, d.Body)
//	switch {
//	case err != nil: // says it is a CloudEvent and is not a valid one
//	case ok:         // ev.ID, ev.Source, ev.Type, ev.Data, ...
//	}
package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"time"
	"unicode/utf8"
)

// Event is a CloudEvent as read: its context attributes and its data.
type Event struct {
	// SpecVersion is "1.0".
	SpecVersion string
	// ID, Source and Type are the required attributes.
	ID, Source, Type string
	// Subject, DataSchema and DataContentType are optional ("" when
	// absent); Time is zero when absent.
	Subject, DataSchema, DataContentType string
	Time                                 time.Time
	// Extensions are the other attributes, by name, as text.
	Extensions map[string]string
	// Data is the event's data: the body in binary mode; in structured
	// mode the JSON of "data" (its text when it is a JSON string and the
	// data content type is not JSON), or "data_base64" decoded.
	Data []byte
	// Mode is "binary" or "structured".
	Mode string
}

// ErrMalformed is what Read's errors wrap: the message says it is a
// CloudEvent and breaks the specification.
var ErrMalformed = errors.New("malformed CloudEvent")

// The media types of structured and batch mode.
const (
	ContentTypeStructured = "application/cloudevents+json"
	ContentTypeBatch      = "application/cloudevents-batch+json"
)

// Prefixes are the header prefixes of binary mode.
var Prefixes = []string{"cloudEvents_", "cloudEvents:", "ce-"}

// PartitionKey is the attribute of the partitioning extension: the key
// whose events keep their order (mesh's x-partition-key).
const PartitionKey = "partitionkey"

// maxAttribute bounds an attribute's value, as mesh bounds its own
// headers' (wire.MaxHeaderBytes is larger; a CloudEvent's id or type has
// no reason to be long).
const maxAttribute = 4096

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Read reads a CloudEvent from an AMQP message's headers, content type and
// body. ok is false, with no error, for a message that is not one (no
// specversion attribute, not structured mode); err is set for one that
// says it is and breaks the specification (wrapping ErrMalformed).
func Read(headers map[string]any, contentType string, body []byte) (ev Event, ok bool, err error) {
	// Parsed only when it can be one of CloudEvents' (the consume path
	// reads every message's content type; most are application/json).
	media := ""
	if strings.Contains(strings.ToLower(contentType), "cloudevents") {
		media, _, _ = mime.ParseMediaType(contentType)
	}
	switch strings.ToLower(media) {
	case ContentTypeStructured:
		ev, err = structured(body)
		return ev, true, err
	case ContentTypeBatch:
		return ev, true, malformed("batch mode (%s) is not read: send one event per message", ContentTypeBatch)
	}
	prefix := ""
	for _, p := range Prefixes {
		if _, has := headers[p+"specversion"]; has {
			if prefix != "" {
				return ev, true, malformed("attributes with both prefixes %q and %q: one message, one binding", prefix, p)
			}
			prefix = p
		}
	}
	if prefix == "" {
		return ev, false, nil
	}
	ev, err = binary(headers, prefix, contentType, body)
	return ev, true, err
}

// binary reads the attributes from the headers with prefix; a header with
// another binding's prefix is a mixed message.
func binary(headers map[string]any, prefix, contentType string, body []byte) (Event, error) {
	ev := Event{Mode: "binary", DataContentType: contentType, Data: body}
	attrs := map[string]string{}
	for k, v := range headers {
		if other := otherPrefix(k, prefix); other != "" {
			return ev, malformed("header %q mixes %q into a message whose attributes are %q", k, other, prefix)
		}
		name, has := strings.CutPrefix(k, prefix)
		if !has {
			continue // another header of the message, not an attribute
		}
		s, err := text(v)
		if err != nil {
			return ev, malformed("attribute %s: %v", name, err)
		}
		attrs[name] = s
	}
	return ev, fill(&ev, attrs, false)
}

// otherPrefix is the binding prefix other than prefix that k starts
// with, or "".
func otherPrefix(k, prefix string) string {
	for _, p := range Prefixes {
		if p != prefix && strings.HasPrefix(k, p) {
			return p
		}
	}
	return ""
}

// text is a header value as text: a string, bytes that are UTF-8, or a
// time (the AMQP binding's timestamp type, for "time").
func text(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		if !utf8.Valid(x) {
			return "", errors.New("not UTF-8")
		}
		return string(x), nil
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), nil
	case bool:
		return fmt.Sprint(x), nil
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64, int, float32, float64:
		return fmt.Sprint(x), nil
	}
	return "", fmt.Errorf("a %T is not an attribute value", v)
}

// structured reads a JSON object: the attributes and data or data_base64.
func structured(body []byte) (Event, error) {
	ev := Event{Mode: "structured"}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return ev, malformed("structured mode: the body is not a JSON object: %v", err)
	}
	attrs := map[string]string{}
	var data, data64 json.RawMessage
	for k, v := range raw {
		switch k {
		case "data":
			data = v
			continue
		case "data_base64":
			data64 = v
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			var n json.Number
			var b bool
			switch {
			case json.Unmarshal(v, &n) == nil:
				s = n.String()
			case json.Unmarshal(v, &b) == nil:
				s = fmt.Sprint(b)
			default:
				return ev, malformed("attribute %s is not a string, number or boolean", k)
			}
		}
		attrs[k] = s
	}
	if err := fill(&ev, attrs, true); err != nil {
		return ev, err
	}
	switch {
	case data != nil && data64 != nil:
		return ev, malformed("both data and data_base64")
	case data64 != nil:
		var s string
		if err := json.Unmarshal(data64, &s); err != nil {
			return ev, malformed("data_base64 is not a string")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return ev, malformed("data_base64: %v", err)
		}
		ev.Data = b
	case data != nil:
		var s string
		if !isJSON(ev.DataContentType) && json.Unmarshal(data, &s) == nil {
			ev.Data = []byte(s) // text data of a text content type
		} else {
			ev.Data = []byte(data)
		}
	}
	return ev, nil
}

// isJSON says whether a data content type is JSON ("" is: structured
// mode's default).
func isJSON(ct string) bool {
	media, _, err := mime.ParseMediaType(ct)
	if ct == "" {
		return true
	}
	if err != nil {
		return false
	}
	media = strings.ToLower(media)
	return media == "application/json" || media == "text/json" || strings.HasSuffix(media, "+json")
}

// fill sets ev's attributes from attrs and checks the required ones.
func fill(ev *Event, attrs map[string]string, structured bool) error {
	for k, v := range attrs {
		if len(v) > maxAttribute {
			return malformed("attribute %s of %d bytes is over %d", k, len(v), maxAttribute)
		}
		if !validName(k) {
			return malformed("attribute name %q: want lower-case letters and digits", k)
		}
	}
	ev.SpecVersion = attrs["specversion"]
	if ev.SpecVersion != "1.0" {
		return malformed("specversion %q: want 1.0", ev.SpecVersion)
	}
	for _, r := range []struct {
		name string
		to   *string
	}{{"id", &ev.ID}, {"source", &ev.Source}, {"type", &ev.Type}} {
		if *r.to = attrs[r.name]; *r.to == "" {
			return malformed("the required attribute %s is missing or empty", r.name)
		}
	}
	ev.Subject, ev.DataSchema = attrs["subject"], attrs["dataschema"]
	if structured {
		ev.DataContentType = attrs["datacontenttype"]
	} else if ct, has := attrs["datacontenttype"]; has && ev.DataContentType == "" {
		ev.DataContentType = ct
	}
	if t, has := attrs["time"]; has {
		parsed, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			return malformed("time %q is not RFC 3339", t)
		}
		ev.Time = parsed.UTC()
	}
	for k, v := range attrs {
		switch k {
		case "specversion", "id", "source", "type", "subject", "dataschema", "datacontenttype", "time":
		default:
			if ev.Extensions == nil {
				ev.Extensions = map[string]string{}
			}
			ev.Extensions[k] = v
		}
	}
	return nil
}

// validName says whether an attribute name is CloudEvents': lower-case
// ASCII letters and digits.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}
