package sdk_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

func TestPermanent(t *testing.T) {
	if sdk.Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
	base := errors.New("x")
	if errors.Is(base, sdk.ErrPermanent) {
		t.Error("plain error is permanent")
	}
	wrapped := errors.Join(errors.New("context"), sdk.Permanent(base))
	if !errors.Is(wrapped, sdk.ErrPermanent) || !errors.Is(wrapped, base) {
		t.Error("wrapping lost the permanent mark or the cause")
	}
}

func TestEmitOptionsRefuseBadValues(t *testing.T) {
	for name, opt := range map[string]sdk.EmitOption{
		"empty schema":  sdk.WithSchema(""),
		"ttl under 1ms": sdk.WithTTL(time.Microsecond),
		"priority 10":   sdk.WithPriority(10),
	} {
		if _, err := wire.ApplyEmitOptions([]sdk.EmitOption{opt}); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	o, err := wire.ApplyEmitOptions([]sdk.EmitOption{nil, sdk.WithTTL(time.Second), sdk.WithFreshID(), sdk.WithPriority(3)})
	if err != nil || o.TTL != time.Second || !o.FreshID || o.Priority != 3 || !o.HasPriority {
		t.Errorf("options %+v %v", o, err)
	}
}

// TestHandlerOptions: the hosts read what the options say; a bad filter and
// a value that is not an sdk option are refused with ErrInvalid.
func TestHandlerOptions(t *testing.T) {
	o, err := wire.ApplyHandlerOptions([]sdk.HandlerOption{nil, sdk.AllowDuplicates(), sdk.Filter("source = 'a'")})
	if err != nil || !o.AllowDuplicates || o.Filter.String() != "source = 'a'" {
		t.Errorf("options %+v %v", o, err)
	}
	if _, err := wire.ApplyHandlerOptions([]sdk.HandlerOption{sdk.Filter("total > 3")}); !errors.Is(err, sdk.ErrInvalid) ||
		!strings.Contains(err.Error(), "did you mean body.total") {
		t.Errorf("bad filter: %v", err)
	}
	if _, err := wire.ApplyHandlerOptions([]sdk.HandlerOption{sdk.Filter("source = 'a'"), sdk.Filter("node = 'b'")}); !errors.Is(err, sdk.ErrInvalid) ||
		!strings.Contains(err.Error(), "joined with and") {
		t.Errorf("two filters: %v", err)
	}
	if _, err := wire.ApplyHandlerOptions([]any{"allow"}); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("a string as an option: %v", err)
	}
}

// TestTransientErrors: each kind of transient error the hosts return is
// ErrTransient to a module, and says which it is.
func TestTransientErrors(t *testing.T) {
	for err, says := range map[error]string{
		wire.ErrRefused: "refused by the broker", wire.ErrConnectionLost: "connection lost", wire.ErrBackPressure: "back-pressure",
	} {
		wrapped := fmt.Errorf("emit x: %w", err)
		if !errors.Is(wrapped, sdk.ErrTransient) || errors.Is(wrapped, sdk.ErrPermanent) || errors.Is(wrapped, sdk.ErrInvalid) ||
			!strings.Contains(wrapped.Error(), says) {
			t.Errorf("%v: not ErrTransient alone, or does not say %q", wrapped, says)
		}
	}
}
