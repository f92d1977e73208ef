package plugin

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
)

// fillFields sets every exported field of the struct v points to a value that
// differs from its zero and from every other field's, so a field that a
// conversion drops or swaps shows.
func fillFields(t *testing.T, v any) {
	t.Helper()
	s := reflect.ValueOf(v).Elem()
	for i := 0; i < s.NumField(); i++ {
		f, sf := s.Field(i), s.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		n := i + 1
		switch f.Interface().(type) {
		case string:
			f.SetString(fmt.Sprintf("%s-%d", sf.Name, n))
		case int:
			f.SetInt(int64(n))
		case uint32, uint64:
			f.SetUint(uint64(n))
		case int64: // a time on the wire
			f.SetInt(time.Date(2026, 12, n, 8, 0, 0, n, time.UTC).UnixNano())
		case bool:
			f.SetBool(true)
		case time.Time:
			f.Set(reflect.ValueOf(time.Date(2026, 12, n, 8, 0, 0, n, time.UTC)))
		case map[string]string:
			f.Set(reflect.ValueOf(map[string]string{sf.Name: fmt.Sprint(n)}))
		case json.RawMessage:
			f.Set(reflect.ValueOf(json.RawMessage(fmt.Sprintf(`{"field":%d}`, n))))
		case []byte:
			f.SetBytes([]byte(fmt.Sprintf(`{"field":%d}`, n)))
		default:
			t.Fatalf("fillFields: no value for %s %s: teach fillFields its type", sf.Name, sf.Type)
		}
	}
}

// TestEventRoundTrip: every field of the event crosses to the module
// process and back unchanged, and so does every field of a delivery that
// belongs to the event.
func TestEventRoundTrip(t *testing.T) {
	var ev Event
	fillFields(t, &ev)
	deadline := time.Date(2027, 1, 1, 0, 0, 0, 5, time.UTC)
	back, gotDeadline := EventOf(DeliveryOf(ev, deadline))
	if !reflect.DeepEqual(back, ev) {
		t.Errorf("event changed crossing the boundary:\n sent %+v\n  got %+v", ev, back)
	}
	if !gotDeadline.Equal(deadline) {
		t.Errorf("deadline %v crossed as %v", deadline, gotDeadline)
	}

	// The other way: a delivery field the conversions do not carry is one
	// the module never sees. Those that belong to the crossing are set by
	// the caller.
	var d pb.Delivery
	fillFields(t, &d)
	d.Seq, d.Pattern, d.Handling, d.Traceparent, d.Tracestate = 0, 0, 0, "", ""
	d.HistoryBatch, d.HistoryBatchSize = 0, 0 // the crossing's: a batch of the history
	pe, dl := EventOf(&d)
	again := DeliveryOf(pe, dl)
	if !reflect.DeepEqual(fields(again), fields(&d)) {
		t.Errorf("delivery changed crossing the boundary:\n sent %+v\n  got %+v", fields(&d), fields(again))
	}
}

// TestRequestRoundTrip: the same for a tool call; the tool crosses as its
// index and comes back as the name the module declared at that index.
func TestRequestRoundTrip(t *testing.T) {
	var r Request
	fillFields(t, &r)
	back := RequestOf(ToolRequestOf(r, 3), r.Tool)
	if !reflect.DeepEqual(back, r) {
		t.Errorf("request changed crossing the boundary:\n sent %+v\n  got %+v", r, back)
	}
	var tr pb.ToolRequest
	fillFields(t, &tr)
	tr.Handling, tr.Traceparent, tr.Tracestate = 0, "", ""
	again := ToolRequestOf(RequestOf(&tr, "tool"), tr.Tool)
	if !reflect.DeepEqual(fields(again), fields(&tr)) {
		t.Errorf("tool request changed crossing the boundary:\n sent %+v\n  got %+v", fields(&tr), fields(again))
	}
}

// TestZeroTimes: a zero time (an unreadable dead-letter time, no deadline)
// crosses as zero, not as a date before 1678.
func TestZeroTimes(t *testing.T) {
	d := DeliveryOf(Event{ID: "e"}, time.Time{})
	if d.TimeUnixNano != 0 || d.DeadTimeUnixNano != 0 || d.DeadlineUnixNano != 0 {
		t.Fatalf("zero times on the wire: %d %d %d", d.TimeUnixNano, d.DeadTimeUnixNano, d.DeadlineUnixNano)
	}
	ev, deadline := EventOf(d)
	if !ev.Time.IsZero() || !ev.DeadTime.IsZero() || !deadline.IsZero() {
		t.Fatalf("zero times back: %v %v %v", ev.Time, ev.DeadTime, deadline)
	}
	r := RequestOf(ToolRequestOf(Request{ID: "r"}, 0), "t")
	if !r.Time.IsZero() || !r.Deadline.IsZero() {
		t.Fatalf("zero request times back: %v %v", r.Time, r.Deadline)
	}
}

// fields is the exported fields of a protobuf message, by name.
func fields(m any) map[string]any {
	out := map[string]any{}
	s := reflect.ValueOf(m).Elem()
	for i := 0; i < s.NumField(); i++ {
		if sf := s.Type().Field(i); sf.IsExported() {
			out[sf.Name] = s.Field(i).Interface()
		}
	}
	return out
}

// TestTimingCrossesRoundedUp: an emit's delay reaches the host never
// earlier than the module asked (rounded up to the millisecond), a zero
// one as none, a negative one kept for the host to refuse, and one too
// large for a Duration as one past the bound.
func TestTimingCrossesRoundedUp(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 1, time.UTC) // 1 ns past a millisecond
	after, atMs := TimingOf(wire.EmitOptions{After: 1500*time.Microsecond + 1, At: at})
	if after != 2 || atMs != at.UnixMilli()+1 {
		t.Errorf("TimingOf = %d, %d; want 2 ms and the next millisecond", after, atMs)
	}
	gotAfter, gotAt := TimingFrom(after, atMs)
	if gotAfter < 1500*time.Microsecond || gotAt.Before(at) {
		t.Errorf("TimingFrom = %v, %v: earlier than asked", gotAfter, gotAt)
	}
	if a, b := TimingOf(wire.EmitOptions{}); a != 0 || b != 0 {
		t.Errorf("no timing crossed as %d, %d", a, b)
	}
	if a, b := TimingFrom(0, 0); a != 0 || !b.IsZero() {
		t.Errorf("no timing arrived as %v, %v", a, b)
	}
	if a, _ := TimingFrom(-5, 0); a >= 0 {
		t.Errorf("a negative delay arrived as %v", a)
	}
	if a, _ := TimingFrom(math.MaxInt64, 0); a <= 9*365*24*time.Hour {
		t.Errorf("a huge delay arrived as %v", a)
	}
}
