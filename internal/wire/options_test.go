package wire

import (
	"errors"
	"strings"
	"testing"
)

// TestHeaderBounds: a schema or a causation id out of bounds is refused,
// naming the bound, so that no event outgrows the broker's frame.
func TestHeaderBounds(t *testing.T) {
	for _, c := range []struct {
		o    EmitOptions
		want string
	}{
		{EmitOptions{Schema: strings.Repeat("v", MaxSchemaBytes+1)}, "over 128"},
		{EmitOptions{Schema: "1\n2"}, "control character"},
		{EmitOptions{CausationID: strings.Repeat("c", MaxCausationBytes+1)}, "over 255"},
	} {
		if err := c.o.Check(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrInvalid saying %q", c.o, err, c.want)
		}
	}
	ok := EmitOptions{Schema: strings.Repeat("v", MaxSchemaBytes), CausationID: strings.Repeat("c", MaxCausationBytes)}
	if err := ok.Check(); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}
