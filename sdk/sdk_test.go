package sdk_test

import (
	"errors"
	"testing"
	"time"

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
		"empty schema":    sdk.WithSchema(""),
		"empty causation": sdk.WithCausation(""),
		"ttl under 1ms":   sdk.WithTTL(time.Microsecond),
		"priority 10":     sdk.WithPriority(10),
	} {
		if _, err := sdk.ApplyEmitOptions(opt); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	o, err := sdk.ApplyEmitOptions(nil, sdk.WithTTL(time.Second), sdk.WithCausation("c"))
	if err != nil || o.TTL != time.Second || o.CausationID != "c" {
		t.Errorf("options %+v %v", o, err)
	}
}
