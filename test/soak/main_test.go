//go:build soak

package soak

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshkit/mesh/internal/clustertest"
)

// cluster is the soak's own three-node cluster (scripts/cluster.sh), beside
// the failover tests' one: its own node names, ports and data dir, so the
// two never meet.
var cluster = clustertest.Cluster{Name: "mesh-soak", Port: 5801, Dir: "/var/lib/rabbitmq/mesh-soak", Script: "../../scripts/cluster.sh"}

// TestMain starts the soak's cluster and removes it after the soak
// (SOAK_KEEP_CLUSTER=1 leaves it running, for repeated runs).
func TestMain(m *testing.M) {
	if out, err := cluster.Run("up"); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if os.Getenv("SOAK_KEEP_CLUSTER") == "" {
		if out, err := cluster.Run("down"); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}
