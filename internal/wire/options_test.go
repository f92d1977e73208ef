package wire

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/delay"
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
		{EmitOptions{Key: strings.Repeat("k", MaxKeyBytes+1), HasKey: true}, "over 256"},
		{EmitOptions{Key: "a\x00b", HasKey: true}, "control character"},
	} {
		if err := c.o.Check(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrInvalid saying %q", c.o, err, c.want)
		}
	}
	ok := EmitOptions{Schema: strings.Repeat("v", MaxSchemaBytes), CausationID: strings.Repeat("c", MaxCausationBytes), Key: strings.Repeat("k", MaxKeyBytes), HasKey: true}
	if err := ok.Check(); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}

// TestEmitTiming: Check refuses the timings no sdk option combination
// makes (as they arrive from a module process); Due and CheckDue read an
// emit's time against the emit's own clock.
func TestEmitTiming(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, o := range map[string]EmitOptions{
		"negative":        {After: -time.Second},
		"both":            {After: time.Second, At: now.Add(time.Hour)},
		"at most once":    {After: time.Second, AtMostOnce: true},
		"past the bound":  {After: delay.Max + time.Second},
		"at most once At": {At: now.Add(time.Hour), AtMostOnce: true},
	} {
		if err := o.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Check = %v, want ErrInvalid", name, err)
		}
	}
	for _, c := range []struct {
		o    EmitOptions
		want time.Time
	}{
		{EmitOptions{}, now},
		{EmitOptions{After: time.Minute}, now.Add(time.Minute)},
		{EmitOptions{At: now.Add(time.Hour)}, now.Add(time.Hour)},
		{EmitOptions{At: now.Add(-time.Hour)}, now}, // passed: now
	} {
		if got := c.o.Due(now); !got.Equal(c.want) {
			t.Errorf("Due of %+v = %v, want %v", c.o, got, c.want)
		}
	}
	if err := (EmitOptions{At: now.Add(delay.Max + time.Hour)}).CheckDue(now); !errors.Is(err, ErrInvalid) {
		t.Errorf("an At past the bound: %v", err)
	}
	if err := (EmitOptions{At: now.Add(delay.Max)}).CheckDue(now); err != nil {
		t.Errorf("an At at the bound: %v", err)
	}
}
