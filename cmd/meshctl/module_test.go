package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestModuleRemove: a module's queue left by a stopped dev node keeps
// filling; meshctl module remove refuses while the module runs, asks
// before it deletes (refused without a terminal and --yes), then deletes
// its queues with their bindings, saying how many events it dropped.
// Checked on the wire with raw amqp091-go.
func TestModuleRemove(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := runtime.New(ctx, runtime.Config{Node: "dev", AMQPURL: url, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	noop := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	if _, err := n.Load(ctx, sdk.Module{Name: "shop", Setup: func(m sdk.Mesh) error { return m.On("mesh.orders.#", noop) },
		DeadLetters: noop}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	if out, err := runMeshctl(url, "module", "remove", "--yes", "dev.shop"); err == nil || !strings.Contains(err.Error(), "still runs on node dev") {
		t.Errorf("remove of a running module: %v\n%s", err, out)
	}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
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
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for range 3 { // what keeps arriving after the dev node stopped
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh.events", "mesh.orders.placed", false, false, amqp.Publishing{Body: []byte(`{}`)})
		if err != nil || !conf.Wait() {
			t.Fatalf("publish: %v", err)
		}
	}
	if out, err := runMeshctl(url, "module", "remove", "dev.shop"); err == nil || !strings.Contains(out, "removing drops 3 events") || !strings.Contains(err.Error(), "--yes") {
		t.Errorf("remove without a terminal or --yes: %v\n%s", err, out)
	}
	out, err := runMeshctl(url, "module", "remove", "--yes", "dev.shop")
	if err != nil || !strings.Contains(out, "deleted dev.shop.events and its bindings: 3 events dropped") || !strings.Contains(out, "deleted dev.shop.dead and its bindings: 0 events dropped") {
		t.Errorf("remove --yes: %v\n%s", err, out)
	}
	for _, q := range []string{"dev.shop.events", "dev.shop.dead"} {
		pc, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = pc.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("queue %s after remove: %v, want NOT_FOUND", q, err)
		}
	}
	if out, err := runMeshctl(url, "module", "remove", "--yes", "dev.shop"); err == nil || !strings.Contains(err.Error(), "nothing to remove") {
		t.Errorf("remove again: %v\n%s", err, out)
	}
	if _, err := runMeshctl(url, "module", "remove", "--yes", "noperiod"); err == nil || !strings.Contains(err.Error(), "NODE.MODULE") {
		t.Errorf("remove of a bad name: %v", err)
	}
}

// TestNodeRemove: meshctl node remove refuses a node that runs (it holds
// its lock queue), asks before it deletes (refused without a terminal and
// --yes), then deletes every queue of the stopped node with its policy,
// and nothing of another node's. Checked with raw amqp091-go and
// rabbitmqctl.
func TestNodeRemove(t *testing.T) {
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noop := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
	start := func(name string) *runtime.Node {
		n, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(), QueuePolicies: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		for _, mod := range []string{"shop", "audit"} {
			if _, err := n.Load(ctx, sdk.Module{Name: mod, Setup: func(m sdk.Mesh) error { return m.On("#", noop) },
				DeadLetters: noop}, runtime.ModuleConfig{}); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	dev, other := start("dev"), start("devx")
	defer other.Close(ctx)
	if out, err := runMeshctl(url, "node", "remove", "--yes", "dev"); err == nil || !strings.Contains(err.Error(), "node dev runs") {
		t.Errorf("remove of a running node: %v\n%s", err, out)
	}
	if err := dev.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := runMeshctl(url, "node", "remove", "dev"); err == nil || !strings.Contains(out, "node dev: dev.audit.dead (0 events), dev.audit.events") || !strings.Contains(err.Error(), "--yes") {
		t.Errorf("remove without a terminal or --yes: %v\n%s", err, out)
	}
	out, err := runMeshctl(url, "node", "remove", "--yes", "dev")
	if err != nil {
		t.Fatalf("remove --yes: %v\n%s", err, out)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"dev.shop.events", "dev.shop.dead", "dev.audit.events", "dev.audit.dead"} {
		if !strings.Contains(out, "deleted "+q+" and its bindings") {
			t.Errorf("remove --yes does not say it deleted %s:\n%s", q, out)
		}
		pc, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = pc.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("queue %s after remove: %v, want NOT_FOUND", q, err)
		}
	}
	vhost := url[strings.LastIndex(url, "/")+1:]
	policies, err := brokertest.CtlOutput("list_policies", "-p", vhost, "--no-table-headers")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(policies), "mesh.queue.dev.") || !strings.Contains(string(policies), "mesh.queue.devx.shop.events") {
		t.Errorf("policies after removing node dev (devx's stay):\n%s", policies)
	}
	pc, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.QueueDeclarePassive("devx.shop.events", true, false, false, false, nil); err != nil {
		t.Errorf("node devx's queue after removing node dev: %v", err)
	}
	if out, err := runMeshctl(url, "node", "remove", "--yes", "dev"); err != nil || !strings.Contains(out, "nothing to remove") {
		t.Errorf("remove again: %v\n%s", err, out)
	}
	if _, err := runMeshctl(url, "node", "remove", "--yes", "dev.shop"); err == nil || !strings.Contains(err.Error(), "single word") {
		t.Errorf("remove of a bad name: %v", err)
	}
}
