// Package modules_test holds the shipped modules to the layout (SPEC): a
// module imports the sdk and nothing else of mesh's, and no broker client.
package modules_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModulesStandOnTheSDK: the dispatcher and the agent, and the audit
// logger, import no mesh package but the sdk (their binaries add
// sdk/process) and what they share under modules/internal, and no broker
// client.
func TestModulesStandOnTheSDK(t *testing.T) {
	for _, pkg := range []string{"./agent", "./dispatcher", "./internal/settings", "../auditlogger", "../auditlogger/store"} {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, imp := range strings.Fields(string(out)) {
			mesh := strings.HasPrefix(imp, "github.com/meshkit/mesh/")
			own := imp == "github.com/meshkit/mesh/sdk" || imp == "github.com/meshkit/mesh/auditlogger/store" || strings.HasPrefix(imp, "github.com/meshkit/mesh/modules/internal/")
			if mesh && !own || strings.Contains(imp, "amqp091") {
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
}
