package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestKilledMidStream: the dispatcher runs as a module process (its
// triggers from its settings); SIGKILLed while it works through a queue,
// it is restarted by the node and every message reaches the tool, none
// left in the queue: what it had not acknowledged came back.
func TestKilledMidStream(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "dispatcher")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dispatcher").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	w := newWorld(t)
	var mu sync.Mutex
	seen := map[string]int{}
	firstTime := make(chan struct{}, 1000) // one per message id seen the first time
	w.load(t, sdk.Module{Name: "tools", Setup: func(m sdk.Mesh) error {
		return m.Serve("t.count", sdk.ToolHandlerFunc(func(ctx context.Context, r sdk.Request) (any, error) {
			var req struct{ Meta dispatcher.Meta }
			if err := r.Decode(&req); err != nil {
				return nil, err
			}
			mu.Lock()
			seen[req.Meta.MessageID]++
			if seen[req.Meta.MessageID] == 1 {
				firstTime <- struct{}{}
			}
			mu.Unlock()
			return "ok", nil
		}))
	}}, runtime.ModuleConfig{Prefetch: 64})
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	const n = 300
	w.queue(t, "work")
	for i := range n {
		w.publish(t, "work", fmt.Sprint("w-", i), []byte(fmt.Sprintf(`{"i":%d}`, i)), nil)
	}
	settings, _ := json.Marshal(dispatcher.Config{Store: filepath.Join(t.TempDir(), "fires.db"),
		Triggers: []dispatcher.Trigger{{Name: "work", Queue: "work", Tool: "t.count", MaxConcurrentRuns: 4}}})
	pm, err := w.node.LoadPlugin(w.ctx, bin, nil, runtime.ModuleConfig{ToolGrants: []string{"dispatcher.*"}, Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Stop(context.Background()) })
	reached := 0
	awaitDistinct := func(want int) {
		t.Helper()
		for ; reached < want; reached++ {
			select {
			case <-firstTime:
			case <-w.ctx.Done():
				t.Fatalf("%d of %d messages reached the tool", reached, want)
			}
		}
	}
	awaitDistinct(50)
	if err := syscall.Kill(pm.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitDistinct(n)
	// The broker says nothing when a queue empties: its depth is polled.
	for w.depth(t, "work") != 0 {
		select {
		case <-w.ctx.Done():
			t.Fatalf("%d messages left in the queue", w.depth(t, "work"))
		case <-time.After(20 * time.Millisecond):
		}
	}
	again := 0
	mu.Lock()
	for _, c := range seen {
		again += c - 1
	}
	mu.Unlock()
	t.Logf("summary TestKilledMidStream: messages=%d reached_tool=%d called_again=%d (in flight at the SIGKILL) lost=0", n, distinct(), again)
}
