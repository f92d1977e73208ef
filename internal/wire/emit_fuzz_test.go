package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzEmitType: whatever a module asks to emit, EmitType either refuses
// it with ErrInvalid or ErrForbidden, or gives a valid event type that is
// in the module's namespace or matches one of its grants.
func FuzzEmitType(f *testing.F) {
	for _, s := range eventTypeSeeds {
		f.Add("umami", s, true, "mesh.#")
		f.Add("umami", s, false, "")
	}
	f.Add("umami", "site.created", false, "")
	f.Add("a.b", "x.y", false, "")
	f.Fuzz(func(t *testing.T, module, name string, full bool, grant string) {
		var grants []string
		if grant != "" {
			grants = []string{grant}
		}
		typ, err := EmitType(module, name, full, grants)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrForbidden) {
				t.Fatalf("EmitType(%q, %q, %v, %q) = %v, neither ErrInvalid nor ErrForbidden", module, name, full, grants, err)
			}
			return
		}
		if verr := ValidateEventType(typ); verr != nil {
			t.Fatalf("EmitType gave %q, which is not a valid event type: %v", typ, verr)
		}
		own := strings.HasPrefix(typ, "module."+module+".")
		if !own && !(full && grant != "" && MatchPattern(grant, typ)) {
			t.Fatalf("EmitType(%q, %q, %v, %q) = %q, outside the module and its grants", module, name, full, grants, typ)
		}
		if !full && typ != "module."+module+"."+name {
			t.Fatalf("relative %q of %q became %q", name, module, typ)
		}
	})
}

// FuzzEncodeBody: a body given as bytes is taken as it is when it is valid
// JSON within the limit, and refused with ErrInvalid otherwise.
func FuzzEncodeBody(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `"x"`, `[1,2`, ``, `null`, "\xff", `{"a":"` + strings.Repeat("x", 40) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const limit = 32
		raw, err := EncodeBody(json.RawMessage(body), limit)
		ok := json.Valid(body) && len(body) <= limit
		switch {
		case ok && (err != nil || string(raw) != string(body)):
			t.Fatalf("valid body %q: %q, %v", body, raw, err)
		case !ok && !errors.Is(err, ErrInvalid):
			t.Fatalf("body %q (%d bytes) accepted or refused without ErrInvalid: %v", body, len(body), err)
		}
	})
}

// TestEmitOptionsCheck: what a module process sends is held to the sdk's
// option bounds.
func TestEmitOptionsCheck(t *testing.T) {
	for _, o := range []EmitOptions{{HasPriority: true, Priority: 10}, {HasPriority: true, Priority: 255}, {TTL: -1}} {
		if err := o.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", o, err)
		}
	}
	if err := (EmitOptions{HasPriority: true, Priority: 9, TTL: 1}).Check(); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

// TestEmitsAreRelative: a full event type in a module's Emits is refused
// with the name to write instead (or, outside its namespace, with how to
// emit it); relative names pass, those whose first word is an origin too.
func TestEmitsAreRelative(t *testing.T) {
	for _, e := range [][]string{{"site.created"}, {"node.added"}, {"mesh"}, {"module.x"}} {
		if err := ValidateModule("shop", "", e, nil); err != nil {
			t.Errorf("emits %q: %v, want nil", e, err)
		}
	}
	for _, c := range []struct{ emit, want string }{
		{"module.shop.order.placed", `write "order.placed"`},
		{"module.billing.invoice.sent", "sdk.AsFullType()"},
		{"mesh.delivery.done", "emit_grants"},
	} {
		err := ValidateModule("shop", "", []string{c.emit}, nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "module.shop."+c.emit) {
			t.Errorf("emits %q: %v, want ErrInvalid naming module.shop.%s and %q", c.emit, err, c.emit, c.want)
		}
	}
}
