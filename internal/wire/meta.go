package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// ErrMalformed is wrapped by every *MalformedError.
var ErrMalformed = errors.New("malformed event")

// MalformedError says how a message breaks the event contract.
type MalformedError struct {
	Reason string
}

// Error returns the reason prefixed with "malformed event: ".
func (e *MalformedError) Error() string { return "malformed event: " + e.Reason }

// Unwrap lets errors.Is(err, ErrMalformed) hold.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

func malformed(format string, args ...any) error {
	return &MalformedError{Reason: fmt.Sprintf(format, args...)}
}

// Meta is an event's metadata, read from its headers.
type Meta struct {
	ID          string
	Source      string
	Node        string
	Time        time.Time
	CausationID string
	Schema      string
	// Extra holds every other x- header (the runtime's own x-mesh- ones
	// excepted), formatted as text.
	Extra map[string]string
	// Attempt is the runtime's attempt counter on a classic queue (0 when
	// absent), as the header says: a consumer counts it only on a copy its
	// node sent itself (see HeaderAttempt).
	Attempt int
	// RoutingKey is the original routing key of an event sent straight to
	// a queue ("" when absent), as the header says: a consumer takes it
	// for the type only where the runtime honours it (see
	// HeaderRoutingKey), never on a delivery through an exchange.
	RoutingKey string
}

// DecodeMeta reads and checks an event's metadata from its headers, its
// content type property and its body. Every required header must be present
// with the right type and form; the content type must be application/json
// and the body valid JSON. Unknown x- headers are kept in Extra, never
// refused. Headers other than x- ones (traceparent, ...) are ignored.
func DecodeMeta(headers map[string]any, contentType string, body []byte) (Meta, error) {
	var m Meta
	var err error
	if m.ID, err = requiredString(headers, HeaderEventID); err != nil {
		return m, err
	}
	if _, perr := ulid.ParseStrict(m.ID); perr != nil {
		return m, malformed("header %s %q is not a ULID: %v", HeaderEventID, m.ID, perr)
	}
	if m.Source, err = requiredString(headers, HeaderSource); err != nil {
		return m, err
	}
	if m.Node, err = requiredString(headers, HeaderNode); err != nil {
		return m, err
	}
	var ts string
	if ts, err = requiredString(headers, HeaderTime); err != nil {
		return m, err
	}
	if m.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
		return m, malformed("header %s %q is not an RFC 3339 time", HeaderTime, ts)
	}
	m.Time = m.Time.UTC()
	if m.CausationID, err = optionalString(headers, HeaderCausationID); err != nil {
		return m, err
	}
	if m.Schema, err = optionalString(headers, HeaderSchema); err != nil {
		return m, err
	}
	if m.RoutingKey, err = optionalString(headers, HeaderRoutingKey); err != nil {
		return m, err
	}
	if v, ok := headers[HeaderAttempt]; ok {
		n, ok := asInt(v)
		if !ok || n < 0 {
			return m, malformed("header %s is %T %v, want a non-negative integer", HeaderAttempt, v, v)
		}
		m.Attempt = n
	}
	if err := checkContentType(contentType); err != nil {
		return m, err
	}
	if !json.Valid(body) {
		return m, malformed("body is not valid JSON (%d bytes)", len(body))
	}
	for k, v := range headers {
		if !strings.HasPrefix(k, "x-") || isContractHeader(k) || strings.HasPrefix(k, "x-mesh-") {
			continue
		}
		if m.Extra == nil {
			m.Extra = make(map[string]string)
		}
		m.Extra[k] = headerText(v)
	}
	return m, nil
}

func checkContentType(ct string) error {
	if ct == "" {
		return malformed("content type is missing, want %s", ContentTypeJSON)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != ContentTypeJSON {
		return malformed("content type is %q, want %s", ct, ContentTypeJSON)
	}
	return nil
}

func isContractHeader(k string) bool {
	switch k {
	case HeaderEventID, HeaderSource, HeaderNode, HeaderTime, HeaderCausationID, HeaderSchema:
		return true
	}
	return false
}

func requiredString(h map[string]any, key string) (string, error) {
	v, ok := h[key]
	if !ok {
		return "", malformed("required header %s is missing", key)
	}
	s, ok := asString(v)
	if !ok {
		return "", malformed("header %s is %T, want a string", key, v)
	}
	if s == "" {
		return "", malformed("required header %s is empty", key)
	}
	return s, nil
}

func optionalString(h map[string]any, key string) (string, error) {
	v, ok := h[key]
	if !ok {
		return "", nil
	}
	s, ok := asString(v)
	if !ok {
		return "", malformed("header %s is %T, want a string", key, v)
	}
	return s, nil
}

// asString accepts an AMQP long string, which amqp091-go decodes as string,
// and a byte array, which other clients send for text.
func asString(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	}
	return "", false
}

func asInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return int(n), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	}
	return 0, false
}

func headerText(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	case time.Time:
		return s.UTC().Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}
