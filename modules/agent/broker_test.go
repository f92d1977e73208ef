package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/modules/agent"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAsModuleProcess: the agent binary, under a node, gets its tools from
// its settings (a module's config: in meshd's config), serves them over
// mesh.rpc, and a SIGKILL of it amid calls leaves no call hanging: each
// is answered or fails, and once meshd restarted it, calls are answered.
func TestAsModuleProcess(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "agent")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/agent").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	settings, _ := json.Marshal(agent.Config{Tools: []agent.Tool{{Key: "t.echo", Command: script(t, "echo.sh"), MaxConcurrency: 4}}})
	// The node announces the restart of a module process.
	restarted := make(chan struct{}, 10)
	watch, err := node.Load(ctx, sdk.Module{Name: "watch", Setup: func(m sdk.Mesh) error {
		return m.On("node.anchor.module.restarted", sdk.HandlerFunc(func(context.Context, sdk.Event) error {
			restarted <- struct{}{}
			return nil
		}))
	}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop(context.Background())
	pm, err := node.LoadPlugin(ctx, bin, nil, runtime.ModuleConfig{ToolGrants: []string{"t.*"}, Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Stop(context.Background())
	if pm.Name() != "agent" || pm.Kind() != "agent" {
		t.Errorf("loaded %s of kind %q", pm.Name(), pm.Kind())
	}
	echo := func(i int) error {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var got struct{ Request map[string]int }
		if err := node.Call(cctx, "test", "t.echo", map[string]int{"i": i}, &got); err != nil {
			return err
		}
		if got.Request["i"] != i {
			return fmt.Errorf("call %d answered %+v", i, got)
		}
		return nil
	}
	if err := echo(0); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	results := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() { results <- echo(i) })
		if i == 10 {
			if err := syscall.Kill(pm.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	wg.Wait() // every call returned: none hangs on the killed process
	close(results)
	answered, failed := 0, 0
	for err := range results {
		var te *sdk.ToolError
		switch {
		case err == nil:
			answered++
		case errors.As(err, &te) && te.Permanent:
			t.Errorf("a call failed for good across the kill: %v", err)
		default:
			failed++ // transient, or no answer in time: the caller may retry
		}
	}
	select {
	case <-restarted:
	case <-ctx.Done():
		t.Fatal("the node never restarted the agent")
	}
	if err := echo(99); err != nil {
		t.Errorf("no answer once the agent restarted: %v", err)
	}
	t.Logf("summary TestAsModuleProcess: calls=40 answered=%d failed_transient=%d (SIGKILL after 10), answered after the restart", answered, failed)
}
