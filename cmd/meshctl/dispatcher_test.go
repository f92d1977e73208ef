package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestDispatcherFires runs `meshctl dispatcher fires` against a dispatcher
// on a node: the table, --json, and an unknown trigger.
func TestDispatcherFires(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("legacy.orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	tools, err := node.Load(ctx, sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return m.Serve("invoice.issue", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return "ok", nil }))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer tools.Stop(context.Background())
	fired := make(chan dispatcher.Fire, 10)
	d, err := dispatcher.Open(dispatcher.Config{Store: filepath.Join(t.TempDir(), "fires.db"),
		Triggers: []dispatcher.Trigger{{Name: "orders", Queue: "legacy.orders", Tool: "invoice.issue"}},
		OnFire:   func(f dispatcher.Fire) { fired <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m, err := node.Load(ctx, d.Module(), runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(context.Background())
	for _, id := range []string{"order-1", "order-2"} {
		if err := ch.PublishWithContext(ctx, "", "legacy.orders", false, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "dispatcher", "fires"}, args...)...).CombinedOutput()
		return string(out), err
	}
	for range 2 { // both recorded
		select {
		case <-fired:
		case <-ctx.Done():
			t.Fatal("the dispatcher did not fire both orders")
		}
	}
	out, err := run("--json", "orders")
	if err != nil {
		t.Fatalf("fires --json: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("fires --json: %s", out)
	}
	var f dispatcher.Fire
	if err := json.Unmarshal([]byte(lines[0]), &f); err != nil || f.MessageID != "order-1" || f.Outcome != "ok" || f.RoutingKey != "legacy.orders" {
		t.Errorf("fire %+v, %v", f, err)
	}
	if out, err := run("orders"); err != nil || !strings.Contains(out, "OUTCOME") || !strings.Contains(out, "order-2") {
		t.Errorf("fires table: %v\n%s", err, out)
	}
	if out, err := run("nope"); err == nil || !strings.Contains(out, `no trigger "nope"`) {
		t.Errorf("fires of an unknown trigger: %v\n%s", err, out)
	}
	ctl := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "dispatcher"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := ctl("pause", "orders"); err != nil || !strings.Contains(out, "trigger orders paused") {
		t.Errorf("pause: %v\n%s", err, out)
	}
	if q, err := ch.QueueDeclarePassive("legacy.orders", true, false, false, false, nil); err != nil || q.Consumers != 0 {
		t.Errorf("paused: %d consumers (%v)", q.Consumers, err)
	}
	if out, err := ctl("resume", "orders"); err != nil || !strings.Contains(out, "trigger orders consuming") {
		t.Errorf("resume: %v\n%s", err, out)
	}
}
