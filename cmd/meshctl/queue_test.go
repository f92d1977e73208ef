package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestQueueMigrateUnderLoad: a module consuming a classic queue while a
// producer emits moves to a quorum queue with meshctl queue migrate, as an
// operator would do it: the entry says queue_type: quorum, the node still
// runs the classic one (a reload of it is refused by the broker), meshctl
// migrates (the node's module lets go of the queue, and cannot take it
// back while the migration lasts), then the node loads the module with
// the new entry. Every emitted event is handled exactly once: none lost,
// and the copies a migration may route twice are dropped by the module's
// de-duplication, not handled again.
func TestQueueMigrateUnderLoad(t *testing.T) {
	url := brokertest.VHost(t)
	state := testdir.Reachable(t)
	cfg := filepath.Join(testdir.Reachable(t), "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`node: n1
amqp_url: %s
state_dir: %s
delays: false
queue_limit_policy_only: true
modules:
  - name: ledger
    path: /bin/true
    queue_type: quorum
    max_attempts: 4
`, url, state)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var logs lockedLog
	n, err := runtime.New(ctx, runtime.Config{Node: "n1", AMQPURL: url, StateDir: state, QueuePolicies: true, QueueLimitPolicyOnly: true,
		ConsumerCheckInterval: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())

	var mu sync.Mutex
	handled := map[string]int{}
	progress := make(chan struct{}, 1) // a handling happened
	ledger := sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.#", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error {
			mu.Lock()
			handled[ev.ID]++
			mu.Unlock()
			select {
			case progress <- struct{}{}:
			default:
			}
			return nil
		}))
	}}
	m, err := n.Load(ctx, ledger, runtime.ModuleConfig{QueueType: runtime.QueueClassic, MaxAttempts: 4})
	if err != nil {
		t.Fatal(err)
	}

	// The producer, from a node of its own, until told to stop.
	producer, err := runtime.New(ctx, runtime.Config{Node: "shop", AMQPURL: url, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close(context.Background())
	var emitted []string
	stop, produced := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := producer.Emit(ctx, "shop", "module.shop.order", i)
			if err != nil {
				t.Errorf("emit: %v", err)
				return
			}
			emitted = append(emitted, id)
		}
	}()
	var stopOnce sync.Once
	stopProducer := func() { stopOnce.Do(func() { close(stop) }); <-produced }
	defer stopProducer()

	var out bytes.Buffer
	a := app()
	a.Writer, a.ErrWriter = &out, &out
	if err := a.Run(interspersed(a, []string{"meshctl", "queue", "migrate", "--config", cfg, "--module", "ledger", "--wait", "30s"})); err != nil {
		t.Fatalf("meshctl queue migrate: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "n1.ledger.events migrated to x-dead-letter-exchange=mesh.events.dead x-queue-type=quorum, attempt limit in policy mesh.queue.n1.ledger.events") {
		t.Errorf("meshctl queue migrate said:\n%s", out.String())
	}
	// The reload, with the entry the queue now matches.
	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	if err := m.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Load(ctx, ledger, runtime.ModuleConfig{QueueType: runtime.QueueQuorum, MaxAttempts: 4}); err != nil {
		t.Fatalf("load with the new entry: %v", err)
	}
	stopProducer()

	api, err := brokerapi.New(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	q, err := api.Queue(ctx, "n1.ledger.events")
	if err != nil || q.Type != "quorum" {
		t.Fatalf("the queue after the migration: %+v %v", q, err)
	}
	// topology check takes the limit kept in a policy for what the entry says.
	out.Reset()
	a = app()
	a.Writer, a.ErrWriter = &out, &out
	if err := a.Run(interspersed(a, []string{"meshctl", "topology", "check", "--config", cfg, "--all"})); err != nil ||
		!strings.Contains(out.String(), "ok        queue n1.ledger.events: (its attempt limit is in policy mesh.queue.n1.ledger.events)") {
		t.Errorf("topology check after the migration: %v\n%s", err, out.String())
	}
	for {
		mu.Lock()
		done := len(handled) >= len(emitted)
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-progress:
		case <-ctx.Done():
			mu.Lock()
			n := len(handled)
			mu.Unlock()
			t.Fatalf("handled %d of %d events before the deadline", n, len(emitted))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	lost, twice := 0, 0
	for _, id := range emitted {
		switch handled[id] {
		case 0:
			lost++
		case 1:
		default:
			twice++
		}
	}
	// One let-go for the migration: not one resume per consumer check
	// while it lasted (each would close the module's channels again).
	if got := strings.Count(logs.String(), "the module stops consuming while its queue migrates"); got != 1 {
		t.Errorf("the module let go of its queue %d times, want 1", got)
	}
	t.Logf("emitted %d, handled %d distinct", len(emitted), len(handled))
	if len(emitted) == 0 || lost != 0 || twice != 0 {
		t.Errorf("emitted %d: %d never handled, %d handled more than once", len(emitted), lost, twice)
	}
}

// lockedLog is a log buffer safe for concurrent writes.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
