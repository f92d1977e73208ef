package runtime_test

import (
	"context"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// unacked is how many of queue's messages are delivered and not
// acknowledged, as the queue itself says (rabbitmqctl, not the
// management API's statistics, which lag).
func unacked(t *testing.T, vhostURL, queue string) int {
	t.Helper()
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "-p", strings.TrimPrefix(u.Path, "/"), "name", "messages_unacknowledged").Output()
	if err != nil {
		t.Fatalf("list_queues: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("list_queues: %q", line)
			}
			return n
		}
	}
	t.Fatalf("list_queues: no queue %s in\n%s", queue, out)
	return 0
}

// TestTimeoutOnTheLastAttemptIsAcked: a handler that overruns its timeout
// on its last attempt has its event dead-lettered, and the delivery is
// acknowledged then, not when (if ever) another delivery comes. (A
// classic queue: rabbitmqctl reads its unacked count from the queue
// itself; a quorum queue's comes from metrics that lag.)
func TestTimeoutOnTheLastAttemptIsAcked(t *testing.T) {
	t.Parallel()
	vhost := brokertest.VHost(t)
	n := testNode(t, vhost, "anchor", nil)
	ch := rawConn(t, vhost)
	hung := make(chan struct{})
	t.Cleanup(func() { close(hung) })
	entered := make(chan struct{}, 1)
	load(t, n, sdk.Module{Name: "sloth", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.slow.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			entered <- struct{}{}
			<-hung // ignores its context: overruns
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 1, HandlerTimeout: 200 * time.Millisecond, Prefetch: 32, Concurrency: 4, QueueType: runtime.QueueClassic})
	if _, err := n.Emit(emitCtx(t), "test", "mesh.slow.job", 1); err != nil {
		t.Fatal(err)
	}
	<-entered
	d := nextDead(t, ch)
	if d.Headers[wire.HeaderDeadReason] == nil {
		t.Fatalf("dead letter without a reason: %+v", d.Headers)
	}
	queue := wire.ModuleQueue("anchor", "sloth")
	waitFor(t, 10*time.Second, func() bool { return unacked(t, vhost, queue) == 0 })
}
