package sdk_test

import (
	"context"
	"errors"
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

func TestAllowDuplicatesIsSeenByTheHosts(t *testing.T) {
	h := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	if wire.AllowsDuplicates(h) || !wire.AllowsDuplicates(sdk.AllowDuplicates(h)) {
		t.Error("the hosts cannot tell a handler marked AllowDuplicates from another")
	}
}
