//go:build shipped

// Package shipped is the as-shipped suite (issue 60): it touches only what
// a user touches. Its binaries are the release's (the archive that
// scripts/release.sh makes, unpacked: bin/meshd, bin/meshctl, modules/),
// meshd runs as its own process with a config file, started as the
// release's systemd unit starts it (as root: its user, capabilities, no
// new privileges and umask read from the unit file; asTheUnit), meshctl
// runs as a subprocess with its environment, module authors' binaries are
// built as authors build them, and what comes out is read on the wire
// with raw amqp091-go. What it cannot run here is systemd as PID 1: the
// unit's sandbox (ProtectSystem= and the rest) is test/release's, which
// installs the .deb. Nothing here reaches the code through an in-process
// node: a behaviour that has an in-process test and a user-facing path is
// tested here on that path.
//
// SHIPPED_DIST names a directory that scripts/release.sh filled (make
// test's release lane passes the one the release test kept,
// RELEASE_KEEP_DIST); without a linux/amd64 archive there, the suite builds
// the release for linux/amd64 itself. Build tag shipped: make test
// runs it after the release test.
package shipped

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/internal/unitfile"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// release is the unpacked archive of the release under test: bin/meshd,
// bin/meshctl, modules/, the docs, the sample config and the unit.
var release string

func TestMain(m *testing.M) {
	dir, err := unpackRelease()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipped:", err)
		os.Exit(1)
	}
	release = dir
	code := m.Run()
	_ = os.RemoveAll(filepath.Dir(dir))
	os.Exit(code)
}

// unpackRelease unpacks the release's linux/amd64 archive from
// SHIPPED_DIST, or from a release it builds, into a directory every user
// may pass through and read (meshd as root runs each module as a user of
// its own), and returns the archive's top directory.
func unpackRelease() (string, error) {
	tmp, err := os.MkdirTemp("", "mesh-shipped-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	dist := os.Getenv("SHIPPED_DIST")
	if found, _ := filepath.Glob(filepath.Join(dist, "mesh_*_linux_amd64.tar.gz")); dist == "" || len(found) == 0 {
		// None given, or the release test kept none (it skipped): built
		// here.
		dist = filepath.Join(tmp, "dist")
		cmd := exec.Command("scripts/release.sh", dist)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "RELEASE_ARCHS=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("scripts/release.sh: %v\n%s", err, out)
		}
	}
	archives, err := filepath.Glob(filepath.Join(dist, "mesh_*_linux_amd64.tar.gz"))
	if err != nil || len(archives) != 1 {
		return "", fmt.Errorf("want one mesh_*_linux_amd64.tar.gz in %s, found %v (%v)", dist, archives, err)
	}
	unpacked := filepath.Join(tmp, "release")
	if err := os.Mkdir(unpacked, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("tar", "-C", unpacked, "-xzf", archives[0]).CombinedOutput(); err != nil {
		return "", fmt.Errorf("unpack %s: %v\n%s", archives[0], err, out)
	}
	tops, err := filepath.Glob(filepath.Join(unpacked, "mesh_*"))
	if err != nil || len(tops) != 1 {
		return "", fmt.Errorf("the archive %s holds %v at its top, want one mesh_* directory", archives[0], tops)
	}
	return tops[0], nil
}

// binary is the path of the release's program name (bin/meshd,
// modules/audit-logger).
func binary(name string) string { return filepath.Join(release, name) }

// uniqueName is prefix and a random suffix: a node name no other test
// uses.
func uniqueName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// logBuffer collects a process's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// node is a meshd of the release, run as a user runs it.
type node struct {
	name, config, http string
	state              string // its state dir
	cmd                *exec.Cmd
	log                *logBuffer
}

// startNode writes a config for node name (the broker from MESH_AMQP_URL,
// as the package's meshd.env gives it; a state dir and a free loopback
// HTTP address of its own; then modules, the YAML of its modules: list,
// {state} standing for the state dir, or "") and runs the release's meshd
// run --config on it, until the test ends. It returns once /readyz
// answers 200.
func startNode(t *testing.T, url, name, modules string) *node {
	t.Helper()
	dir := testdir.Reachable(t) // as root, each module runs as a user of its own
	addr := freeport.Addr(t)    // meshd listens on it
	cfg := filepath.Join(dir, "mesh.yaml")
	text := fmt.Sprintf("node: %s\nstate_dir: %s\nhttp_addr: %s\n", name, filepath.Join(dir, "state"), addr)
	if modules != "" {
		text += "modules:\n" + strings.ReplaceAll(modules, "{state}", filepath.Join(dir, "state"))
	}
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &node{name: name, config: cfg, http: addr, state: filepath.Join(dir, "state"), log: &logBuffer{}}
	argv := append(asTheUnit(t, dir, cfg), binary("bin/meshd"), "run", "--config", cfg)
	n.cmd = exec.Command(argv[0], argv[1:]...)
	n.cmd.Dir = dir // the unit's WorkingDirectory, /var/lib/mesh, stood in for (asTheUnit)
	n.cmd.Env = append(os.Environ(), "MESH_AMQP_URL="+url)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when meshd has exited, and waited for
	go func() { _ = n.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = n.cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("meshd %s's log:\n%s", name, n.log.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return n
			}
		}
		select {
		case <-exited:
			t.Fatalf("meshd %s exited before it was ready (%v); its log:\n%s", name, n.cmd.ProcessState, n.log.String())
		case <-ctx.Done():
			t.Fatalf("meshd %s was not ready within 90s; its log:\n%s", name, n.log.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nobody stands in for the unit's User=mesh, which only the package makes.
const nobody = 65534

// asTheUnit is the command prefix that starts meshd as the release's unit
// (systemd/meshd.service in the archive, what the package installs)
// starts it, read from that file (internal/unitfile): its capabilities,
// ambient and bounding, no new privileges and umask, as nobody for its
// User=mesh. The unit's StateDirectory=mesh, WorkingDirectory=/var/lib/mesh
// (mode StateDirectoryMode, owned by the user) is stood in for by dir,
// made so; the config, root's 0640 group mesh in the package, is the
// user's here. As anyone but root, meshd runs as that user, as a
// developer runs it, and the prefix is empty.
func asTheUnit(t *testing.T, dir, cfg string) []string {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := unitfile.Read(binary("systemd/meshd.service"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := u.Service()
	if err != nil {
		t.Fatal(err)
	}
	mode := os.FileMode(0o755)
	if m, ok := u.Value("Service", "StateDirectoryMode"); ok {
		if v, err := strconv.ParseUint(m, 8, 32); err == nil {
			mode = os.FileMode(v)
		}
	}
	for _, p := range []string{dir, cfg} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return append(svc.Setpriv(nobody, nobody), svc.Shell()...)
}

// moduleDir is the directory meshd gives module name in the node's state
// dir (MESH_MODULE_DIR), the one place there open to it.
func (n *node) moduleDir(name string) string { return filepath.Join(n.state, "modules", name) }

// userModule builds the module binary of package pkg of the repository
// (a module author's binary, on the sdk) where every user may run it: the
// modules a user writes, beside the release's own.
func userModule(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(testdir.Reachable(t), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// meshctl runs the release's meshctl with args, the broker given as a
// user gives it (MESH_AMQP_URL), and returns its standard output, and its
// error with what it wrote to standard error.
func meshctl(ctx context.Context, url string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, binary("bin/meshctl"), args...)
	cmd.Env = append(os.Environ(), "MESH_AMQP_URL="+url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("meshctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
