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
// the broker runs).
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
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
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "mesh-test-" + hex.EncodeToString(b[:])
	ctl(t, "add_vhost", name)
	t.Cleanup(func() {
		if err := run("delete_vhost", name); err != nil {
			t.Errorf("delete test vhost %s: %v", name, err)
		}
	})
	ctl(t, "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
	return "amqp://guest:guest@" + Host() + "/" + url.PathEscape(name)
}

func ctl(t testing.TB, args ...string) {
	t.Helper()
	if err := run(args...); err != nil {
		t.Fatalf("rabbitmqctl: %v (is RabbitMQ running? scripts/ensure-rabbitmq.sh starts it)", err)
	}
}

func run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
