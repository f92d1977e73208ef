//go:build failover && !fault

package fault

import (
	"fmt"
	"os"
	"testing"
)

// TestMain starts the local three-node cluster (scripts/cluster.sh) for the
// failover tests and removes it after them. (Built with the failover tag
// alone: the fault tests use the default broker only.)
func TestMain(m *testing.M) {
	if out, err := cluster.Run("up"); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if out, err := cluster.Run("down"); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
