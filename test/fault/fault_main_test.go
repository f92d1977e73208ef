//go:build fault && !failover

package fault

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshkit/mesh/internal/clustertest"
)

// faultBroker is the fault tests' own broker: one private RabbitMQ node
// (scripts/cluster.sh with MESH_CLUSTER_SIZE=1) on 127.0.0.1:5711, with its
// own data dir. The tests stop and start its application, raise its memory
// alarm and change its settings; the user's broker on 5672 is never
// touched (make test checks it was not restarted).
var faultBroker = clustertest.Cluster{Name: "mesh-fault", Port: 5711, Dir: "/var/lib/rabbitmq/mesh-fault", Script: "../../scripts/cluster.sh", Nodes: 1}

// TestMain starts the private node, points brokertest (virtual hosts,
// rabbitmqctl) at it, runs the tests and removes the node.
func TestMain(m *testing.M) {
	if out, err := faultBroker.Run("up"); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
		os.Exit(1)
	}
	os.Setenv("MESH_TEST_AMQP_HOST", faultBroker.AMQPAddr(1))
	os.Setenv("MESH_TEST_RABBITMQ_NODE", faultBroker.NodeName(1))
	code := m.Run()
	if os.Getenv("MESH_KEEP_FAULT_BROKER") == "" {
		if out, err := faultBroker.Run("down"); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n%s", err, out)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}
