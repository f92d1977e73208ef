package plugin

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
)

// TestErrorKindsRoundTrip: every sentinel of the table crosses the
// protocol and is itself again on the other side, wrapped in the words it
// was sent with; an error wrapping two gets the first (an Emit during
// Setup is not started, and invalid).
func TestErrorKindsRoundTrip(t *testing.T) {
	for _, k := range errorKinds {
		sent := fmt.Errorf("emit x: %w", k.err)
		kind := KindOf(sent)
		if kind != k.kind {
			t.Errorf("%v: kind %v, want %v", sent, kind, k.kind)
		}
		got := ErrorOf(kind, sent.Error())
		if !errors.Is(got, k.err) || got.Error() != sent.Error() {
			t.Errorf("%v came back as %q, not wrapping %v", sent, got, k.err)
		}
	}
	if !errors.Is(ErrorOf(KindOf(wire.ErrNotStarted), "x"), wire.ErrInvalid) {
		t.Error("not started lost that it is invalid")
	}
	if KindOf(nil) != pb.ErrorKind_NONE || ErrorOf(pb.ErrorKind_NONE, "") != nil {
		t.Error("nil does not cross as nil")
	}
	if KindOf(errors.New("disk on fire")) != pb.ErrorKind_OTHER {
		t.Error("an error of no sentinel is not OTHER")
	}
	if got := ErrorOf(pb.ErrorKind_OTHER, "disk on fire"); got.Error() != "disk on fire" || errors.Is(got, wire.ErrInvalid) {
		t.Errorf("OTHER came back as %v", got)
	}
	if got := ErrorOf(pb.ErrorKind_UNROUTABLE, "no queue"); !errors.Is(got, wire.ErrRefused) || !errors.Is(got, wire.ErrTransient) {
		t.Errorf("UNROUTABLE came back as %v", got)
	}
	if got := ErrorOf(pb.ErrorKind_DEADLINE_EXCEEDED, "slow"); !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("a deadline came back as %v", got)
	}
}
