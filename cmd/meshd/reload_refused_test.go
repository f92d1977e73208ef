package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestReloadKeepsAnEntryTheBrokerRefuses: a reload that changes
// max_attempts applies it in place (the queue's policy, ADR 43); one that
// changes what the broker cannot change on an existing queue (its type)
// does not leave the module stopped: meshd says why the new entry was
// refused, naming meshctl queue migrate, and runs the module with the
// entry it ran with, consuming its queue, and /readyz stays 200.
func TestReloadKeepsAnEntryTheBrokerRefuses(t *testing.T) {
	url := brokertest.VHost(t)
	notifier := filepath.Join(testdir.Reachable(t), "notifier")
	if out, err := exec.Command("go", "build", "-o", notifier, "../../examples/modules/notifier").CombinedOutput(); err != nil {
		t.Fatalf("build the notifier: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd, addr, logs, cfg := startMeshd(t, ctx, fmt.Sprintf("node: anchor\namqp_url: %s\nmodules:\n  - name: notifier\n    path: %s\n    calls: [\"invoice.*\"]\n    max_attempts: 5", url, notifier))

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	consumers := func() int {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive("anchor.notifier.events", true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return q.Consumers
	}
	ready := func() bool { code, _ := httpGet(addr, "/readyz"); return code == http.StatusOK }
	eventually(t, ctx, "/readyz 200", ready, logs)
	if n := consumers(); n != 1 {
		t.Fatalf("%d consumers on the notifier's queue, want 1", n)
	}

	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text = []byte(strings.Replace(string(text), "max_attempts: 5", "max_attempts: 3", 1))
	if err := os.WriteFile(cfg, text, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the reload done", func() bool { return strings.Contains(logs.String(), "config reloaded") }, logs)
	if strings.Contains(logs.String(), "starting it with the one it ran with") {
		t.Errorf("max_attempts 5 -> 3 was refused:\n%s", logs.String())
	}
	api, err := brokerapi.New(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the queue's policy at delivery-limit 2", func() bool {
		q, err := api.Queue(ctx, "anchor.notifier.events")
		return err == nil && q.Effective["delivery-limit"] == float64(2)
	}, logs)
	if n := consumers(); n != 1 {
		t.Errorf("%d consumers on the notifier's queue after max_attempts changed, want 1", n)
	}

	if err := os.WriteFile(cfg, []byte(strings.Replace(string(text), "max_attempts: 3", "max_attempts: 3\n    queue_type: classic", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the second reload done", func() bool { return strings.Count(logs.String(), "config reloaded") == 2 }, logs)
	log := logs.String()
	if !strings.Contains(log, "starting it with the one it ran with") || !strings.Contains(log, "x-queue-type") || !strings.Contains(log, "meshctl queue migrate") {
		t.Errorf("the log does not say the new entry was refused by the broker, and the old one started:\n%s", log)
	}
	if code, body := httpGet(addr, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d %s after the reload, want 200", code, body)
	}
	if n := consumers(); n != 1 {
		t.Errorf("%d consumers on the notifier's queue after the reload, want 1", n)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("meshd exit: %v\n%s", err, logs.String())
	}
}

// TestReadinessSaysWhatIsMissing: /readyz is 503 while the config's
// modules load, and names a module a reload left stopped until it runs
// again or leaves the config.
func TestReadinessSaysWhatIsMissing(t *testing.T) {
	r := &readiness{}
	r.loading.Store(true)
	if err := r.check(); err == nil || !strings.Contains(err.Error(), "loading") {
		t.Errorf("while loading: %v", err)
	}
	r.loading.Store(false)
	r.notStarted("notifier", fmt.Errorf("refused"))
	r.notStarted("billing", fmt.Errorf("refused"))
	if err := r.check(); err == nil || !strings.Contains(err.Error(), "billing, notifier") {
		t.Errorf("with two modules stopped: %v", err)
	}
	r.notStarted("billing", nil)
	r.forgetAllBut(map[string]bool{"billing": true})
	if len(r.failed) != 0 {
		t.Errorf("failures left: %v", r.failed)
	}
}
