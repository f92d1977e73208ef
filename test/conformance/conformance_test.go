package conformance_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/releasetest"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/test/conformance"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := buildModule(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// scenario is one rule of the contract, written once.
type scenario struct {
	name string
	run  func(t *testing.T, h Host)
	// delays runs the scenario's node with delays on (declaring the delay
	// cascade costs about half a second, so only where a scenario needs it).
	delays bool
	// since names the release whose sdk the scenario's modules need (the
	// outbox's ledger: v0.2.0); a module binary of an earlier release
	// has no such module, and the scenario is not its to pass.
	since string
}

// scenarios lists the contract's rules (the sdk package doc, "What a
// module can rely on").
var scenarios = []scenario{
	{name: "EmitNamingAndBodies", run: emitNamingAndBodies},
	{name: "EmitAsyncFromOneGoroutine", run: emitAsync},
	{name: "SetupPhase", run: setupPhase},
	{name: "HandlerSuccessIsHandledOnce", run: handlerSuccess},
	{name: "RetriesCountAttempts", run: retriesCountAttempts},
	{name: "PermanentDeadLettersAtOnce", run: permanentDeadLetters},
	{name: "AttemptLimitDeadLetters", run: attemptLimit},
	{name: "RefusedGrantDeadLettersAtOnce", run: refusedGrant, since: "v0.2.0"},
	{name: "DeadLettersReachTheirHandler", run: deadLettersHandler},
	{name: "ConsumeAnExistingQueue", run: consumeQueue},
	{name: "HoldAConsumedQueue", run: holdQueue},
	{name: "PanicIsAFailedAttempt", run: panicIsFailure},
	{name: "PanicNamesItsFileAndLine", run: panicNamesItsLine, since: "v0.2.0"},
	{name: "HandlerTimeoutCancelsCtx", run: handlerTimeout_},
	{name: "OneAtATimeInQueueOrder", run: queueOrder},
	{name: "ConcurrencyRunsHandlersTogether", run: concurrencyTogether},
	{name: "DuplicatesAreAbsorbed", run: duplicates},
	{name: "SameIDOtherBodyIsAConflict", run: conflicts},
	{name: "CausationAndDerivedIDs", run: causationAndDerivedIDs},
	{name: "RetriedEmitIsAbsorbed", run: retriedEmitAbsorbed},
	{name: "RetryWithOtherBodyIsNotLost", run: retryWithOtherBody},
	{name: "FreshIDOnRequest", run: freshID},
	{name: "ToolOutcomes", run: toolOutcomes},
	{name: "ErrorKindsAreTheSameOnEveryHost", run: errorKinds},
	{name: "RetriedCallRunsToolOnce", run: retriedCallRunsToolOnce},
	{name: "CallDefaultDeadlineIsTheNodes", run: callDefaultDeadline},
	{name: "RunCtxEndsAtStop", run: runCtxEndsAtStop},
	{name: "FiltersAreTheHosts", run: filters},
	{name: "TypedHandlersAndTools", run: typedHandlers},
	{name: "HandlerContextCarriesLoggerTraceDeadline", run: handlerContext},
	{name: "RunCtxEndsAfterHandlersDrain", run: runCtxAfterDrain},
	{name: "FailingRunIsNotSilent", run: failingRun},
	{name: "DelayedAndAtMostOnceEmits", run: delayedEmits, delays: true},
	{name: "SchemasCheckEmitsAndReads", run: schemasCheck},
	{name: "SchemasSkipBodyValidationKeepsXSchema", run: schemasSkipValidation},
	{name: "ToolSchemasCheckRequestsAndResponses", run: toolSchemasCheck},
	{name: "OutboxPublishesWhatCommits", run: outboxCommits, since: "v0.2.0"},
	{name: "InboxAppliesEachEventOnce", run: inboxOnce, since: "v0.2.0"},
}

// TestConformance runs every scenario on every host.
func TestConformance(t *testing.T) {
	previous := releasetest.Previous(t)
	hosts := []struct {
		name string
		new  func(t *testing.T, delays bool) Host
	}{
		{"meshtest", func(t *testing.T, _ bool) Host { return newMemHost(t) }},
		{"inprocess", func(t *testing.T, delays bool) Host { return newBrokerHost(t, "", delays) }},
		{"process", func(t *testing.T, delays bool) Host {
			bin, err := buildModule()
			if err != nil {
				t.Fatal(err)
			}
			return newBrokerHost(t, bin, delays)
		}},
		// The previous release's module binary, built from the git
		// history, under this meshd: the protocol window's promise
		// (docs/compatibility.md). Every scenario here existed then.
		{"process-" + previous.Version, func(t *testing.T, delays bool) Host {
			h := newBrokerHost(t, releasetest.Build(t, previous, "./test/conformance/module"), delays)
			h.(*brokerHost).previous = true
			return h
		}},
	}
	for _, host := range hosts {
		t.Run(host.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					if sc.since != "" && host.name == "process-"+previous.Version {
						t.Skipf("its modules use the sdk of %s; %s's module binary has none of them", sc.since, previous.Version)
					}
					if host.name != "meshtest" {
						t.Parallel()
					}
					sc.run(t, host.new(t, sc.delays))
				})
			}
		})
	}
}

func is(r conformance.Record, what ...string) bool {
	for _, w := range what {
		if !slices.Contains(r.Is, w) {
			return false
		}
	}
	return len(what) > 0 || len(r.Is) == 0
}

func body(n int, s conformance.Steer) conformance.Steer { s.N = n; return s }

// Emit names an event under the module (module.<m>.<name>), refuses a bad
// name, a body that is not JSON and a bad option with ErrInvalid, and a
// type outside the module's namespace, or one in it the module does not
// declare in Emits, with ErrForbidden. Outside a handler, the same emit
// twice gets two fresh ids.
func emitNamingAndBodies(t *testing.T, h Host) {
	watch := h.Load(t, "watcher", ModuleConfig{})
	namer := h.Load(t, "namer", ModuleConfig{})
	want := map[string][]string{
		"emit_ok": nil, "emit_ok_again": nil, "emit_own_full_type": nil,
		"emit_empty_word": {"invalid"}, "emit_wildcard": {"invalid"}, "emit_not_json": {"invalid"},
		"emit_unmarshalable": {"invalid"}, "emit_ungranted_full_type": {"forbidden"}, "emit_bad_option": {"invalid"},
		"emit_undeclared": {"forbidden"}, "emit_undeclared_full_type": {"forbidden"},
	}
	for kind := range want { // its records may come in any order
		namer.WaitKind(t, kind, 1)
	}
	for kind, w := range want {
		rs := namer.Of(t, kind)
		if len(rs) != 1 || !is(rs[0], w...) || (w == nil) != (rs[0].ID != "") {
			t.Errorf("%s: %+v, want errors %v", kind, rs, w)
		}
	}
	if a, b := namer.Of(t, "emit_ok"), namer.Of(t, "emit_ok_again"); len(a) == 1 && len(b) == 1 && a[0].ID == b[0].ID {
		t.Errorf("two emits outside a handler got the same id %s", a[0].ID)
	}
	seen := watch.WaitKind(t, "seen", 3)
	types := []string{seen[0].Type, seen[1].Type, seen[2].Type}
	slices.Sort(types)
	if !slices.Equal(types, []string{"module.namer.site.created", "module.namer.site.created", "module.namer.site.full"}) {
		t.Errorf("types seen %v", types)
	}
	for _, s := range seen {
		if s.Source != "namer" || s.Node != "conf" || s.CausationID != "" {
			t.Errorf("event %+v: want source namer, node conf, no causation", s)
		}
	}
}

