//go:build shipped

package shipped

import (
	"os"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/brokertest"
)

// TestTheUnitGivesModulesUsersOfTheirOwn (defect 3): meshd started as the
// release's unit starts it (asTheUnit: its capabilities, read from the
// file the package installs) runs the audit logger as a user of its own,
// confined, and does not warn that it cannot. With the unit's four
// capabilities of before, it ran every module as its own user, said so
// only at INFO, and a hostile module could reach another's TMPDIR
// (test/hostile has that attack).
func TestTheUnitGivesModulesUsersOfTheirOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root starts meshd as the unit does (another user, with capabilities)")
	}
	url := brokertest.VHost(t)
	n := startNode(t, url, uniqueName("unit"), "  - name: audit-logger\n    path: "+binary("modules/audit-logger")+"\n    tools: [\"audit.*\"]\n    dead_letters: [\"#\"]\n")
	log := n.log.String()
	var isolation string
	for line := range strings.Lines(log) {
		if strings.Contains(line, `"msg":"module isolation"`) {
			isolation = line
		}
	}
	if !strings.Contains(isolation, `"audit-logger":"its own user `) {
		t.Errorf("meshd as the unit does not run the audit logger as a user of its own: %s", isolation)
	}
	if strings.Contains(log, "cannot give its modules users of their own") {
		t.Errorf("meshd as the unit warns that it cannot give its modules users of their own:\n%s", log)
	}
}
