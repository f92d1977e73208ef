package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
)

// TestRunAnnouncesAndStopsOnSIGTERM builds meshd, runs it against a fresh
// virtual host, and checks it announces the node, and on SIGTERM announces
// its leaving and exits 0.
func TestRunAnnouncesAndStopsOnSIGTERM(t *testing.T) {
	url := brokertest.VHost(t)
	bin := filepath.Join(t.TempDir(), "meshd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The topology may not exist yet: declare the exchange as meshd does.
	if err := ch.ExchangeDeclare("mesh.events.unrouted", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("mesh.events", "topic", true, false, false, false, amqp.Table{"alternate-exchange": "mesh.events.unrouted"}); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "node.#", "mesh.events", false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run")
	cmd.Env = append(os.Environ(), "MESH_NODE=anchor", "MESH_AMQP_URL="+url, "MESH_STATE_DIR="+t.TempDir())
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	next := func(want string) {
		t.Helper()
		select {
		case d := <-deliveries:
			if d.RoutingKey != want {
				t.Errorf("got %s, want %s", d.RoutingKey, want)
			}
		case <-ctx.Done():
			t.Fatalf("no %s event; meshd log:\n%s", want, logs.String())
		}
	}
	next("node.anchor.joined")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next("node.anchor.left")
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exited with %v; log:\n%s", err, logs.String())
	}
	if strings.Contains(logs.String(), "guest:guest") {
		t.Errorf("the broker password is in the log:\n%s", logs.String())
	}
}

func TestRunRequiresANode(t *testing.T) {
	t.Setenv("MESH_NODE", "")
	if err := app().Run([]string{"meshd", "run"}); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("run without a node: %v", err)
	}
	if err := app().Run([]string{"meshd", "run", "--node", "a.b", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("run with a dotted node name: %v", err)
	}
}
