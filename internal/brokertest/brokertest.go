// Package brokertest gives integration tests their own virtual host on the
// real local RabbitMQ, deleted when the test ends, so tests running at the
// same time never see each other's exchanges and queues and leave the
// broker clean.
//
//	url := brokertest.VHost(t) // amqp://guest:guest@127.0.0.1:5672/mesh-test-...
//
// The broker is reached through MESH_TEST_AMQP_HOST (default
// 127.0.0.1:5672) with guest/guest, and virtual hosts are made with
// rabbitmqctl, which must be on PATH (scripts/ensure-rabbitmq.sh makes sure
// the broker runs). MESH_TEST_RABBITMQ_NODE names the Erlang node
// rabbitmqctl talks to (default the local default node): the fault tests
// set both to a private node of their own.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Host is the broker's address.
func Host() string {
	if h := os.Getenv("MESH_TEST_AMQP_HOST"); h != "" {
		return h
	}
	return "127.0.0.1:5672"
}

// VHost makes a fresh virtual host for t, grants guest all rights on it,
// and deletes it (with everything in it) when t ends. It returns the AMQP
// URL of the virtual host.
func VHost(t testing.TB) string {
	t.Helper()
	url, remove, err := Create("mesh-test")
	if err != nil {
		t.Fatalf("%v (is RabbitMQ running? scripts/ensure-rabbitmq.sh starts it)", err)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return url
}

// Create makes a fresh virtual host named prefix-<random> with all rights
// for guest, for programs that are not tests (the benchmark). It returns the
// vhost's AMQP URL and a function that deletes it.
func Create(prefix string) (url string, remove func() error, err error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	if err := run("add_vhost", name); err != nil {
		return "", nil, err
	}
	remove = func() error {
		if err := run("delete_vhost", name); err != nil {
			return fmt.Errorf("delete vhost %s: %w", name, err)
		}
		return nil
	}
	if err := run("set_permissions", "-p", name, "guest", ".*", ".*", ".*"); err != nil {
		_ = remove()
		return "", nil, err
	}
	return "amqp://guest:guest@" + Host() + "/" + neturl.PathEscape(name), remove, nil
}

func run(args ...string) error {
	_, err := CtlOutput(args...)
	return err
}

// CtlOutput runs rabbitmqctl with args against the test broker's node (for
// at most two minutes) and returns what it printed.
func CtlOutput(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := []string{"-q"}
	if node := os.Getenv("MESH_TEST_RABBITMQ_NODE"); node != "" {
		full = append(full, "-n", node)
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append(full, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// User makes a broker user with a random name and password, found nowhere
// else, and deletes it when t ends. It has no permissions yet: give them
// with Ctl (set_permissions, set_topic_permissions).
func User(t testing.TB) (name, password string) {
	t.Helper()
	var b [12]byte
	_, _ = rand.Read(b[:])
	name, password = "mesh-test-user-"+hex.EncodeToString(b[:4]), "pw-"+hex.EncodeToString(b[:])
	if err := run("add_user", name, password); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := run("delete_user", name); err != nil {
			t.Errorf("%v", err)
		}
	})
	return name, password
}

// Ctl runs rabbitmqctl with args, failing t if it fails.
func Ctl(t testing.TB, args ...string) {
	t.Helper()
	if err := run(args...); err != nil {
		t.Fatalf("%v", err)
	}
}

// MemoryWatermark is the broker's memory high watermark as
// `rabbitmqctl set_vm_memory_high_watermark` takes it back: a relative
// one as it is, or Debian's default 0.4 where an absolute one is set (a
// test that sets one to raise an alarm, killed before its cleanup, leaves
// it).
func MemoryWatermark(t testing.TB) string {
	t.Helper()
	out, err := CtlOutput("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
	if err != nil {
		t.Fatalf("read the memory watermark: %v", err)
	}
	fields := strings.Fields(strings.TrimSpace(string(out)))
	if len(fields) == 0 || strings.HasPrefix(fields[len(fields)-1], "{") {
		return "0.4"
	}
	return fields[len(fields)-1]
}
