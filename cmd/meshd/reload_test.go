package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestReloadOnSIGHUP: meshd runs an agent and a dispatcher working through
// a queue; the config changes (the agent's tool answers otherwise, the
// dispatcher's trigger sends other inputs, a second agent is added) and
// SIGHUP applies it: the changed modules restart with their new settings,
// the new one starts, and every message of the queue reaches the tool,
// across the restart; removing the second agent and SIGHUP again stops it.
func TestReloadOnSIGHUP(t *testing.T) {
	url := brokertest.VHost(t)
	dir := testdir.Reachable(t)
	bins := map[string]string{}
	for name, pkg := range map[string]string{"meshd": ".", "agent": "../../modules/agent/cmd/agent", "dispatcher": "../../modules/dispatcher/cmd/dispatcher"} {
		bins[name] = filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bins[name], pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	script := filepath.Join(dir, "greet.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat >/dev/null\nprintf '{\"g\":\"%s\"}' \"$GREETING\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("work", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	const messages = 60
	for i := range messages {
		if err := ch.PublishWithContext(ctx, "", "work", false, false, amqp.Publishing{MessageId: fmt.Sprint("m-", i), Body: []byte(`{}`), DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
	}
	// The tool the dispatcher fires, served by the test: slow enough that
	// the reload lands in the middle of the queue.
	tester, err := runtime.New(ctx, runtime.Config{Node: "tester", AMQPURL: url, StateDir: testdir.Reachable(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer tester.Close(context.Background())
	var mu sync.Mutex
	seen := map[string]string{} // message id → the trigger's input "round"
	release := make(chan struct{})
	tools, err := tester.Load(ctx, sdk.Module{Name: "work", Setup: func(m sdk.Mesh) error {
		return m.Serve("work.do", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
			var req struct {
				Round string
				Meta  struct {
					MessageID string `json:"message_id"`
				}
			}
			if err := r.Decode(&req); err != nil {
				return nil, sdk.Permanent(err)
			}
			mu.Lock()
			seen[req.Meta.MessageID] = req.Round
			n := len(seen)
			mu.Unlock()
			if n >= 10 {
				<-release // hold the rest until the reload was sent
			}
			return "done", nil
		}))
	}}, runtime.ModuleConfig{Prefetch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer tools.Stop(context.Background())

	cfg := filepath.Join(dir, "mesh.yaml")
	write := func(greeting, round string, second bool) {
		t.Helper()
		extra := ""
		if second {
			extra = fmt.Sprintf(`
  - name: agent2
    kind: agent
    path: %s
    tools: ["bye.*"]
    config:
      name: agent2
      tools: [{key: bye.now, command: %s, env: {GREETING: bye}}]
`, bins["agent"], script)
		}
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
node: anchor
amqp_url: %s
state_dir: %s
grace: 10s
modules:
  - name: agent
    kind: agent
    path: %s
    tools: ["greet.*"]
    config:
      tools: [{key: greet.hello, command: %s, env: {GREETING: %s}}]
  - name: dispatcher
    kind: dispatcher
    path: %s
    tools: ["dispatcher.*"]
    consumes: ["work"]
    calls: ["work.*"]
    config:
      triggers: [{name: work, queue: work, tool: work.do, max_concurrent_runs: 2, inputs: {round: %q}}]
%s`, url, filepath.Join(dir, "state"), bins["agent"], script, greeting, bins["dispatcher"], round, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("one", "first", false)
	cmd := exec.CommandContext(ctx, bins["meshd"], "run", "--config", cfg)
	var logs lockedBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	greet := func(tool string) string {
		var r struct{ G string }
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := tester.Call(cctx, "test", tool, map[string]int{}, &r); err != nil {
			return "error: " + err.Error()
		}
		return r.G
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s never happened; meshd log:\n%s", what, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	waitFor("the agent answering one", func() bool { return greet("greet.hello") == "one" })
	waitFor("ten messages at the tool", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 10 })

	write("two", "second", true)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The calls stay held until the reload is past the agent, which comes
	// before the dispatcher in the config: the old dispatcher cannot drain
	// the queue before the reload stops it, however slow the reload is
	// (each module's declare asks the management API for its policy).
	// Then the dispatcher's stop lets the calls in flight finish.
	waitFor("the agent answering two", func() bool { return greet("greet.hello") == "two" })
	close(release)
	waitFor("the added agent answering", func() bool { return greet("bye.now") == "bye" })
	waitFor("every message at the tool", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == messages })
	mu.Lock()
	rounds := map[string]int{}
	for _, r := range seen {
		rounds[r]++
	}
	mu.Unlock()
	if rounds["first"] < 10 || rounds["second"] == 0 {
		t.Errorf("inputs by round %v: want the first before the reload and the second after", rounds)
	}

	write("two", "second", false)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the removed agent's tool without a consumer", func() bool {
		q, err := ch.QueueDeclarePassive("serve.bye.now", true, false, false, false, nil)
		if err != nil {
			ch, _ = conn.Channel()
			return false
		}
		return q.Consumers == 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exit: %v\n%s", err, logs.String())
	}
}
