package setup

import (
	"errors"
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

// TestRecorder: the rules of On and Serve, in order: bad keys, nil
// handlers, repeats and ungranted tools refused with their sentinel, and
// everything refused once fixed; what was recorded comes back in order.
func TestRecorder(t *testing.T) {
	r := New("m", []string{"shop.*"})
	h := func() {}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"on", r.On("mesh.a.#", h, wire.HandlerOptions{}, nil), nil},
		{"on bad pattern", r.On("mesh..a", h, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"on nil", r.On("mesh.b.#", nil, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"on again", r.On("mesh.a.#", h, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"on second", r.On("mesh.b.#", h, wire.HandlerOptions{}, nil), nil},
		{"serve", r.Serve("shop.buy", h, wire.HandlerOptions{}, nil), nil},
		{"serve bad key", r.Serve("shop..buy", h, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"serve nil", r.Serve("shop.sell", nil, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"serve again", r.Serve("shop.buy", h, wire.HandlerOptions{}, nil), wire.ErrInvalid},
		{"serve ungranted", r.Serve("bank.pay", h, wire.HandlerOptions{}, nil), wire.ErrForbidden},
	} {
		if (c.want == nil) != (c.err == nil) || (c.want != nil && !errors.Is(c.err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	for _, c := range []struct {
		name  string
		queue string
		n     int
		h     any
		want  error
	}{
		{"consume", "legacy.orders", 4, h, nil},
		{"consume again", "legacy.orders", 4, h, wire.ErrInvalid},
		{"consume bad name", "legacy orders", 4, h, wire.ErrInvalid},
		{"consume no prefetch", "other", 0, h, wire.ErrInvalid},
		{"consume big prefetch", "other", MaxConsumePrefetch + 1, h, wire.ErrInvalid},
		{"consume nil", "other", 1, nil, wire.ErrInvalid},
	} {
		if err := r.Consume(c.queue, c.n, c.h, wire.HandlerOptions{}, nil); (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	subs, tools := r.Fix()
	if q := r.Consumed(); len(q) != 1 || q[0].Key != "legacy.orders" || q[0].Prefetch != 4 {
		t.Errorf("consumed %+v", q)
	}
	if err := r.Consume("late", 1, h, wire.HandlerOptions{}, nil); !errors.Is(err, wire.ErrAlreadyStarted) {
		t.Errorf("consume after fix: %v", err)
	}
	if len(subs) != 2 || subs[0].Key != "mesh.a.#" || subs[1].Key != "mesh.b.#" || len(tools) != 1 || tools[0].Key != "shop.buy" {
		t.Errorf("recorded %+v %+v", subs, tools)
	}
	if err := r.On("mesh.c.#", h, wire.HandlerOptions{}, nil); !errors.Is(err, wire.ErrAlreadyStarted) {
		t.Errorf("on after fix: %v", err)
	}
	if err := r.Serve("shop.sell", h, wire.HandlerOptions{}, nil); !errors.Is(err, wire.ErrAlreadyStarted) {
		t.Errorf("serve after fix: %v", err)
	}
	if err := New("m", nil).Serve("anything.at.all", h, wire.HandlerOptions{}, nil); err != nil {
		t.Errorf("nil grants limited a tool: %v", err)
	}
}
