// Package clustertest drives a local three-node RabbitMQ cluster made by
// scripts/cluster.sh, for tests that need one: the failover tests and the
// nemesis soak. A Cluster names its nodes, ports and data dir, so two
// clusters (the failover tests' and the soak's) can run side by side.
package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Size is the number of nodes scripts/cluster.sh makes by default.
const Size = 3

// Cluster is one local cluster: its nodes are Name1@localhost to
// NameN@localhost (N is Nodes, or Size when Nodes is 0), node i listens
// for AMQP on Port+i-1, and keeps its data under Dir/ci. Script is the
// path of scripts/cluster.sh. A Cluster of one node is a private broker,
// for tests that stop or alarm a broker (never the user's).
type Cluster struct {
	Name   string
	Port   int
	Dir    string
	Script string
	Nodes  int
}

// size is the number of nodes of c.
func (c Cluster) size() int {
	if c.Nodes > 0 {
		return c.Nodes
	}
	return Size
}

// FromEnv is the cluster scripts/cluster.sh makes by default, or the one
// MESH_CLUSTER_NAME, MESH_CLUSTER_PORT and MESH_CLUSTER_DIR name.
func FromEnv(script string) Cluster {
	c := Cluster{Name: "mesh-c", Port: 5701, Dir: "/var/lib/rabbitmq/mesh-cluster", Script: script}
	if s := os.Getenv("MESH_CLUSTER_NAME"); s != "" {
		c.Name = s
	}
	if p, err := strconv.Atoi(os.Getenv("MESH_CLUSTER_PORT")); err == nil {
		c.Port = p
	}
	if s := os.Getenv("MESH_CLUSTER_DIR"); s != "" {
		c.Dir = s
	}
	return c
}

// NodeName is the Erlang name of node i (1-based).
func (c Cluster) NodeName(i int) string { return fmt.Sprintf("%s%d@localhost", c.Name, i) }

// AMQPAddr is node i's AMQP address, host:port.
func (c Cluster) AMQPAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", c.Port+i-1) }

// Run runs scripts/cluster.sh with args (up, down, status) for this
// cluster and returns what it printed.
func (c Cluster) Run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Script, args...)
	cmd.Env = append(os.Environ(), "MESH_CLUSTER_NAME="+c.Name, "MESH_CLUSTER_PORT="+strconv.Itoa(c.Port), "MESH_CLUSTER_DIR="+c.Dir,
		"MESH_CLUSTER_SIZE="+strconv.Itoa(c.size()))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w", c.Script, strings.Join(args, " "), err)
	}
	return out, nil
}

// Ctl runs rabbitmqctl against node i and returns its output.
func (c Cluster) Ctl(i int, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-n", c.NodeName(i)}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("rabbitmqctl -n %s %s: %w: %s", c.NodeName(i), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// CtlAny runs rabbitmqctl against the first node that answers.
func (c Cluster) CtlAny(args ...string) ([]byte, error) {
	var errs []error
	for i := 1; i <= c.size(); i++ {
		out, err := c.Ctl(i, args...)
		if err == nil {
			return out, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Kill SIGKILLs the Erlang VM of node i, as a crash would, and returns
// once it is gone.
func (c Cluster) Kill(i int) error {
	b, err := os.ReadFile(filepath.Join(c.Dir, fmt.Sprintf("c%d", i), "pid"))
	if err != nil {
		return fmt.Errorf("the pid of %s: %w", c.NodeName(i), err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("the pid file of %s: %w", c.NodeName(i), err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", c.NodeName(i), pid, err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		<-time.After(50 * time.Millisecond) // the kernel reaps it: no event to wait on from here
	}
	return fmt.Errorf("%s (pid %d) still runs a minute after SIGKILL", c.NodeName(i), pid)
}

// LeaderOf is the node (1-based) that leads queue in vhost, asked of any
// node that answers; 0 with an error if no node names one.
func (c Cluster) LeaderOf(vhost, queue string) (int, error) {
	out, err := c.CtlAny("list_queues", "-p", vhost, "name", "leader", "--formatter", "json")
	if err != nil {
		return 0, err
	}
	var qs []struct{ Name, Leader string }
	if err := json.Unmarshal(out, &qs); err != nil {
		return 0, fmt.Errorf("list_queues: %w: %s", err, out)
	}
	for _, q := range qs {
		if q.Name != queue {
			continue
		}
		for j := 1; j <= c.size(); j++ {
			if q.Leader == c.NodeName(j) {
				return j, nil
			}
		}
		return 0, fmt.Errorf("queue %s has leader %q, not a node of %s", queue, q.Leader, c.Name)
	}
	return 0, fmt.Errorf("no queue %s in %s", queue, vhost)
}

// Partition cuts node i off from the other nodes of the cluster, as a
// network partition would, while its clients stay connected to it: node
// i's Erlang distribution is given a wrong cookie for each peer and its
// links to them are dropped, so neither side can connect again until
// Heal. (This machine has no firewall to drop the distribution port; the
// handshake's cookie check refuses the links as surely.) With the
// cluster's pause_minority, node i then pauses itself: it closes its
// clients' connections and refuses new ones until it sees its peers again.
func (c Cluster) Partition(i int) error {
	_, err := c.Ctl(i, "eval", c.peersExpr(i)+
		` [erlang:set_cookie(N, 'mesh-partitioned') || N <- Peers], [erlang:disconnect_node(N) || N <- Peers], ok.`)
	return err
}

// Heal ends Partition(i): node i takes its cookie back for each peer and
// connects to them again. (RabbitMQ's partition handling takes it from
// there: with pause_minority, node i resumes.)
func (c Cluster) Heal(i int) error {
	_, err := c.Ctl(i, "eval", c.peersExpr(i)+
		` [erlang:set_cookie(N, erlang:get_cookie()) || N <- Peers], [net_adm:ping(N) || N <- Peers], ok.`)
	return err
}

// peersExpr binds Peers, in an Erlang expression, to the nodes other than i.
func (c Cluster) peersExpr(i int) string {
	var peers []string
	for j := 1; j <= c.size(); j++ {
		if j != i {
			peers = append(peers, "'"+c.NodeName(j)+"'")
		}
	}
	return "Peers = [" + strings.Join(peers, ", ") + "],"
}