// EmitAsync from one goroutine: every emit's outcome reaches its done
// once, each with its own id, and each event is delivered; a bad name
// reaches done as ErrInvalid; a nil done is refused at once with
// ErrInvalid.
func emitAsync(t *testing.T, h Host) {
	watch := h.Load(t, "watcher", ModuleConfig{})
	streamer := h.Load(t, "streamer", ModuleConfig{})
	done := streamer.WaitKind(t, "stream_done", conformance.Streamed+1)
	ids := map[string]bool{}
	invalid := 0
	for _, r := range done {
		switch {
		case r.Err != "" && is(r, "invalid"):
			invalid++
		case r.Err != "":
			t.Errorf("done with %s", r.Err)
		case r.ID == "" || ids[r.ID]:
			t.Errorf("done with id %q, empty or seen before", r.ID)
		default:
			ids[r.ID] = true
		}
	}
	if len(ids) != conformance.Streamed || invalid != 1 || len(done) != conformance.Streamed+1 {
		t.Errorf("%d ids, %d invalid, %d outcomes; want %d, 1, %d", len(ids), invalid, len(done), conformance.Streamed, conformance.Streamed+1)
	}
	if rs := streamer.Of(t, "stream_refused"); len(rs) != 0 {
		t.Errorf("EmitAsync refused: %+v", rs)
	}
	streamer.WaitKind(t, "stream_no_done", 1)
	if rs := streamer.Of(t, "stream_no_done"); len(rs) != 1 || !is(rs[0], "invalid") {
		t.Errorf("EmitAsync without done: %+v", rs)
	}
	for _, r := range watch.WaitKind(t, "seen", conformance.Streamed) {
		if !ids[r.ID] || r.Type != "module.streamer.item" {
			t.Errorf("seen %s %s, which no done reported", r.Type, r.ID)
		}
	}
}

// Setup may subscribe and serve, and nothing else: Emit and Call are
// refused with ErrNotStarted; a nil handler, a pattern that could never
// match and a second subscription of a pattern or tool with ErrInvalid; an ungranted tool with ErrForbidden.
// After Setup, On and Serve are refused with ErrAlreadyStarted.
func setupPhase(t *testing.T, h Host) {
	l := h.Load(t, "setup", ModuleConfig{ToolGrants: []string{"conf.*"}})
	l.WaitKind(t, "run_serve", 1)
	want := map[string][]string{
		"setup_emit": {"not_started"}, "setup_call": {"not_started"},
		"setup_on_nil": {"invalid"}, "setup_on": nil, "setup_on_again": {"invalid"}, "setup_on_bad": {"invalid"}, "setup_on_never": {"invalid"},
		"setup_serve_nil": {"invalid"}, "setup_serve": nil, "setup_serve_again": {"invalid"},
		"setup_serve_ungranted": {"forbidden"},
		"run_on":                {"already_started", "invalid"}, "run_serve": {"already_started", "invalid"},
		"setup_on_bad_filter": {"invalid"}, "setup_serve_filter": {"invalid"}, "setup_consume_duplicates": {"invalid"},
	}
	for kind, w := range want {
		rs := l.Of(t, kind)
		if len(rs) != 1 || !is(rs[0], w...) {
			t.Errorf("%s: %+v, want %v", kind, rs, w)
		}
	}
	if rs := l.Of(t, "setup_on_never"); len(rs) == 1 && !strings.Contains(rs[0].Err, `did you mean "module.setup.created"`) {
		t.Errorf("the refusal of a pattern that never matches does not name the fix: %s", rs[0].Err)
	}
	if rs := l.Of(t, "setup_serve_ungranted"); len(rs) == 1 && !strings.Contains(rs[0].Err, "tools") {
		t.Errorf("the refusal of an ungranted tool does not name the config's tools key: %s", rs[0].Err)
	}
	for kind, says := range map[string]string{
		"setup_on_bad_filter":      "did you mean body.total",
		"setup_serve_filter":       "Filter does not apply to Serve",
		"setup_consume_duplicates": "AllowDuplicates does not apply to Consume",
		"setup_emit":               "Emit and Call are for Run and handlers",
		"run_on":                   "On, Consume, Exclusive and Serve are for Setup",
	} {
		if rs := l.Of(t, kind); len(rs) == 1 && !strings.Contains(rs[0].Err, says) {
			t.Errorf("%s: %q does not say %q", kind, rs[0].Err, says)
		}
	}
}

// Filters are the host's: an event goes to the first handler whose
// pattern matches it and whose filter accepts it, through any middleware;
// an event no filter accepts is acknowledged without running a handler,
// and is neither retried nor dead-lettered; an accepted event's attempts
// count as any other's, from 1. Filters read the body (a body that is not
// JSON has no fields), the source and, on a consumed queue, the headers.
func filters(t *testing.T, h Host) {
	h.Queue(t, "conf.filtered")
	f := h.Load(t, "filterer", ModuleConfig{})
	big := h.Emit(t, "mesh.filt.x", map[string]any{"n": 12, "fail": 1})    // big: attempts 1 and 2
	tagged := h.Emit(t, "mesh.filt.x", map[string]any{"n": 3, "tag": "a"}) // big rejects it, tagged takes it
	none := h.Emit(t, "mesh.filt.x", map[string]any{"n": 3, "tag": "z"})   // both reject it
	untagged := h.Emit(t, "mesh.filt.x", map[string]any{"tag": "z"})       // tagged: no n
	deep := h.Emit(t, "mesh.filt.x.y", map[string]any{"tag": "a"})         // only big's pattern matches, and its filter rejects it
	marker := h.Emit(t, "mesh.filt.x", map[string]any{"n": 100})           // queued after all of them
	for _, p := range []struct {
		id, headers, body string
	}{
		{"keep-1", "keep", `{}`}, {"other-1", "other", `{}`}, {"bare-1", "", `{}`}, {"drop-1", "keep", `{"drop": true}`},
		{"text-1", "keep", "not JSON: no body.drop"}, {"keep-2", "keep", `{"drop": false}`},
	} {
		var headers map[string]string
		if p.headers != "" {
			headers = map[string]string{"x-kind": p.headers}
		}
		h.Put(t, "conf.filtered", p.id, []byte(p.body), headers)
	}
	rs := f.Wait(t, "the markers and the retry", func(rs []conformance.Record) bool {
		return countID(rs, marker) == 1 && countID(rs, big) == 2 && countID(rs, "keep-2") == 1
	})
	want := map[string][]string{big: {"big", "big"}, tagged: {"tagged"}, untagged: {"tagged"}, marker: {"big"},
		"keep-1": {"queued"}, "text-1": {"queued"}, "keep-2": {"queued"}}
	got := map[string][]string{}
	for _, r := range rs {
		got[r.ID] = append(got[r.ID], r.Kind)
		if r.ID != big && r.Attempt != 1 {
			t.Errorf("%s (%s) at attempt %d, want 1", r.ID, r.Kind, r.Attempt)
		}
	}
	for _, id := range []string{none, deep, "other-1", "bare-1", "drop-1"} {
		if got[id] != nil {
			t.Errorf("%s, which no filter accepts, reached %v", id, got[id])
		}
	}
	for id, kinds := range want {
		if !slices.Equal(got[id], kinds) {
			t.Errorf("%s reached %v, want %v", id, got[id], kinds)
		}
	}
}

