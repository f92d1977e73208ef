//go:build soak

package soak

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/meshkit/mesh/internal/clustertest"
)

// cluster is the soak's own three-node cluster (scripts/cluster.sh), beside
// the failover tests' one: its own node names, ports and data dir, so the
// two never meet. SOAK_CLUSTER_NAME and SOAK_CLUSTER_PORT give a long run
// a cluster of its own beside make test's soak.
var cluster = soakCluster()

func soakCluster() clustertest.Cluster {
	c := clustertest.Cluster{Name: "mesh-soak", Port: 5801, Script: "../../scripts/cluster.sh"}
	if s := os.Getenv("SOAK_CLUSTER_NAME"); s != "" {
		c.Name = s
	}
	if p, err := strconv.Atoi(os.Getenv("SOAK_CLUSTER_PORT")); err == nil {
		c.Port = p
	}
	c.Dir = "/var/lib/rabbitmq/" + c.Name
	return c
}

// TestMain starts the soak's cluster and removes it after the soak
// (SOAK_KEEP_CLUSTER=1 leaves it running, for repeated runs).
func TestMain(m *testing.M) {
	if out, err := cluster.Run("up"); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	for _, f := range failures.list {
		fmt.Printf("soak failure: %s\n", f)
	}
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
