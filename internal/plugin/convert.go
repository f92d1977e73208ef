package plugin

import (
	"encoding/json"
	"math"
	"time"

	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
)

// Event has exactly the fields of sdk.Event, in order and type, so each
// side converts with a Go conversion (plugin.Event(ev), sdk.Event(pe)):
// internal must not import sdk, and a field added to sdk.Event and not
// here fails to compile on both sides of the boundary. A field added to
// both and not mapped below fails TestEventRoundTrip, which fills every
// field.
type Event struct {
	ID           string
	Type         string
	Source       string
	Node         string
	Time         time.Time
	CausationID  string
	Schema       string
	Headers      map[string]string
	Body         json.RawMessage
	Attempt      int
	Redelivered  bool
	UserID       string
	Queue        string
	Offset       int64
	DeadQueue    string
	DeadReason   string
	DeadError    string
	DeadAttempts int
	DeadTime     time.Time
}

// Request has exactly the fields of sdk.Request, as Event has those of
// sdk.Event.
type Request struct {
	ID          string
	Tool        string
	Caller      string
	Node        string
	Time        time.Time
	Deadline    time.Time
	CausationID string
	Headers     map[string]string
	Body        json.RawMessage
}

// DeliveryOf is the host's side of handing ev to a module process, with
// the handler's deadline (zero: none). The caller sets what belongs to the
// crossing rather than to the event: Seq, Pattern, Handling and the trace
// context.
func DeliveryOf(ev Event, deadline time.Time) *pb.Delivery {
	return &pb.Delivery{
		Id: ev.ID, Type: ev.Type, Source: ev.Source, Node: ev.Node, TimeUnixNano: unixNano(ev.Time),
		CausationId: ev.CausationID, Schema: ev.Schema, Headers: ev.Headers, Body: ev.Body,
		Attempt: uint32(ev.Attempt), Redelivered: ev.Redelivered, UserId: ev.UserID, Queue: ev.Queue, Offset: ev.Offset,
		DeadQueue: ev.DeadQueue, DeadReason: ev.DeadReason, DeadError: ev.DeadError,
		DeadAttempts: uint32(ev.DeadAttempts), DeadTimeUnixNano: unixNano(ev.DeadTime),
		DeadlineUnixNano: unixNano(deadline),
	}
}

// EventOf is the module process's side: the event d carries and the
// handler's deadline (zero: none).
func EventOf(d *pb.Delivery) (Event, time.Time) {
	return Event{
		ID: d.Id, Type: d.Type, Source: d.Source, Node: d.Node, Time: timeOf(d.TimeUnixNano),
		CausationID: d.CausationId, Schema: d.Schema, Headers: d.Headers, Body: d.Body,
		Attempt: int(d.Attempt), Redelivered: d.Redelivered, UserID: d.UserId, Queue: d.Queue, Offset: d.Offset,
		DeadQueue: d.DeadQueue, DeadReason: d.DeadReason, DeadError: d.DeadError,
		DeadAttempts: int(d.DeadAttempts), DeadTime: timeOf(d.DeadTimeUnixNano),
	}, timeOf(d.DeadlineUnixNano)
}

// ToolRequestOf is the host's side of handing a call of the module's tool
// i to its process. The caller sets Handling and the trace context.
func ToolRequestOf(r Request, i uint32) *pb.ToolRequest {
	return &pb.ToolRequest{
		Tool: i, Id: r.ID, Caller: r.Caller, Node: r.Node, TimeUnixNano: unixNano(r.Time),
		DeadlineUnixNano: unixNano(r.Deadline), CausationId: r.CausationID, Headers: r.Headers, Body: r.Body,
	}
}

// RequestOf is the module process's side: the call r carries, to the tool
// the process declared as its r.Tool-th (name: the wire carries the
// index, the name is the module's own).
func RequestOf(r *pb.ToolRequest, name string) Request {
	return Request{
		ID: r.Id, Tool: name, Caller: r.Caller, Node: r.Node, Time: timeOf(r.TimeUnixNano),
		Deadline: timeOf(r.DeadlineUnixNano), CausationID: r.CausationId, Headers: r.Headers, Body: r.Body,
	}
}

// unixNano is t on the wire: zero stays 0 (UnixNano of the zero time is
// out of int64's range, so undefined).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// timeOf is the wire's n back as a UTC time; 0 is the zero time (a
// malformed dead letter's unreadable time, a call without a deadline).
func timeOf(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// TimingOf is an emit's delay on the wire: sdk.After in milliseconds and
// sdk.At in Unix milliseconds, each rounded up, so that what the host
// schedules is never earlier than what the module asked (0: not set).
func TimingOf(o wire.EmitOptions) (afterMillis, atUnixMillis int64) {
	if o.After > 0 {
		afterMillis = int64((o.After + time.Millisecond - 1) / time.Millisecond)
	}
	if !o.At.IsZero() {
		ns := o.At.UnixNano()
		atUnixMillis = ns / 1e6
		if ns%1e6 > 0 {
			atUnixMillis++
		}
		if atUnixMillis == 0 {
			atUnixMillis = 1 // 1970 itself: passed, but not "none"
		}
	}
	return afterMillis, atUnixMillis
}

// TimingFrom is TimingOf's values back as the emit's options; a negative
// after is kept, for EmitOptions.Check to refuse.
func TimingFrom(afterMillis, atUnixMillis int64) (after time.Duration, at time.Time) {
	switch {
	case afterMillis < 0:
		after = -1
	case afterMillis > int64(math.MaxInt64/time.Millisecond):
		after = math.MaxInt64 // past delay.Max: refused
	default:
		after = time.Duration(afterMillis) * time.Millisecond
	}
	if atUnixMillis != 0 {
		at = time.UnixMilli(atUnixMillis).UTC()
	}
	return after, at
}