// A typed handler gets its body decoded; a body that does not decode is
// dead-lettered at once as permanent, naming why, without the handler
// running. A typed tool answers a request that does not decode with a
// permanent invalid_request; TypedCall decodes the answer.
func typedHandlers(t *testing.T, h Host) {
	l := h.Load(t, "typed", ModuleConfig{ToolGrants: []string{"conf.*"}})
	ok := h.Emit(t, "mesh.typed.ok", map[string]any{"n": 2})
	bad := h.Emit(t, "mesh.typed.bad", map[string]any{"n": "two"})
	call := h.Emit(t, "mesh.typed.call", map[string]any{"n": 21})
	rs := l.WaitKind(t, "typed_call", 1)
	if rs[0].ID != call || rs[0].Value != "42" || rs[0].Err != "" {
		t.Errorf("typed call %+v, want 42", rs[0])
	}
	typed := l.Of(t, "typed")
	if len(typed) != 2 || typed[0].ID != ok || typed[0].Value != "2" || typed[1].ID != call {
		t.Errorf("typed handler calls %+v, want %s with 2, then %s", typed, ok, call)
	}
	d := h.Dead(t, 1)[0]
	if d.ID != bad || d.Reason != "permanent" || d.Attempts != 1 || !strings.Contains(d.Err, "decode the body of mesh.typed.bad event") {
		t.Errorf("dead letter %+v, want %s, permanent after 1 attempt, saying it did not decode", d, bad)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var resp json.RawMessage
	err := h.Call(ctx, "conf.double", map[string]string{"n": "x"}, &resp)
	var te *sdk.ToolError
	if !errors.As(err, &te) || te.Code != "invalid_request" || !te.Permanent || !strings.Contains(te.Message, "decode the request") {
		t.Errorf("a request that does not decode: %v, want a permanent invalid_request", err)
	}
}

// A handler returning nil is called once, with attempt 1, and its event is
// not dead-lettered.
func handlerSuccess(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{})
	id := h.Emit(t, "mesh.work.ok", body(1, conformance.Steer{}))
	h.Emit(t, "mesh.work.ok", body(2, conformance.Steer{})) // proves the first is settled
	rs := w.WaitKind(t, "attempt", 2)
	if len(rs) != 2 || rs[0].ID != id || rs[0].Attempt != 1 || rs[0].Redelivered || rs[0].Type != "mesh.work.ok" || rs[0].Source != "conformance" {
		t.Errorf("attempts %+v, want one of %s, attempt 1", rs, id)
	}
}

// A transient error is retried with the attempt counted up; a success
// ends it.
func retriesCountAttempts(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{})
	id := h.Emit(t, "mesh.work.flaky", body(1, conformance.Steer{Fail: 2}))
	rs := w.WaitKind(t, "attempt", 3)
	for i, r := range rs {
		if r.ID != id || r.Attempt != i+1 {
			t.Errorf("attempt %d: %+v", i+1, r)
		}
	}
	h.Emit(t, "mesh.work.ok", body(2, conformance.Steer{}))
	if rs := w.WaitKind(t, "attempt", 4); len(rs) != 4 {
		t.Errorf("the flaky event was tried again after it succeeded: %+v", rs)
	}
}

// A Permanent error dead-letters the event at once, with the reason and
// the error.
func permanentDeadLetters(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{})
	id := h.Emit(t, "mesh.work.bad", body(1, conformance.Steer{Permanent: true}))
	d := h.Dead(t, 1)[0]
	if d.ID != id || d.Reason != "permanent" || d.Attempts != 1 || d.Type != "mesh.work.bad" ||
		d.Queue != "conf.worker.events" || !strings.Contains(d.Err, "asked to fail for good") {
		t.Errorf("dead letter %+v", d)
	}
	if rs := w.Of(t, "attempt"); len(rs) != 1 {
		t.Errorf("attempts %+v, want 1", rs)
	}
}

// Past the attempt limit the event is dead-lettered with the last error.
func attemptLimit(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{})
	id := h.Emit(t, "mesh.work.doomed", body(1, conformance.Steer{Fail: 99}))
	d := h.Dead(t, 1)[0]
	if d.ID != id || d.Reason != "delivery_limit" || d.Attempts != maxAttempts || !strings.Contains(d.Err, "asked to fail attempt 3") {
		t.Errorf("dead letter %+v, want delivery_limit after %d attempts", d, maxAttempts)
	}
	if rs := w.Of(t, "attempt"); len(rs) != maxAttempts {
		t.Errorf("%d attempts, want %d", len(rs), maxAttempts)
	}
}

// A handler whose call the node config does not grant is dead-lettered at
// once, with the reason "forbidden" and the refusal that names the key to
// add: no retry could succeed. (A v0.1.0 module binary reports the
// refusal as a failed attempt: retried, then delivery_limit.)
func refusedGrant(t *testing.T, h Host) {
	h.Load(t, "tools", ModuleConfig{})
	c := h.Load(t, "caller", ModuleConfig{CallGrants: []string{"conf.echo"}})
	id := h.Emit(t, "mesh.order.placed", body(1, conformance.Steer{}))
	d := h.Dead(t, 1)[0]
	if d.ID != id || d.Reason != "forbidden" || d.Attempts != 1 || !strings.Contains(d.Err, "conf.invoice") || !strings.Contains(d.Err, "calls:") {
		t.Errorf("dead letter %+v, want forbidden after 1 attempt, naming conf.invoice and calls:", d)
	}
	if rs := c.Of(t, "invoice"); len(rs) != 1 || !is(rs[0], "forbidden") {
		t.Errorf("calls %+v, want one, refused as forbidden", rs)
	}
}

