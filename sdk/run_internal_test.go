package sdk

import (
	"context"
	"slices"
	"testing"
)

// TestDescribeMarksDuplicatesAllowed: a module process tells the node which
// of its handlers are marked AllowDuplicates, by pattern index.
func TestDescribeMarksDuplicatesAllowed(t *testing.T) {
	h := HandlerFunc(func(context.Context, Event) error { return nil })
	s := &moduleServer{module: Module{Name: "m", Setup: func(m Mesh) error {
		for _, on := range []struct {
			pattern string
			h       Handler
		}{{"mesh.a.#", h}, {"mesh.b.#", AllowDuplicates(h)}, {"mesh.c.#", h}, {"mesh.d.#", AllowDuplicates(h)}} {
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
	if DuplicatesAllowed(h) || !DuplicatesAllowed(AllowDuplicates(h)) {
		t.Error("DuplicatesAllowed does not tell marked handlers from others")
	}
}
