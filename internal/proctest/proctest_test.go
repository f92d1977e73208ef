package proctest_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/meshkit/mesh/internal/proctest"
)

// TestListFindsAChild: a process this test starts is listed with this
// process as its parent and its arguments.
func TestListFindsAChild(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, p := range proctest.List() {
		if p.PID == cmd.Process.Pid {
			if p.PPID != os.Getpid() || p.Cmdline != "sleep 30" || p.State == "Z" {
				t.Errorf("child listed as %+v, want parent %d and cmdline %q", p, os.Getpid(), "sleep 30")
			}
			return
		}
	}
	t.Fatalf("child %d not listed", cmd.Process.Pid)
}