// A module's DeadLetters handler gets every dead letter, saying which
// queue gave up, why, after how many attempts and with what error; it is
// retried like a handler, and past the attempt limit it stops.
func deadLettersHandler(t *testing.T, h Host) {
	h.Load(t, "worker", ModuleConfig{})
	u := h.Load(t, "undertaker", ModuleConfig{})
	id := h.Emit(t, "mesh.work.bad", body(1, conformance.Steer{Permanent: true, DeadFail: 1}))
	rs := u.Wait(t, "both attempts at the dead letter", func(rs []conformance.Record) bool { return countID(rs, id) >= 2 })
	var mine []conformance.Record
	for _, r := range rs {
		if r.ID == id {
			mine = append(mine, r)
		}
	}
	for i, r := range mine {
		if r.Attempt != i+1 || r.Type != "mesh.work.bad" || r.DeadQueue != "conf.worker.events" || r.DeadReason != "permanent" ||
			r.DeadAttempts != 1 || !strings.Contains(r.DeadError, "asked to fail for good") || !r.DeadTime || r.Source == "" {
			t.Errorf("dead letter as handled %+v", r)
		}
	}
	doomed := h.Emit(t, "mesh.work.bad", body(2, conformance.Steer{Permanent: true, DeadFail: 99}))
	rs = u.Wait(t, "every attempt at the second dead letter", func(rs []conformance.Record) bool { return countID(rs, doomed) >= maxAttempts })
	if n := countID(rs, doomed); n != maxAttempts {
		t.Errorf("%d attempts at a dead letter that always fails, want %d", n, maxAttempts)
	}
}

// A module consumes an existing queue: each message as it is (a body
// that is not JSON too), its id and queue; a failure retried, a
// Permanent error dead-lettered naming the queue.
func consumeQueue(t *testing.T, h Host) {
	h.Queue(t, "conf.orders")
	tk := h.Load(t, "taker", ModuleConfig{})
	h.Put(t, "conf.orders", "order-1", []byte("plain text, not JSON"), nil)
	h.Put(t, "conf.orders", "order-2", []byte(`{"fail":1}`), nil)
	h.Put(t, "conf.orders", "order-3", []byte(`{"permanent":true}`), nil)
	rs := tk.WaitKind(t, "taken", 4)
	got := map[string][]int{}
	for _, r := range rs {
		got[r.ID] = append(got[r.ID], r.Attempt)
		if r.Queue != "conf.orders" || r.Type != "conf.orders" {
			t.Errorf("taken %+v", r)
		}
		if r.ID == "order-1" && r.Value != "plain text, not JSON" {
			t.Errorf("body as handed: %q", r.Value)
		}
	}
	if len(got["order-1"]) != 1 || len(got["order-2"]) != 2 || got["order-2"][1] != 2 || len(got["order-3"]) != 1 {
		t.Errorf("attempts by id: %v", got)
	}
	d := h.Dead(t, 1)[0]
	if d.ID != "order-3" || d.Queue != "conf.orders" || d.Reason != "permanent" || d.Attempts != 1 {
		t.Errorf("dead letter %+v", d)
	}
}

// A held queue keeps its messages: none is handed over until the module
// releases it; then they are.
func holdQueue(t *testing.T, h Host) {
	h.Queue(t, "conf.orders")
	tk := h.Load(t, "taker", ModuleConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Call(ctx, "taker.hold", true, nil); err != nil {
		t.Fatal(err)
	}
	h.Put(t, "conf.orders", "held-1", []byte(`{}`), nil)
	h.Put(t, "conf.orders", "held-2", []byte(`{}`), nil)
	h.Settle()
	if err := h.Call(ctx, "taker.hold", false, nil); err != nil {
		t.Fatal(err)
	}
	rs := tk.WaitKind(t, "taken", 2)
	if len(rs) != 2 || len(tk.Of(t, "taken_while_held")) != 0 {
		t.Errorf("taken %+v, while held %+v", rs, tk.Of(t, "taken_while_held"))
	}
}

// countID counts the records of the event id.
func countID(rs []conformance.Record, id string) (n int) {
	for _, r := range rs {
		if r.ID == id {
			n++
		}
	}
	return n
}

// A panic is a failed attempt: retried, then dead-lettered, saying so.
func panicIsFailure(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{MaxAttempts: 2})
	h.Emit(t, "mesh.work.panic", body(1, conformance.Steer{Panic: true}))
	d := h.Dead(t, 1)[0]
	if d.Reason != "delivery_limit" || d.Attempts != 2 || !strings.Contains(d.Err, "panicked") {
		t.Errorf("dead letter %+v", d)
	}
	if rs := w.Of(t, "attempt"); len(rs) != 2 {
		t.Errorf("%d attempts, want 2", len(rs))
	}
}

// A handler's panic is dead-lettered with an error that names the file and
// line where it panicked (the conformance module's act, in modules.go).
// On a node, the failed attempt is a warning naming the event, with the
// panic's stack.
func panicNamesItsLine(t *testing.T, h Host) {
	h.Load(t, "worker", ModuleConfig{MaxAttempts: 2})
	id := h.Emit(t, "mesh.work.panic", body(1, conformance.Steer{Panic: true}))
	d := h.Dead(t, 1)[0]
	if !regexp.MustCompile(`^handler panicked at conformance/modules\.go:[0-9]+: asked to panic`).MatchString(d.Err) {
		t.Errorf("dead letter error %q, want it to name conformance/modules.go and the line", d.Err)
	}
	if h.Clocked() {
		return // meshtest: its dead letters say it
	}
	warned := func(s string) bool {
		for line := range strings.Lines(s) {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "handler failed; will retry") &&
				strings.Contains(line, "event_id="+id) && strings.Contains(line, "attempt=1") {
				return true
			}
		}
		return false
	}
	if logs, ok := h.WaitLogs(30*time.Second, func(s string) bool { return warned(s) && strings.Contains(s, "stack=") }); !ok {
		t.Errorf("no warning of the failed attempt with its stack; the node logged:\n%s", logs)
	}
}

// A handler past its timeout sees its ctx end with DeadlineExceeded, and
// the attempt fails as timed out.
func handlerTimeout_(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{MaxAttempts: 1, HandlerTimeout: 200 * time.Millisecond})
	h.Emit(t, "mesh.work.hang", body(1, conformance.Steer{Block: true}))
	d := h.Dead(t, 1)[0]
	if d.Reason != "delivery_limit" || d.Attempts != 1 || !strings.Contains(d.Err, "timed out") {
		t.Errorf("dead letter %+v", d)
	}
	if rs := w.WaitKind(t, "ctx", 1); !is(rs[0], "deadline") {
		t.Errorf("the handler's ctx ended with %+v, want DeadlineExceeded", rs[0])
	}
}

// By default a module handles one event at a time, in queue order.
func queueOrder(t *testing.T, h Host) {
	w := h.Load(t, "worker", ModuleConfig{})
	var ids []string
	for i := range 20 {
		ids = append(ids, h.Emit(t, "mesh.work.seq", body(i, conformance.Steer{})))
	}
	rs := w.WaitKind(t, "attempt", 20)
	for i, r := range rs {
		if r.ID != ids[i] {
			t.Fatalf("handled %d-th: %s, want %s (queue order)", i, r.ID, ids[i])
		}
	}
}

// A module whose concurrency is N runs N handler calls at once: N events
// that each wait for N calls to be running all succeed.
func concurrencyTogether(t *testing.T, h Host) {
	const n = 4
	w := h.Load(t, "worker", ModuleConfig{Concurrency: n, MaxAttempts: 1})
	for i := range n {
		h.Emit(t, "mesh.work.together", body(i, conformance.Steer{Together: n}))
	}
	for _, r := range w.WaitKind(t, "together", n) {
		if r.Err != "" {
			t.Errorf("event %s: %s", r.ID, r.Err)
		}
	}
}

