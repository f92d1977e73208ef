package store

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"time"
)

// CSVHeader names the columns of CSVRecord.
var CSVHeader = []string{"seq", "id", "type", "source", "node", "time", "causation_id", "schema", "user_id",
	"arrived", "redelivered", "malformed", "headers", "body", "body_base64"}

// CSVRecord is the event as a CSV row (meshctl audit export --format
// csv, the console's export): headers as a JSON object, the body as
// JSON when it is, in base64 otherwise.
func (ev Event) CSVRecord() []string {
	headers, _ := json.Marshal(ev.Headers) // a map of strings always marshals
	body, body64 := "", ""
	if json.Valid(ev.Body) {
		body = string(ev.Body)
	} else if ev.Body != nil {
		body64 = base64.StdEncoding.EncodeToString(ev.Body)
	}
	rfc := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	return []string{strconv.FormatInt(ev.Seq, 10), ev.ID, ev.Type, ev.Source, ev.Node, rfc(ev.Time), ev.CausationID, ev.Schema, ev.UserID,
		rfc(ev.Arrived), strconv.FormatBool(ev.Redelivered), ev.Malformed, string(headers), body, body64}
}
