package upgrade_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestRollbackOfANodeThisReleaseStarted (issue 60, defect 4): a node first
// started by this release, with the package's defaults (queue policies
// on: the broker's guest is an administrator), is rolled back to the
// previous release's meshd and module binaries on the same config and
// state dir, as docs/compatibility.md says is safe: the previous meshd
// declares the queues this release made (it stopped on 406 inequivalent
// arg x-delivery-limit when they carried their limit by policy alone),
// becomes ready, and its audit logger records an event emitted after the
// rollback; then this release's meshd takes the node back.
func TestRollbackOfANodeThisReleaseStarted(t *testing.T) {
	old := previousRelease(t)
	cur, meshctl := thisRelease(t)
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := testdir.Reachable(t)
	gamma := &node{t: t, name: "gamma", addr: freeAddr(t), cfg: filepath.Join(dir, "gamma.yaml")}
	config := func(audit string) string {
		return fmt.Sprintf(`node: gamma
amqp_url: %s
state_dir: %s
http_addr: %s
heartbeat_interval: 1s
grace: 5s
modules:
  - name: audit-logger
    path: %s
    tools: ["audit.*"]
    dead_letters: ["#"]
`, url, filepath.Join(dir, "gamma-state"), gamma.addr, audit)
	}
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(gamma.cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	audited := func(what string) {
		t.Helper()
		id, err := exec.CommandContext(ctx, meshctl, "--amqp-url", url, "emit", "--schema", "", "mesh.rollback.checked", `{"step":"`+what+`"}`).Output()
		if err != nil {
			t.Fatalf("meshctl emit: %v", err)
		}
		gamma.until(ctx, what+": the event in gamma's audit log", func() bool {
			out, err := exec.CommandContext(ctx, meshctl, "--amqp-url", url, "audit", "export", "--format", "jsonl").Output()
			return err == nil && strings.Contains(string(out), strings.TrimSpace(string(id)))
		})
	}

	write(config(cur.aud))
	gamma.start(ctx, cur.meshd)
	gamma.ready(ctx)
	audited("this release")
	gamma.stop()

	write(config(old.aud))
	gamma.start(ctx, old.meshd)
	gamma.until(ctx, "the previous release's meshd ready on the node this release started", func() bool {
		if strings.Contains(gamma.logs.String(), "inequivalent arg") {
			t.Fatalf("the previous release's meshd was refused a queue this release made; its log:\n%s", gamma.logs.String())
		}
		return gamma.readyNow()
	})
	audited("rolled back to " + old.release)
	gamma.stop()

	write(config(cur.aud))
	gamma.start(ctx, cur.meshd)
	gamma.ready(ctx)
	audited("rolled forward")
	gamma.stop()
}
