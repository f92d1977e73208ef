package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
)

// TestTailExcludes: `meshctl tail '#' --exclude 'node.*.heartbeat'` prints
// the mesh's events without the nodes' heartbeats, which a tail without
// it prints; a bad --exclude pattern is a usage error.
func TestTailExcludes(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := func(args ...string) (events, notes <-chan string, cmd *exec.Cmd) {
		t.Helper()
		cmd = exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "tail", "--json", "#"}, args...)...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		scan := func(r io.Reader) <-chan string {
			lines := make(chan string, 1000)
			go func() {
				sc := bufio.NewScanner(r)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			return lines
		}
		return scan(stdout), scan(stderr), cmd
	}
	// await returns the lines read until one contains what, that one last.
	await := func(lines <-chan string, what string) []string {
		t.Helper()
		var seen []string
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("tail ended before %q; it printed:\n%s", what, strings.Join(seen, "\n"))
				}
				seen = append(seen, l)
				if strings.Contains(l, what) {
					return seen
				}
			case <-ctx.Done():
				t.Fatalf("tail never printed %q; it printed:\n%s", what, strings.Join(seen, "\n"))
			}
		}
	}
	all, allNotes, _ := start()
	some, someNotes, someCmd := start("--exclude", "node.*.heartbeat", "--exclude", "mesh.ops.skipped")
	await(allNotes, "tail: following #")
	await(someNotes, "tail: following #, leaving out node.*.heartbeat, mesh.ops.skipped")

	n, err := runtime.New(ctx, runtime.Config{Node: "beating", AMQPURL: url, StateDir: t.TempDir(),
		HeartbeatInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	// Once the tail without --exclude has printed a heartbeat, the events
	// emitted after it reach the other tail after that heartbeat.
	await(all, `"type":"node.beating.heartbeat"`)
	if _, err := n.Emit(ctx, "test", "mesh.ops.skipped", 1); err != nil {
		t.Fatal(err)
	}
	marker, err := n.Emit(ctx, "test", "mesh.ops.marker", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range await(some, marker) {
		if strings.Contains(l, ".heartbeat") || strings.Contains(l, "mesh.ops.skipped") {
			t.Errorf("tail --exclude printed what it leaves out: %s", l)
		}
	}
	if err := someCmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := someCmd.Wait(); err != nil {
		t.Errorf("tail exited with %v", err)
	}

	out, err := exec.CommandContext(ctx, bin, "--amqp-url", url, "tail", "#", "--exclude", "node..heartbeat").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitUsage || !strings.Contains(string(out), `--exclude "node..heartbeat"`) {
		t.Errorf("a bad --exclude: %v, want exit %d\n%s", err, exitUsage, out)
	}
}
