package process

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/sdk"
)

// TestDescribeMarksDuplicatesAllowed: a module process tells the node which
// of its handlers are marked AllowDuplicates, by pattern index.
func TestDescribeMarksDuplicatesAllowed(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	s := &moduleServer{module: sdk.Module{Name: "m", Setup: func(m sdk.Mesh) error {
		for _, on := range []struct {
			pattern string
			h       sdk.Handler
		}{{"mesh.a.#", h}, {"mesh.b.#", sdk.AllowDuplicates(h)}, {"mesh.c.#", h}, {"mesh.d.#", sdk.AllowDuplicates(h)}} {
			if err := m.On(on.pattern, on.h); err != nil {
				return err
			}
		}
		return nil
	}}}
	desc, err := s.Describe(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := desc.DuplicatesAllowed; !slices.Equal(got, []uint32{1, 3}) {
		t.Errorf("duplicates allowed %v, want [1 3]", got)
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
	want := []error{sdk.ErrNotStarted, sdk.ErrNotStarted, sdk.ErrInvalid, nil, sdk.ErrInvalid, nil, sdk.ErrForbidden}
	for i, w := range want {
		if (w == nil) != (got[i] == nil) || (w != nil && !errors.Is(got[i], w)) {
			t.Errorf("call %d: %v, want %v", i, got[i], w)
		}
	}
	if err := mesh.On("mesh.b.#", h); !errors.Is(err, sdk.ErrAlreadyStarted) {
		t.Errorf("On after Setup: %v, want ErrAlreadyStarted", err)
	}
	if err := mesh.Serve("shop.sell", th); !errors.Is(err, sdk.ErrAlreadyStarted) {
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