// An event whose id the module handled is not handled again, unless its
// handler allows duplicates.
func duplicates(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	once := h.Emit(t, "mesh.once.x", map[string]int{"n": 1})
	dup := h.Emit(t, "mesh.dup.x", map[string]int{"n": 2})
	w.WaitKind(t, "seen", 2)
	h.Redeliver(t, once, "mesh.once.x", map[string]int{"n": 1})
	h.Redeliver(t, dup, "mesh.dup.x", map[string]int{"n": 2})
	marker := h.Emit(t, "mesh.once.marker", map[string]int{"n": 3}) // queued after both copies
	rs := w.Wait(t, "the marker", func(rs []conformance.Record) bool {
		return slices.ContainsFunc(rs, func(r conformance.Record) bool { return r.ID == marker })
	})
	count := func(id string) (n int) {
		for _, r := range rs {
			if r.ID == id {
				n++
			}
		}
		return n
	}
	if count(once) != 1 || count(dup) != 2 {
		t.Errorf("handled %d and %d times, want 1 (de-duplicated) and 2 (duplicates allowed)", count(once), count(dup))
	}
}

// A copy of a handled event's id with another body is neither handled nor
// dropped as a duplicate: it is dead-lettered with reason conflict, naming
// both digests. A handler that allows duplicates runs it.
func conflicts(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	once := h.Emit(t, "mesh.once.x", map[string]int{"n": 1})
	dup := h.Emit(t, "mesh.dup.x", map[string]int{"n": 2})
	w.WaitKind(t, "seen", 2)
	h.Redeliver(t, once, "mesh.once.x", map[string]int{"n": 99})
	h.Redeliver(t, dup, "mesh.dup.x", map[string]int{"n": 98})
	dead := h.Dead(t, 1)
	if d := dead[0]; d.ID != once || d.Reason != "conflict" || d.Queue != "conf.watcher.events" || !strings.Contains(d.Err, "this copy's digest is") {
		t.Errorf("dead letter %+v, want %s dead-lettered as a conflict by the watcher", d, once)
	}
	marker := h.Emit(t, "mesh.once.marker", map[string]int{"n": 3}) // queued after both copies
	rs := w.Wait(t, "the marker", func(rs []conformance.Record) bool {
		return slices.ContainsFunc(rs, func(r conformance.Record) bool { return r.ID == marker })
	})
	var onceBodies, dupBodies []string
	for _, r := range rs {
		switch r.ID {
		case once:
			onceBodies = append(onceBodies, string(r.Body))
		case dup:
			dupBodies = append(dupBodies, string(r.Body))
		}
	}
	if !slices.Equal(onceBodies, []string{`{"n":1}`}) || !slices.Equal(dupBodies, []string{`{"n":2}`, `{"n":98}`}) {
		t.Errorf("handled %q and %q, want only the first body de-duplicated, and both allowing duplicates", onceBodies, dupBodies)
	}
}

// What a handler emits carries the handled event's id as its causation,
// and an id derived from it: a valid ULID with the handled event's time.
func causationAndDerivedIDs(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	r := h.Load(t, "relay", ModuleConfig{})
	id := h.Emit(t, "mesh.relay.go", body(1, conformance.Steer{}))
	rs := w.WaitKind(t, "seen", 2)
	relayed := rs[0]
	if relayed.Type != "module.relay.relayed" || relayed.CausationID != id || relayed.Source != "relay" {
		t.Errorf("relayed %+v, want module.relay.relayed caused by %s", relayed, id)
	}
	if relayed.ID[:10] != id[:10] {
		t.Errorf("derived id %s does not carry the time of the handled event %s", relayed.ID, id)
	}
	if emitted := r.Of(t, "relayed"); len(emitted) != 1 || emitted[0].ID != relayed.ID {
		t.Errorf("Emit returned %+v, the watcher saw %s", emitted, relayed.ID)
	}
}

// A handler that emits and then fails emits the same id on its retry:
// the consumer handles the event once.
func retriedEmitAbsorbed(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	r := h.Load(t, "relay", ModuleConfig{})
	h.Emit(t, "mesh.relay.go", body(1, conformance.Steer{Fail: 1}))
	rs := relayDone(t, w)
	emitted := r.Of(t, "relayed")
	if len(emitted) != 2 || emitted[0].ID != emitted[1].ID || emitted[0].Attempt != 1 || emitted[1].Attempt != 2 {
		t.Fatalf("the relay emitted %+v, want the same id on attempts 1 and 2", emitted)
	}
	n := countType(rs, "module.relay.relayed")
	if n != 1 {
		t.Errorf("the watcher handled the relayed event %d times, want 1", n)
	}
}

// A retry that emits a different body emits a different id: both events
// are handled, nothing is lost to a collision.
func retryWithOtherBody(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	r := h.Load(t, "relay", ModuleConfig{})
	h.Emit(t, "mesh.relay.go", body(1, conformance.Steer{Fail: 1, Vary: true}))
	rs := relayDone(t, w)
	emitted := r.Of(t, "relayed")
	if len(emitted) != 2 || emitted[0].ID == emitted[1].ID {
		t.Fatalf("the relay emitted %+v, want two ids", emitted)
	}
	n := countType(rs, "module.relay.relayed")
	if n != 2 {
		t.Errorf("the watcher handled %d relayed events, want 2", n)
	}
}

// relayDone waits until the watcher saw the relay's "done", which the
// relay emits after its handler's last attempt, and returns what it saw.
func relayDone(t *testing.T, watcher *Log) []conformance.Record {
	t.Helper()
	return watcher.Wait(t, "done", func(rs []conformance.Record) bool {
		return slices.ContainsFunc(rs, func(r conformance.Record) bool { return r.Type == "module.relay.done" })
	})
}

// countType counts the records of events of type eventType.
func countType(rs []conformance.Record, eventType string) (n int) {
	for _, r := range rs {
		if r.Type == eventType {
			n++
		}
	}
	return n
}

// WithFreshID gives each attempt's emit its own id.
func freshID(t *testing.T, h Host) {
	h.Load(t, "watcher", ModuleConfig{})
	r := h.Load(t, "relay", ModuleConfig{})
	h.Emit(t, "mesh.relay.go", body(1, conformance.Steer{Fail: 1, Fresh: true}))
	emitted := r.WaitKind(t, "relayed", 2)
	if emitted[0].ID == emitted[1].ID || emitted[0].ID == "" {
		t.Errorf("fresh ids %s and %s", emitted[0].ID, emitted[1].ID)
	}
}

