package conformance_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/test/conformance"
)

// kindRow is one situation a handler or a tool may come to, and what
// every host makes of it: the same on meshtest, in-process and in a module
// process (issue 60: a tool whose inner call was not granted answered
// "rejected (permanent)" under meshtest and "failed (transient)" under
// meshd).
type kindRow struct {
	name  string
	steer conformance.Steer
	// old: the previous release's worker and tools modules do this too
	// (mesh.work.kinds to the worker, conf.echo to the tools): the row
	// is sent to them, on every host, and runs on the previous release's
	// module binary as well. The others go to the kinds module
	// (mesh.kinds.row, conf.kinds), which that binary does not have.
	old bool

	// What the handler's or the tool's inner call or emit returned, as
	// errors.Is and errors.As saw it in the module (conformance.Classify);
	// nil: it made none.
	inner []string

	// What the caller of the tool sees: errors.Is and errors.As on the
	// error Call returned (conformance.Classify: "permanent" is
	// errors.Is(err, sdk.ErrPermanent), "tool:CODE" a ToolError of that
	// code), the ToolError's Permanent.
	callerIs  []string
	permanent bool

	// What the event comes to, read from mesh.dead-letters on the wire
	// (x-mesh-dead-reason, x-mesh-dead-attempts).
	reason   string
	attempts int

	// text starts both the dead letter's error (x-mesh-dead-error) and
	// the ToolError's message: the module's words, as it returned them;
	// deadText, when set, starts the dead letter's error instead (a
	// ToolError's Error() says its code).
	text, deadText string
}

