package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestShutdownBoundedByGrace: SIGTERM while a module process's handler
// hangs, ignoring its deadline. meshd exits 0 once its grace is over,
// without waiting for the handler; the module process is gone; the event
// goes back to the module's queue, neither acknowledged nor dead-lettered.
func TestShutdownBoundedByGrace(t *testing.T) {
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	meshd, module := buildMeshdAndEcho(t, dir)
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
node: grace
amqp_url: %s
state_dir: %s
grace: 1s
modules:
  - name: echo
    path: %s
    handler_timeout: 10m
    prefetch: 1
    tools: ["echo.*"]
`, url, filepath.Join(dir, "state"), module)), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshd, "run", "--config", cfg)
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	queue := func() amqp.Queue {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, _ := ch.QueueDeclarePassive("grace.echo.events", true, false, false, false, nil)
		return q
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s never happened; meshd log:\n%s", what, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	wait("the module consuming", func() bool { return queue().Consumers > 0 })
	var child int
	wait("a module process", func() bool {
		out, _ := exec.Command("pgrep", "-P", fmt.Sprint(cmd.Process.Pid)).Output()
		_, err := fmt.Sscan(string(out), &child)
		return err == nil && child > 0
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh.events", "mesh.test.hang", false, false, amqp.Publishing{
		Headers: amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "test", "x-node": "test",
			"x-time": time.Now().UTC().Format(time.RFC3339)},
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{"do":"hang"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Confirmed, so in the queue: a queue seen empty after this has
	// delivered it (before, an empty queue could mean not routed yet).
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish the hang event: confirmed %v, %v", ok, err)
	}
	// Delivered (not ready any more): the handler hangs on it from now.
	wait("the event delivered", func() bool { q := queue(); return q.Consumers > 0 && q.Messages == 0 })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("meshd exited with %v; log:\n%s", err, logs.String())
		}
	case <-time.After(time.Minute): // a hang, not a slow stop
		t.Fatalf("meshd did not exit after SIGTERM with a hung handler; log:\n%s", logs.String())
	}
	if alive(child) {
		_ = syscall.Kill(child, syscall.SIGKILL)
		t.Errorf("the module process %d outlived meshd", child)
	}
	wait("the event back in its queue", func() bool { q := queue(); return q.Messages == 1 && q.Consumers == 0 })
	if q, err := ch.QueueDeclarePassive("mesh.dead-letters", true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Errorf("dead letters: %+v, %v", q, err)
	}
	if !strings.Contains(logs.String(), "grace period over") {
		t.Errorf("the log does not say the grace ran out:\n%s", logs.String())
	}
}