// A call to a tool nobody serves fails with ErrNoServer; a tool's
// outcome reaches the caller as a response or a *ToolError with its code
// and permanence.
func toolOutcomes(t *testing.T, h Host) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Call(ctx, "conf.nobody", 1, nil); !errors.Is(err, sdk.ErrNoServer) {
		t.Errorf("call to nobody: %v, want ErrNoServer", err)
	}
	h.Load(t, "tools", ModuleConfig{})
	var resp struct {
		N      int    `json:"n"`
		Caller string `json:"caller"`
	}
	if err := h.Call(ctx, "conf.echo", body(7, conformance.Steer{}), &resp); err != nil || resp.N != 7 || resp.Caller != "conformance" {
		t.Errorf("echo: %+v %v", resp, err)
	}
	for _, c := range []struct {
		steer     conformance.Steer
		code      string
		permanent bool
	}{
		{conformance.Steer{Permanent: true}, "rejected", true},
		{conformance.Steer{Fail: 1}, "failed", false},
		{conformance.Steer{Panic: true}, "internal", true},
		{conformance.Steer{Code: "out_of_stock"}, "out_of_stock", true},
	} {
		err := h.Call(ctx, "conf.echo", c.steer, nil)
		var te *sdk.ToolError
		if !errors.As(err, &te) || te.Code != c.code || te.Permanent != c.permanent || errors.Is(err, sdk.ErrPermanent) != c.permanent {
			t.Errorf("%+v: %v, want a ToolError %s (permanent %v)", c.steer, err, c.code, c.permanent)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if err := h.Call(short, "conf.echo", conformance.Steer{Block: true}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call past its deadline: %v, want context.DeadlineExceeded", err)
	}
}

// A handler that calls a tool and then fails calls it again on its retry
// with the same request id: the server answers from its stored answer,
// the tool ran once, the caller got the same answer both times. A retry
// that sends another request runs the tool again.
func retriedCallRunsToolOnce(t *testing.T, h Host) {
	tools := h.Load(t, "tools", ModuleConfig{})
	c := h.Load(t, "caller", ModuleConfig{})
	h.Emit(t, "mesh.order.placed", body(1, conformance.Steer{Fail: 1}))
	answers := c.WaitKind(t, "invoice", 2)
	if answers[0].Err != "" || string(answers[0].Body) != string(answers[1].Body) {
		t.Errorf("answers %s / %s (%s), want the same answer twice", answers[0].Body, answers[1].Body, answers[1].Err)
	}
	h.Emit(t, "mesh.order.placed", body(2, conformance.Steer{Fail: 1, Vary: true}))
	answers = c.WaitKind(t, "invoice", 4)
	if string(answers[2].Body) == string(answers[3].Body) {
		t.Errorf("a retry with another request got the stored answer %s", answers[3].Body)
	}
	if runs := tools.Of(t, "invoice_run"); len(runs) != 3 {
		t.Errorf("the tool ran %d times, want 3 (once, then twice for two different requests): %+v", len(runs), runs)
	}
	var got struct{ Invoice int }
	if err := json.Unmarshal(answers[0].Body, &got); err != nil || got.Invoice != 1 {
		t.Errorf("first answer %s", answers[0].Body)
	}
}

// A call whose ctx has no deadline gets the node's call timeout, not one
// of its own: the server sees at most that much time left.
func callDefaultDeadline(t *testing.T, h Host) {
	tools := h.Load(t, "tools", ModuleConfig{})
	c := h.Load(t, "caller", ModuleConfig{})
	r := c.WaitKind(t, "default_deadline", 1)[0]
	if !is(r, "deadline") {
		t.Errorf("a call without a deadline to a tool that never answers: %+v, want DeadlineExceeded", r)
	}
	for _, s := range tools.Of(t, "echo_block") {
		if s.Caller != "caller" {
			continue
		}
		if left, err := time.ParseDuration(s.Value); err != nil || left > callTimeout {
			t.Errorf("the server saw %s left, want at most the node's call timeout %v", s.Value, callTimeout)
		}
	}
}

// Run runs once the module consumes, and its ctx ends when the module
// stops.
func runCtxEndsAtStop(t *testing.T, h Host) {
	r := h.Load(t, "runner", ModuleConfig{})
	r.WaitKind(t, "run_started", 1)
	if len(r.Of(t, "run_ctx_done")) != 0 {
		t.Fatal("Run's ctx ended before the module stopped")
	}
	h.Stop(t, "runner")
	if rs := r.WaitKind(t, "run_ctx_done", 1); rs[0].Err != context.Canceled.Error() {
		t.Errorf("Run's ctx ended with %q, want %q", rs[0].Err, context.Canceled)
	}
}

// The ctx a handler, a tool handler and Run get carries a logger of the
// module (sdk.Logger) tagged with what is handled and its trace, the trace
// of the event or call, and, for handlers, a deadline within the handler
// timeout or the caller's.
func handlerContext(t *testing.T, h Host) {
	l := h.Load(t, "ctxprobe", ModuleConfig{ToolGrants: []string{"conf.*"}})
	run := l.WaitKind(t, "ctx_run", 1)[0]
	id, tid := h.EmitTraced(t, "mesh.ctx.x", map[string]int{})
	ev := l.WaitKind(t, "ctx_event", 1)[0]
	ctid := h.CallTraced(t, "conf.ctx", 1)
	tool := l.WaitKind(t, "ctx_tool", 1)[0]
	if !run.OwnLogger || run.Deadline != -1 {
		t.Errorf("Run's ctx: %+v, want a logger of its own and no deadline", run)
	}
	if ev.ID != id || ev.Trace != tid || !ev.OwnLogger || ev.Deadline <= 0 || ev.Deadline > handlerTimeout {
		t.Errorf("the handler's ctx: %+v, want trace %s, a logger, a deadline within %v", ev, tid, handlerTimeout)
	}
	if tool.Trace != ctid || !tool.OwnLogger || tool.Deadline <= 0 || tool.Deadline > callTimeout {
		t.Errorf("the tool handler's ctx: %+v, want trace %s, a logger, a deadline within %v", tool, ctid, callTimeout)
	}
	// What the module logged through sdk.Logger(ctx), tagged: a module
	// process's log lines come on their own pipe, after its records.
	line := func(msg string, with ...string) {
		t.Helper()
		logs, _ := h.WaitLogs(20*time.Second, func(logs string) bool { return strings.Contains(logs, msg) })
		for _, l := range strings.Split(logs, "\n") {
			if !strings.Contains(l, msg) {
				continue
			}
			for _, w := range with {
				if !strings.Contains(l, w) {
					t.Errorf("the log line %q does not say %q", l, w)
				}
			}
			return
		}
		t.Errorf("no log line says %q", msg)
	}
	line("ctxprobe runs", "module=ctxprobe")
	line("ctxprobe handled", "module=ctxprobe", "event_id="+id, "event_type=mesh.ctx.x", "trace_id="+tid)
	line("ctxprobe answered", "module=ctxprobe", "request_id="+tool.ID, "tool=conf.ctx", "caller=conformance", "trace_id="+ctid)
}

// Stopping a module lets its handlers in flight finish first; Run's ctx
// ends after them (a handler may use what Run keeps open).
func runCtxAfterDrain(t *testing.T, h Host) {
	d := h.Load(t, "drainer", ModuleConfig{})
	d.WaitKind(t, "run_started", 1)
	id := h.Emit(t, "mesh.drain.x", map[string]int{})
	d.WaitKind(t, "drain_started", 1)
	h.Stop(t, "drainer")
	d.WaitKind(t, "run_ctx_done", 1)
	rs := d.Records(t)
	done := slices.IndexFunc(rs, func(r conformance.Record) bool { return r.Kind == "drain_done" && r.ID == id })
	ended := slices.IndexFunc(rs, func(r conformance.Record) bool { return r.Kind == "run_ctx_done" })
	if done < 0 || done > ended || rs[done].Err != "" {
		t.Errorf("records %+v: want the handler done, its ctx alive, before Run's ctx ended", rs)
	}
}

// A Run that fails while the module runs is not a log line alone: the
// host stops the module (in-process, and meshtest, where its deliveries
// then wait) or starts its process again (under meshd), and says why.
func failingRun(t *testing.T, h Host) {
	f := h.Load(t, "failer", ModuleConfig{})
	f.WaitKind(t, "run_started", 1)
	h.Emit(t, "mesh.fail.now", map[string]int{})
	if report := h.Failed(t, "failer"); !strings.Contains(report, "run broke") {
		t.Errorf("the host's report %q does not say what Run returned", report)
	}
}

// An emit with sdk.After keeps its id and type and reaches its consumers
// once due, with x-due its time plus the delay (meshtest: once the clock
// got there, never at a Settle before); one with sdk.AtMostOnce is
// delivered like any other.
func delayedEmits(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	r := h.Load(t, "relay", ModuleConfig{})
	h.Emit(t, "mesh.relay.later", body(1, conformance.Steer{After: 1000}))
	relayed := r.WaitKind(t, "relayed", 1)
	if relayed[0].Err != "" {
		t.Fatalf("the delayed emit failed: %s", relayed[0].Err)
	}
	h.Settle()
	if n := countType(w.Records(t), "module.relay.relayed"); n != 0 && h.Clocked() {
		t.Fatalf("the watcher saw the delayed event before the clock reached it (%d)", n)
	}
	h.Advance(time.Second)
	seen := w.Wait(t, "the delayed event", func(rs []conformance.Record) bool { return countType(rs, "module.relay.relayed") == 1 })
	for _, s := range seen {
		if s.Type == "module.relay.relayed" && (s.ID != relayed[0].ID || s.Waited != time.Second || s.Source != "relay") {
			t.Errorf("the delayed event as seen: %+v; want id %s, due 1s after its time", s, relayed[0].ID)
		}
	}
	h.Emit(t, "mesh.relay.lossy", body(2, conformance.Steer{AtMostOnce: true}))
	w.Wait(t, "the event emitted at most once", func(rs []conformance.Record) bool {
		return slices.ContainsFunc(rs, func(r conformance.Record) bool {
			return r.Type == "module.relay.relayed" && r.Waited == 0 && strings.Contains(string(r.Body), `"n":2`)
		})
	})
}

// priceRefusals are what the refusal of each of the pricer's emits that
// breaks its declared schema says: the JSON pointer and the keyword.
var priceRefusals = map[string]string{
	"type":          "/price: type:",
	"required":      "/: required: missing property 'currency'",
	"minimum":       "/price: minimum:",
	"enum":          "/currency: enum:",
	"additional":    "/: additionalProperties: additional properties 'colour' not allowed",
	"pattern":       "/sku: pattern:",
	"other_version": `x-schema "1" asked for, but the module declares version 2 of module.pricer.price`,
}

// A module's declared schemas are the host's to check: an emit whose body
// breaks the current version is refused with ErrInvalid naming the JSON
// pointer and the keyword, as is one asking (WithSchema) for another
// version; a conforming one carries the version as x-schema. A handler
// that reads only other versions never gets it: it is dead-lettered with
// reason "schema", saying which versions the handler reads.
func schemasCheck(t *testing.T, h Host) {
	u := h.Load(t, "undertaker", ModuleConfig{})
	watch := h.Load(t, "pricewatch", ModuleConfig{})
	old := h.Load(t, "oldreader", ModuleConfig{})
	p := h.Load(t, "pricer", ModuleConfig{})
	ok := map[string]string{} // id → the emit's name
	for _, e := range conformance.PriceEmits {
		r := p.WaitKind(t, "price_"+e.Name, 1)[0]
		want, refused := priceRefusals[e.Name]
		switch {
		case !refused && (r.Err != "" || r.ID == ""):
			t.Errorf("the conforming emit %s was refused: %+v", e.Name, r)
		case !refused:
			ok[r.ID] = e.Name
		case !is(r, "invalid") || !strings.Contains(r.Err, want) || r.ID != "":
			t.Errorf("emit %s: %+v, want ErrInvalid saying %q", e.Name, r, want)
		}
	}
	for _, r := range watch.WaitKind(t, "priced", len(ok)) {
		if ok[r.ID] == "" || r.Schema != "2" || r.Type != "module.pricer.price" || r.Source != "pricer" {
			t.Errorf("seen %+v, want one of the conforming emits %v with x-schema 2", r, ok)
		}
	}
	dead := u.Wait(t, "the dead letters of the old reader", func(rs []conformance.Record) bool {
		n := 0
		for _, r := range rs {
			if ok[r.ID] != "" {
				n++
			}
		}
		return n >= len(ok)
	})
	for _, r := range dead {
		if ok[r.ID] == "" || r.DeadReason != "schema" || r.DeadQueue != "conf.oldreader.events" || r.DeadAttempts != 1 ||
			!strings.Contains(r.DeadError, `reads versions ["1"], the event has 2`) || !r.DeadTime || r.Type != "module.pricer.price" {
			t.Errorf("dead letter as handled %+v, want a conforming emit refused by the old reader with reason schema", r)
		}
	}
	for _, d := range h.Dead(t, len(ok)) {
		if ok[d.ID] == "" || d.Reason != "schema" || d.Queue != "conf.oldreader.events" || d.Attempts != 1 || d.Type != "module.pricer.price" {
			t.Errorf("dead letter %+v, want a conforming emit refused by the old reader with reason schema", d)
		}
	}
	if rs := old.Of(t, "old_read"); len(rs) != 0 {
		t.Errorf("the handler that reads version 1 got %+v", rs)
	}
}

// skip_body_validation keeps x-schema but validates no body: every emit
// goes out as version 2, the one asking for another version is refused.
func schemasSkipValidation(t *testing.T, h Host) {
	watch := h.Load(t, "pricewatch", ModuleConfig{})
	p := h.Load(t, "pricer", ModuleConfig{SkipBodyValidation: true})
	ok := map[string]bool{}
	for _, e := range conformance.PriceEmits {
		r := p.WaitKind(t, "price_"+e.Name, 1)[0]
		if e.Name == "other_version" {
			if !is(r, "invalid") || !strings.Contains(r.Err, priceRefusals[e.Name]) {
				t.Errorf("emit %s: %+v, want ErrInvalid saying %q", e.Name, r, priceRefusals[e.Name])
			}
			continue
		}
		if r.Err != "" || r.ID == "" {
			t.Errorf("emit %s with validation skipped: %+v", e.Name, r)
		}
		ok[r.ID] = true
	}
	for _, r := range watch.WaitKind(t, "priced", len(ok)) {
		if !ok[r.ID] || r.Schema != "2" {
			t.Errorf("seen %+v, want an emit of the pricer with x-schema 2", r)
		}
	}
}

// A served tool's declared schemas are the serving host's to check: a
// request that breaks the request schema is answered with a permanent
// ToolError invalid_request naming the pointer and the keyword, and the
// handler does not run; a response that breaks the response schema is
// not sent: the caller gets a permanent invalid_response, and the host
// logs a warning.
func toolSchemasCheck(t *testing.T, h Host) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := h.Load(t, "quoter", ModuleConfig{})
	var resp struct{ Total int }
	if err := h.Call(ctx, "conf.quote", conformance.Steer{N: 3}, &resp); err != nil || resp.Total != 3 {
		t.Errorf("a conforming call: %+v %v, want the total 3", resp, err)
	}
	for _, c := range []struct {
		name       string
		req        any
		code, says string
	}{
		{"request minimum", map[string]any{"n": 0}, "invalid_request", "request to conf.quote: body does not conform to its schema (version 1): /n: minimum:"},
		{"request type", map[string]any{"n": "three"}, "invalid_request", "/n: type:"},
		{"request required", conformance.Steer{}, "invalid_request", "/: required:"},
		{"request not an object", []int{1}, "invalid_request", "/: type:"},
		{"response minimum", conformance.Steer{N: 2, Negative: true}, "invalid_response", "response of conf.quote: body does not conform to its schema (version 1): /total: minimum:"},
	} {
		err := h.Call(ctx, "conf.quote", c.req, nil)
		var te *sdk.ToolError
		if !errors.As(err, &te) || te.Code != c.code || !te.Permanent || !errors.Is(err, sdk.ErrPermanent) || !strings.Contains(te.Message, c.says) {
			t.Errorf("%s: %v, want a permanent ToolError %s saying %q", c.name, err, c.code, c.says)
		}
	}
	if err := h.Call(ctx, "conf.quote", conformance.Steer{N: 4}, &resp); err != nil || resp.Total != 4 {
		t.Errorf("a conforming call after the refusals: %+v %v, want the total 4", resp, err)
	}
	var ran []string
	for _, r := range q.Of(t, "quote_run") {
		ran = append(ran, r.Value)
	}
	if !slices.Equal(ran, []string{"3", "2", "4"}) {
		t.Errorf("the handler ran for n %q, want 3, 2, 4: only for the requests that conform", ran)
	}
	if !strings.Contains(h.Logs(), "response not sent: it does not conform to the tool's schema") {
		t.Errorf("the host did not log the refused response:\n%s", h.Logs())
	}
}

