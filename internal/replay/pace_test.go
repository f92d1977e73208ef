package replay

import (
	"context"
	"testing"
	"time"
)

// fakeClock advances only when the pacer sleeps, plus work per send.
type fakeClock struct {
	now  time.Time
	work time.Duration // time each send takes
}

func (c *fakeClock) sleep(_ context.Context, d time.Duration) error { c.now = c.now.Add(d); return nil }

// sends paces events emitted at the given offsets and returns the offsets
// of their sends from the first.
func sends(t *testing.T, pace Pace, work time.Duration, emitted ...time.Duration) []time.Duration {
	t.Helper()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := &fakeClock{now: t0.Add(time.Hour), work: work}
	pc := pacer{pace: pace, sleep: c.sleep, now: func() time.Time { return c.now }}
	var out []time.Duration
	var first time.Time
	for _, e := range emitted {
		at, err := pc.wait(context.Background(), Event{Time: t0.Add(e)})
		if err != nil {
			t.Fatal(err)
		}
		if first.IsZero() {
			first = at
		}
		out = append(out, at.Sub(first))
		c.now = c.now.Add(c.work)
	}
	return out
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

const ms = time.Millisecond

// TestPace: each pace sends at the times it promises, on a clock that
// moves only when the replay waits (and by the time a send takes).
func TestPace(t *testing.T) {
	emitted := []time.Duration{0, 100 * ms, 300 * ms, 250 * ms, 1000 * ms} // one arrived out of emit order
	cases := []struct {
		name string
		pace Pace
		work time.Duration
		want []time.Duration
	}{
		{"as fast as confirmed", Pace{}, 0, []time.Duration{0, 0, 0, 0, 0}},
		{"original spacing", Pace{Factor: 1}, 0, []time.Duration{0, 100 * ms, 300 * ms, 300 * ms, 1000 * ms}},
		{"original spacing despite slow sends", Pace{Factor: 1}, 10 * ms, []time.Duration{0, 100 * ms, 300 * ms, 310 * ms, 1000 * ms}},
		{"ten times faster", Pace{Factor: 10}, 0, []time.Duration{0, 10 * ms, 30 * ms, 30 * ms, 100 * ms}},
		{"fixed delay between sends", Pace{Delay: 50 * ms}, 10 * ms, []time.Duration{0, 50 * ms, 100 * ms, 150 * ms, 200 * ms}},
		{"a delay shorter than a send", Pace{Delay: 5 * ms}, 10 * ms, []time.Duration{0, 10 * ms, 20 * ms, 30 * ms, 40 * ms}},
		{"at most 20 a second", Pace{Rate: 20}, 10 * ms, []time.Duration{0, 50 * ms, 100 * ms, 150 * ms, 200 * ms}},
		{"a rate does not burst after slow sends", Pace{Rate: 20}, 80 * ms, []time.Duration{0, 80 * ms, 160 * ms, 240 * ms, 320 * ms}},
	}
	for _, c := range cases {
		if got := sends(t, c.pace, c.work, emitted...); !equal(got, c.want) {
			t.Errorf("%s: sent at %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPaceCheck(t *testing.T) {
	for _, p := range []Pace{{Factor: 1, Delay: ms}, {Rate: 1, Factor: 2}, {Factor: -1}, {Delay: -ms}, {Rate: -3}} {
		if err := p.Check(); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	for _, p := range []Pace{{}, {Factor: 0.5}, {Delay: ms}, {Rate: 100}} {
		if err := p.Check(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
}
