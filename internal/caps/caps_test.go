package caps_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/meshkit/mesh/internal/caps"
)

func TestSetHasAndMissing(t *testing.T) {
	s := caps.Set(1<<caps.SetUID | 1<<caps.SetGID)
	if !s.Has(caps.SetUID, caps.SetGID) || s.Has(caps.SetUID, caps.Kill) {
		t.Errorf("Has on %#x", uint64(s))
	}
	if got := s.Missing(caps.ForModuleUsers...); len(got) != 3 || got[0] != caps.Chown || got[1] != caps.DACOverride || got[2] != caps.Kill {
		t.Errorf("Missing = %v, want CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL", got)
	}
	if caps.SetUID.String() != "CAP_SETUID" || caps.Cap(40).String() != "capability 40" {
		t.Errorf("names: %s, %s", caps.SetUID, caps.Cap(40))
	}
}

// TestCurrent reads this process's sets: root holds CAP_SETUID and the
// others effective; any other user, none of them (the test does not run
// with file or ambient capabilities).
func TestCurrent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("capabilities are Linux's")
	}
	s, err := caps.Current()
	if err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	if got := s.Effective.Has(caps.ForModuleUsers...); got != root {
		t.Errorf("as uid %d, Effective %#x holds the module users' capabilities: %v", os.Geteuid(), uint64(s.Effective), got)
	}
	if s.Permitted&s.Effective != s.Effective {
		t.Errorf("Effective %#x is not within Permitted %#x", uint64(s.Effective), uint64(s.Permitted))
	}
}