// What a handler writes to its outbox with its change is published once
// the change commits, with the id the outbox gave it and the handled
// event as its cause; what a rolled-back change wrote never is; a
// handling that commits and then fails writes the same id again, and the
// event is published under it.
func outboxCommits(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	l := h.Load(t, "ledger", ModuleConfig{})
	book := map[int]string{}
	for _, s := range []conformance.Steer{{N: 1}, {N: 2, Rollback: true}, {N: 3, Fail: 1}, {N: 4, Fresh: true}, {N: 5}} {
		book[s.N] = h.Emit(t, "mesh.ledger.book", s)
	}
	rs := w.Wait(t, "the ledger's events of orders 1, 3, 4 and 5", func(rs []conformance.Record) bool {
		return countType(rs, "module.ledger.booked") >= 4
	})
	// Order 3's event is published once its first attempt commits, which
	// may be before its second attempt writes: wait for that write too.
	l.Wait(t, "order 3's second attempt's write", func(rs []conformance.Record) bool {
		n := 0
		for _, r := range rs {
			if r.Kind == "written" && r.Value == "3" {
				n++
			}
		}
		return n >= 2
	})
	written := map[string][]conformance.Record{}
	for _, r := range l.Of(t, "written") {
		if r.Err != "" {
			t.Errorf("the ledger's write of order %s failed: %s", r.Value, r.Err)
		}
		written[r.Value] = append(written[r.Value], r)
	}
	if w3 := written["3"]; len(w3) != 2 || w3[0].ID != w3[1].ID {
		t.Errorf("order 3's two attempts wrote %+v, want one id twice", w3)
	}
	for _, r := range rs {
		if r.Type != "module.ledger.booked" {
			continue
		}
		var b struct{ N int }
		_ = json.Unmarshal(r.Body, &b)
		n := strconv.Itoa(b.N)
		switch {
		case b.N == 2:
			t.Errorf("order 2 was rolled back, and its event %s was published", r.ID)
		case len(written[n]) == 0 || written[n][0].ID != r.ID:
			t.Errorf("published %s for order %d; the outbox gave it %+v", r.ID, b.N, written[n])
		case r.CausationID != book[b.N] || r.Source != "ledger":
			t.Errorf("order %d's event %+v, want caused by %s, from ledger", b.N, r, book[b.N])
		}
	}
	if n := countType(rs, "module.ledger.booked"); n != 4 {
		t.Errorf("the watcher saw %d of the ledger's events, want 4", n)
	}
}