// kindRows is the table.
var kindRows = []kindRow{
	{name: "permanent error", steer: conformance.Steer{Permanent: true}, old: true,
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "permanent", attempts: 1, text: "permanent: asked to fail for good"},
	{name: "transient error", steer: conformance.Steer{Fail: 99}, old: true,
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to fail attempt "},
	{name: "panic", steer: conformance.Steer{Panic: true}, old: true,
		callerIs: []string{"permanent", "tool:internal"}, permanent: true, reason: "delivery_limit", attempts: maxAttempts, text: "handler panicked"},

	{name: "permanent ToolError with a code", steer: conformance.Steer{Code: "out_of_stock"},
		callerIs: []string{"permanent", "tool:out_of_stock"}, permanent: true, reason: "permanent", attempts: 1, text: "asked for out_of_stock",
		deadText: "tool error out_of_stock (permanent): asked for out_of_stock"},
	{name: "transient ToolError with a code", steer: conformance.Steer{Code: "busy", Transient: true},
		callerIs: []string{"tool:busy"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked for busy",
		deadText: "tool error busy (transient): asked for busy"},

	{name: "returns ErrForbidden", steer: conformance.Steer{Return: "forbidden"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "forbidden", attempts: 1, text: "asked to return forbidden: forbidden"},
	{name: "returns ErrPermanent", steer: conformance.Steer{Return: "permanent"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "permanent", attempts: 1, text: "asked to return permanent: permanent"},
	{name: "returns ErrInvalid", steer: conformance.Steer{Return: "invalid"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return invalid: invalid"},
	{name: "returns ErrNotStarted", steer: conformance.Steer{Return: "not_started"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return not_started: invalid"},
	{name: "returns ErrNoServer", steer: conformance.Steer{Return: "no_server"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return no_server: no server"},
	{name: "returns DeadlineExceeded", steer: conformance.Steer{Return: "deadline"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return deadline: context deadline exceeded"},
	{name: "returns ErrTransient", steer: conformance.Steer{Return: "transient"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return transient: transient"},
	{name: "returns ErrClosed", steer: conformance.Steer{Return: "closed"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "asked to return closed: mesh closed"},

	{name: "inner call not granted", steer: conformance.Steer{Call: "conf.invoice"}, inner: []string{"forbidden"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "forbidden", attempts: 1, text: "the inner call failed: call conf.invoice"},
	{name: "inner emit not granted", steer: conformance.Steer{Emit: "kinds.undeclared"}, inner: []string{"forbidden"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "forbidden", attempts: 1, text: "the inner emit failed: "},
	{name: "inner call not granted, its request unmarshalable", steer: conformance.Steer{Call: "conf.invoice", Unmarshalable: true}, inner: []string{"forbidden"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "forbidden", attempts: 1, text: "the inner call failed: call conf.invoice: forbidden"},
	{name: "inner emit not granted, its body unmarshalable", steer: conformance.Steer{Emit: "kinds.undeclared", Unmarshalable: true}, inner: []string{"forbidden"},
		callerIs: []string{"permanent", "tool:rejected"}, permanent: true, reason: "forbidden", attempts: 1, text: "the inner emit failed: "},
	{name: "inner call to a key nobody serves", steer: conformance.Steer{Call: "conf.nobody"}, inner: []string{"no_server"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: "the inner call failed: call conf.nobody"},
	{name: "inner call to a bad key", steer: conformance.Steer{Call: "conf..bad"}, inner: []string{"invalid"}, // not forbidden: no grant could name it
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: `the inner call failed: call: tool key "conf..bad"`},
	{name: "inner call answered with a permanent ToolError", steer: conformance.Steer{Call: "conf.echo", Inner: &conformance.Steer{Code: "out_of_stock"}},
		inner:    []string{"permanent", "tool:out_of_stock"},
		callerIs: []string{"permanent", "tool:out_of_stock"}, permanent: true, reason: "permanent", attempts: 1, text: ""},
	{name: "inner call answered with a transient ToolError", steer: conformance.Steer{Call: "conf.echo", Inner: &conformance.Steer{Code: "busy", Transient: true}},
		inner:    []string{"tool:busy"},
		callerIs: []string{"tool:busy"}, reason: "delivery_limit", attempts: maxAttempts, text: ""},
	{name: "inner call whose tool failed", steer: conformance.Steer{Call: "conf.echo", Inner: &conformance.Steer{Fail: 1}},
		inner:    []string{"tool:failed"},
		callerIs: []string{"tool:failed"}, reason: "delivery_limit", attempts: maxAttempts, text: ""},
	{name: "inner call whose tool panicked", steer: conformance.Steer{Call: "conf.echo", Inner: &conformance.Steer{Panic: true}},
		inner:    []string{"permanent", "tool:internal"},
		callerIs: []string{"permanent", "tool:internal"}, permanent: true, reason: "permanent", attempts: 1, text: ""},
}

// Every error a handler or a tool may come to is classified alike on every
// host: what its caller sees (errors.Is, the ToolError's code and
// Permanent), what the module saw of its inner call or emit, and the
// event's dead-letter reason and attempts on the wire. The table is
// kindRows; the kinds module does what each row's steer asks, once as the
// handler of an event and once as a tool.
func errorKinds(t *testing.T, h Host) {
	h.Load(t, "tools", ModuleConfig{})
	h.Load(t, "worker", ModuleConfig{})
	var kinds *Log
	if !h.Previous() {
		// conf.invoice is the call its node config does not grant.
		kinds = h.Load(t, "kinds", ModuleConfig{CallGrants: []string{"conf.echo", "conf.nobody", "conf.kinds"}})
	}
	rows := slices.DeleteFunc(slices.Clone(kindRows), func(r kindRow) bool { return h.Previous() && !r.old })
	if h.Previous() {
		t.Logf("the previous release's module binary has no kinds module: %d rows of %d run", len(rows), len(kindRows))
	}

	// Every event goes out at once, then every call: the rows run side
	// by side, and the test takes as long as its slowest row.
	ids := map[string]int{} // event id: row
	for i, r := range rows {
		s := r.steer
		s.N = i + 1
		eventType := "mesh.kinds.row"
		if r.old {
			eventType = "mesh.work.kinds"
		}
		ids[h.Emit(t, eventType, s)] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	callErrs := make([]error, len(rows))
	var wg sync.WaitGroup
	for i, r := range rows {
		s := r.steer
		s.N = i + 1
		tool := "conf.kinds"
		if r.old {
			tool = "conf.echo"
		}
		if h.Clocked() { // meshtest: one call at a time, each settled
			callErrs[i] = h.Call(ctx, tool, s, nil)
			continue
		}
		wg.Go(func() { callErrs[i] = h.Call(ctx, tool, s, nil) })
	}
	wg.Wait()
	dead := map[int]Dead{}
	for _, d := range h.Dead(t, len(rows)) {
		i, ok := ids[d.ID]
		if !ok {
			t.Errorf("a dead letter of no row: %+v", d)
			continue
		}
		dead[i] = d
	}
	var inner map[string][]conformance.Record
	if kinds != nil {
		inner = map[string][]conformance.Record{}
		for _, r := range kinds.Records(t) {
			if strings.HasSuffix(r.Kind, "_inner") && r.Attempt <= 1 {
				inner[r.Kind+"/"+r.Value] = append(inner[r.Kind+"/"+r.Value], r)
			}
		}
	}
	for i, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			// The caller of the tool.
			err := callErrs[i]
			var te *sdk.ToolError
			if got := sorted(conformance.Classify(err)); !slices.Equal(got, sorted(r.callerIs)) || !errors.As(err, &te) || te.Permanent != r.permanent {
				t.Errorf("the tool's caller got %v (errors.Is/As: %v), want a ToolError (permanent %v) that is %v", err, got, r.permanent, sorted(r.callerIs))
			} else if !strings.HasPrefix(te.Message, r.text) {
				t.Errorf("the tool's caller got the message %q, want it to start with %q", te.Message, r.text)
			}
			// The event.
			deadText := cmp.Or(r.deadText, r.text)
			d, ok := dead[i]
			if !ok {
				t.Errorf("no dead letter")
			} else if d.Reason != r.reason || d.Attempts != r.attempts || !strings.HasPrefix(d.Err, deadText) {
				t.Errorf("dead letter %q after %d attempts, error %q; want %q after %d, the error starting %q", d.Reason, d.Attempts, d.Err, r.reason, r.attempts, deadText)
			}
			if r.old {
				return // the worker and conf.echo make no inner call
			}
			// What the module saw of its inner call or emit, as a handler
			// and as a tool.
			for _, kind := range []string{"kinds_event_inner", "kinds_tool_inner"} {
				rs := inner[kind+"/"+fmt.Sprint(i+1)]
				switch {
				case r.inner == nil && len(rs) > 0:
					t.Errorf("%s: %+v, want none", kind, rs)
				case r.inner != nil && len(rs) == 0:
					t.Errorf("%s: none, want one that is %v", kind, r.inner)
				case r.inner != nil && !slices.Equal(sorted(rs[0].Is), sorted(r.inner)):
					t.Errorf("%s: %q is %v, want %v", kind, rs[0].Err, sorted(rs[0].Is), sorted(r.inner))
				}
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
