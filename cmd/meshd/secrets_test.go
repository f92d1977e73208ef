package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestSecretsStayOut: the broker password of a node (a user made for the
// test, with a password found nowhere else) appears in none of meshd's
// log lines at debug level, its /metrics, /readyz or /healthz, the
// environment of its module process, or meshctl's output and errors, on
// success and on failure, with one address or a list (MESH_AMQP_URLS,
// --amqp-urls) whose first does not answer.
func TestSecretsStayOut(t *testing.T) {
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	secretURL := fmt.Sprintf("amqp://%s:%s@%s/%s", user, password, brokertest.Host(), vhost)

	dir := testdir.Reachable(t)
	meshd, module := buildMeshdAndEcho(t, dir)
	meshctl := filepath.Join(dir, "meshctl")
	if out, err := exec.Command("go", "build", "-o", meshctl, "../meshctl").CombinedOutput(); err != nil {
		t.Fatalf("build meshctl: %v\n%s", err, out)
	}
	httpAddr := freeport.Addr(t) // meshd listens on it
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
node: secretive
state_dir: %s
http_addr: %s
modules:
  - name: echo
    path: %s
    tools: ["echo.*"]
`, filepath.Join(dir, "state"), httpAddr, module)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshd, "run", "--config", cfg, "--log-level", "debug")
	// The password in the environment, as systemd units do, in a list of
	// addresses whose first one (in the order configured) does not answer.
	deadURL := strings.Replace(secretURL, "@"+brokertest.Host(), "@127.0.0.1:1", 1)
	cmd.Env = append(os.Environ(), "MESH_AMQP_URLS="+deadURL+","+secretURL)
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	var seen strings.Builder // everything a person or a scraper could see
	run := func(args ...string) {
		out, _ := exec.CommandContext(ctx, meshctl, args...).CombinedOutput()
		seen.Write(out)
	}
	var answered bool
	for !answered {
		out, err := exec.CommandContext(ctx, meshctl, "--amqp-url", secretURL, "call", "echo.upper", `"hi"`).CombinedOutput()
		seen.Write(out)
		answered = err == nil
		if ctx.Err() != nil {
			t.Fatalf("the module never answered; meshd log:\n%s", logs.String())
		}
	}
	run("--amqp-url", secretURL, "call", "nobody.serves", "{}")
	run("--amqp-url", secretURL, "emit", "mesh.test.log", `{"do":"log"}`)
	run("--amqp-url", secretURL, "dlq", "ls")
	run("--amqp-url", strings.Replace(secretURL, vhost, "no-such-vhost", 1), "emit", "mesh.test.x", "{}")
	run("--amqp-url", deadURL, "emit", "mesh.test.x", "{}")
	run("--amqp-urls", deadURL+","+secretURL, "emit", "mesh.test.log", `{"do":"log"}`)
	run("--amqp-urls", deadURL, "--amqp-urls", deadURL+"0", "dlq", "ls")
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen.Write(body)
	}
	var child int
	out, _ := exec.Command("pgrep", "-P", fmt.Sprint(cmd.Process.Pid)).Output()
	if _, err := fmt.Sscan(string(out), &child); err != nil {
		t.Fatalf("no module process under meshd: %v", err)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", child))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(environ), password) {
		for _, kv := range strings.Split(string(environ), "\x00") {
			if strings.Contains(kv, password) {
				t.Errorf("the module process environment holds the broker password: %s", kv[:strings.Index(kv, "=")])
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	seen.WriteString(logs.String())
	// Last, meshd's own errors: a second meshd whose credentials the
	// broker refuses fails its start (the wrong password holds the right
	// one, so a leak of either shows).
	dead := exec.CommandContext(ctx, meshd, "run", "--node", "other", "--state-dir", filepath.Join(dir, "other"),
		"--amqp-url", strings.Replace(secretURL, password, password+"-wrong", 1))
	out, _ = dead.CombinedOutput() // refused credentials fail the start
	seen.Write(out)

	if strings.Contains(seen.String(), password) {
		i := strings.Index(seen.String(), password)
		t.Errorf("the broker password appears in what meshd and meshctl show, for instance:\n%s", seen.String()[max(0, i-300):min(len(seen.String()), i+100)])
	}
	if !strings.Contains(seen.String(), "mesh_events_emitted_total") || !strings.Contains(seen.String(), "HI") {
		t.Errorf("the test saw too little to prove anything:\n%s", seen.String())
	}
}