// A handler through the inbox whose first attempt fails after its effect
// has it rolled back with its event: the retry applies it once and its
// event is published once; the same event delivered again is
// acknowledged without running.
func inboxOnce(t *testing.T, h Host) {
	w := h.Load(t, "watcher", ModuleConfig{})
	l := h.Load(t, "ledger", ModuleConfig{})
	pay := h.Emit(t, "mesh.ledger.pay", conformance.Steer{N: 7, Fail: 1})
	paid := l.WaitKind(t, "paid", 1)
	if paid[0].ID != pay || paid[0].Attempt != 2 || paid[0].Value != "1" {
		t.Errorf("paid %+v, want payment 7 applied once, on attempt 2", paid[0])
	}
	rs := w.Wait(t, "the payment's event", func(rs []conformance.Record) bool {
		return countType(rs, "module.ledger.booked") >= 1
	})
	h.Redeliver(t, pay, "mesh.ledger.pay", conformance.Steer{N: 7, Fail: 1})
	marker := h.Emit(t, "mesh.ledger.pay", conformance.Steer{N: 8}) // queued after the copy
	paid = l.Wait(t, "the marker's payment", func(rs []conformance.Record) bool {
		return slices.ContainsFunc(rs, func(r conformance.Record) bool { return r.Kind == "paid" && r.ID == marker })
	})
	if got := l.Of(t, "paid"); len(got) != 2 {
		t.Errorf("paid %+v, want payments 7 and 8 once each (the copy of 7 not run)", got)
	}
	rs = w.Wait(t, "the marker's event", func(rs []conformance.Record) bool {
		return countType(rs, "module.ledger.booked") >= 2
	})
	if n := countType(rs, "module.ledger.booked"); n != 2 || rs[0].CausationID != pay {
		t.Errorf("the watcher saw %d booked events (the first caused by %s), want 2, the first caused by %s", n, rs[0].CausationID, pay)
	}
}
