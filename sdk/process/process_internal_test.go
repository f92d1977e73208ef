package process

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// TestDescribeCarriesHandlerOptions: a module process tells the node the
// options of its handlers, by pattern, queue and tool index: which allow
// duplicates and which filters they have, for the node to apply.
func TestDescribeCarriesHandlerOptions(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	th := sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return nil, nil })
	s := &moduleServer{module: sdk.Module{Name: "m", Setup: func(m sdk.Mesh) error {
		for _, on := range []struct {
			pattern string
			opts    []sdk.HandlerOption
		}{{"mesh.a.#", nil}, {"mesh.b.#", []sdk.HandlerOption{sdk.AllowDuplicates()}}, {"mesh.c.#", []sdk.HandlerOption{sdk.Filter("source = 'x'")}},
			{"mesh.d.#", []sdk.HandlerOption{sdk.Filter("body.n > 1"), sdk.AllowDuplicates()}}} {
			if err := m.On(on.pattern, h, on.opts...); err != nil {
				return err
			}
		}
		return errors.Join(m.Consume("legacy", 1, h, sdk.Filter("header.x-kind = 'a'")), m.Consume("plain", 1, h),
			m.Serve("shop.buy", th), m.Serve("shop.sell", th, sdk.AllowDuplicates()))
	}}}
	desc, err := s.Describe(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := desc.DuplicatesAllowed; !slices.Equal(got, []uint32{1, 3}) {
		t.Errorf("duplicates allowed %v, want [1 3]", got)
	}
	if got := desc.Filters; !slices.Equal(got, []string{"", "", "source = 'x'", "body.n > 1"}) {
		t.Errorf("filters %q", got)
	}
	if desc.Consumes[0].Filter != "header.x-kind = 'a'" || desc.Consumes[1].Filter != "" {
		t.Errorf("consumes %v", desc.Consumes)
	}
	if got := desc.ToolsDuplicatesAllowed; !slices.Equal(got, []uint32{1}) {
		t.Errorf("tools with duplicates allowed %v, want [1]", got)
	}
	// Without a filter, no filters at all: the description stays as an
	// older module's.
	s = &moduleServer{module: sdk.Module{Name: "m", Setup: func(m sdk.Mesh) error { return m.On("mesh.a.#", h) }}}
	if desc, err := s.Describe(context.Background(), nil); err != nil || desc.Filters != nil {
		t.Errorf("filters %q, %v", desc.GetFilters(), err)
	}
}

// TestSetupRules: inside Setup, Emit and Call are refused with
// ErrNotStarted (they would wait for a start that comes only after Setup
// returns), a nil handler and a pattern subscribed twice with ErrInvalid,
// an ungranted tool with ErrForbidden; after Setup, On and Serve with
// ErrAlreadyStarted. The same rules hold in-process (test/conformance).
func TestSetupRules(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	th := sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return nil, nil })
	var got []error
	var mesh sdk.Mesh
	s := &moduleServer{toolGrants: []string{"shop.*"}, module: sdk.Module{Name: "m", Setup: func(m sdk.Mesh) error {
		mesh = m
		_, err := m.Emit(context.Background(), "x.y", 1)
		got = append(got, err, m.Call(context.Background(), "shop.buy", 1, nil),
			m.On("mesh.a.#", nil), m.On("mesh.a.#", h), m.On("mesh.a.#", h),
			m.Serve("shop.buy", th), m.Serve("bank.pay", th))
		return nil
	}}}
	if _, err := s.Describe(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	want := []error{wire.ErrNotStarted, wire.ErrNotStarted, sdk.ErrInvalid, nil, sdk.ErrInvalid, nil, sdk.ErrForbidden}
	for i, w := range want {
		if (w == nil) != (got[i] == nil) || (w != nil && !errors.Is(got[i], w)) {
			t.Errorf("call %d: %v, want %v", i, got[i], w)
		}
	}
	if err := mesh.On("mesh.b.#", h); !errors.Is(err, wire.ErrAlreadyStarted) || !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("On after Setup: %v, want ErrAlreadyStarted", err)
	}
	if err := mesh.Serve("shop.sell", th); !errors.Is(err, wire.ErrAlreadyStarted) || !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("Serve after Setup: %v, want ErrAlreadyStarted", err)
	}
}

// TestSettings: a module's settings come from the environment meshd sets,
// strictly decoded; none leaves the value as it was.
func TestSettings(t *testing.T) {
	type cfg struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	c := cfg{Name: "default"}
	t.Setenv(plugin.EnvSettings, "")
	if err := Settings(&c); err != nil || c.Name != "default" {
		t.Errorf("no settings: %+v, %v", c, err)
	}
	t.Setenv(plugin.EnvSettings, `{"name":"agent","count":3}`)
	if err := Settings(&c); err != nil || c != (cfg{"agent", 3}) {
		t.Errorf("settings: %+v, %v", c, err)
	}
	t.Setenv(plugin.EnvSettings, `{"nmae":"typo"}`)
	if err := Settings(&c); err == nil || !strings.Contains(err.Error(), "nmae") {
		t.Errorf("an unknown field: %v", err)
	}
}

// TestErrorOfKeepsTheHostsWords: an error the host reported matches its
// sentinel, and says what the host said once, without repeating the
// sentinel's words it already has.
func TestErrorOfKeepsTheHostsWords(t *testing.T) {
	for _, tc := range []struct {
		kind     pb.ErrorKind
		msg      string
		sentinel error
		want     string
	}{
		{pb.ErrorKind_NO_SERVER, "call tax.rate: no server for this tool", sdk.ErrNoServer, "call tax.rate: no server for this tool"},
		{pb.ErrorKind_NO_SERVER, "call tax.rate", sdk.ErrNoServer, "call tax.rate: no server for this tool"},
		{pb.ErrorKind_FORBIDDEN, "emit x: not declared", sdk.ErrForbidden, "emit x: not declared: " + sdk.ErrForbidden.Error()},
	} {
		err := errorOf(tc.kind, tc.msg)
		if !errors.Is(err, tc.sentinel) || err.Error() != tc.want {
			t.Errorf("errorOf(%v, %q) = %q (is %v: %v), want %q", tc.kind, tc.msg, err, tc.sentinel, errors.Is(err, tc.sentinel), tc.want)
		}
	}
	if err := errorOf(pb.ErrorKind_NONE, "x"); err != nil {
		t.Errorf("NONE gives %v", err)
	}
}

// TestHandlerPoolRunsEachAtOnceAndEnds: every delivery handed to the pool
// runs at once, on a goroutine of its own (eight that each wait for all
// eight to have started would never finish otherwise), exactly once; a
// second round runs as well on the goroutines left free or new ones; and
// every goroutine ends once done closes.
func TestHandlerPoolRunsEachAtOnceAndEnds(t *testing.T) {
	const n = 8
	done := make(chan struct{})
	var mu sync.Mutex
	seen := map[uint64]int{}
	var started sync.WaitGroup
	finished := make(chan uint64, 2*n)
	pool := newHandlerPool(done, func(d *pb.Delivery) {
		mu.Lock()
		seen[d.Seq]++
		mu.Unlock()
		started.Done()
		started.Wait() // all of this round's deliveries run together
		finished <- d.Seq
	})
	for round := range 2 {
		started.Add(n)
		for i := range n {
			pool.run(&pb.Delivery{Seq: uint64(round*n + i)})
		}
		for range n {
			select {
			case <-finished:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the deliveries did not all run at once", round)
			}
		}
	}
	close(done)
	pool.loops.Wait()
	for seq := range uint64(2 * n) {
		if seen[seq] != 1 {
			t.Errorf("delivery %d handled %d times", seq, seen[seq])
		}
	}
}

// TestEmitBatchesGoWhenEveryHandlerWaits: a batch of emits goes at once
// when none is queued and every delivery being handled waits for an
// emit's answer; while a handler still runs (it may emit), or an emit is
// queued, the batch waits for more.
func TestEmitBatchesGoWhenEveryHandlerWaits(t *testing.T) {
	s := &moduleServer{emits: make(chan emitRequest, 4)}
	if !s.flushEmits() {
		t.Error("no handler runs and nothing is queued: the batch should go")
	}
	s.handling.Store(2)
	s.emitting.Store(1)
	if s.flushEmits() {
		t.Error("a handler still runs and may emit: the batch should wait")
	}
	s.emitting.Store(2)
	if !s.flushEmits() {
		t.Error("both handlers wait for their emits: the batch should go")
	}
	s.emits <- emitRequest{}
	if s.flushEmits() {
		t.Error("an emit is queued: the batch should take it first")
	}
}
