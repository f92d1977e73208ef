package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/sdk/outbox"
)

// TestNewModule: meshctl new module writes, for each kind, a project that
// vets and whose unit tests pass (make test), as written. Each then runs as
// its user runs it, unchanged: its own make run (meshd run --config
// mesh.yaml, with the meshd and meshctl of this tree on PATH and
// MESH_AMQP_URL a vhost of the test's own). Where the test runs as root,
// meshd gives each module a user of its own and confines it with Landlock,
// as it does a user's. Each serves its tool to meshctl call; the plain
// module and the --with-db one greet the user of a user.created event
// emitted with meshctl emit, and the --with-db one, through its inbox and
// outbox, notes the user in its database, in the directory meshd gives it.
func TestNewModule(t *testing.T) {
	bins := buildBins(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	meshctlBin := filepath.Join(bins, "meshctl")
	env := append(os.Environ(), "PATH="+bins+string(os.PathListSeparator)+os.Getenv("PATH"), "MESH_AMQP_URL="+url)

	type scaffolded struct {
		name, tool, req, want string
		dir                   string
		run                   *makeRun
	}
	var all []*scaffolded
	for _, tc := range []struct {
		kind, tool string
		req, want  string
		db         bool
	}{
		{"plain", "newplain.greet", `{"name":"ada"}`, `{"text":"Hello, ada!"}`, false},
		{"agent", "newagent.count", `{"text":"to be or not"}`, `{"words":4}`, false},
		{"dispatcher", "newdispatcher.status", `{}`, `{"dispatched":0}`, false},
		{"plain", "newdb.greet", `{"name":"ada"}`, `{"text":"Hello, ada!"}`, true},
	} {
		name := "new" + tc.kind
		args := []string{"--kind", tc.kind}
		if tc.db {
			name, args = "newdb", []string{"--with-db"}
		}
		// Where meshd runs as root, the module's user must pass through
		// to the project's state dir (docs/security.md).
		dir := filepath.Join(testdir.Reachable(t), name)
		want(t, meshctlBin, url, 0, append([]string{"new", "module", name, "--dir", dir, "--mesh", repo}, args...), "wrote "+dir, tc.tool)
		for _, args := range [][]string{{"go", "vet", "./..."}, {"make", "test"}} {
			cmd := exec.CommandContext(ctx, args[0], args[1:]...)
			cmd.Dir, cmd.Env = dir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %v\n%s", name, args, err, out)
			}
		}
		all = append(all, &scaffolded{name: name, tool: tc.tool, req: tc.req, want: tc.want, dir: dir, run: startMakeRun(t, ctx, dir, env)})
	}
	for _, s := range all {
		s.run.waitLoaded(t, ctx, s.name)
	}

	for _, s := range all {
		want(t, meshctlBin, url, 0, []string{"call", s.tool, s.req}, s.want)
	}
	greetings := brokertest.Tap(t, url, "mesh.events", "module.newplain.greeting.sent")
	dbGreetings := brokertest.Tap(t, url, "mesh.events", "module.newdb.greeting.sent")
	stdout, _ := want(t, meshctlBin, url, 0, []string{"emit", "module.accounts.user.created", `{"name":"ada"}`})
	id := strings.TrimSpace(stdout)
	for _, s := range all {
		ch := map[string]<-chan amqp.Delivery{"newplain": greetings, "newdb": dbGreetings}[s.name]
		if ch == nil {
			continue
		}
		module := s.name
		select {
		case d := <-ch:
			if d.Headers["x-causation-id"] != id || string(d.Body) != `{"to":"ada","text":"Hello, ada!"}` {
				t.Errorf("%s: greeting %s caused by %v, want one to ada caused by %s", module, d.Body, d.Headers["x-causation-id"], id)
			}
		case <-ctx.Done():
			t.Fatalf("%s emitted no greeting; make run printed:\n%s", module, s.run.log.String())
		}
	}
	// The --with-db module handled the event through its inbox (its relay
	// published the greeting after the commit): the user is in its
	// database, in its own directory. Read once its process is gone.
	db := all[len(all)-1]
	db.run.stop(t)
	sqlDB, err := outbox.OpenSQLite(filepath.Join(db.dir, "state", "modules", "newdb", "newdb.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	var greeted []string
	rows, err := sqlDB.QueryContext(ctx, `SELECT name FROM greeted`)
	if err != nil {
		t.Fatalf("the --with-db module's database: %v; make run printed:\n%s", err, db.run.log.String())
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		greeted = append(greeted, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(greeted, []string{"ada"}) {
		t.Errorf("the --with-db module's database has greeted %q, want [ada]", greeted)
	}
}

// buildBins builds meshd and meshctl of this tree into a directory of their
// own, for PATH.
func buildBins(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"../meshd", "."} {
		if out, err := exec.Command("go", "build", "-o", dir, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// makeRun is a scaffold's make run, running: make, the meshd it starts and
// that meshd's module processes, in a process group of their own.
type makeRun struct {
	cmd *exec.Cmd
	out *os.File // the read end of make's stdout and stderr
	// log is all make run printed; loaded is closed when meshd logged
	// the scaffold's module loaded, failed (with failure set) when it
	// logged that the module did not start; read ends at make's output's
	// end.
	log            lockedLog
	loaded, failed chan struct{}
	failure        string
	read           chan struct{}
	stopped        bool
}

// startMakeRun starts make run in dir, with env, as a user's shell does
// (a process group of its own, as a terminal's job), and stops it when t
// ends.
func startMakeRun(t *testing.T, ctx context.Context, dir string, env []string) *makeRun {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &makeRun{out: pr, loaded: make(chan struct{}), failed: make(chan struct{}), read: make(chan struct{})}
	r.cmd = exec.Command("make", "run")
	r.cmd.Dir, r.cmd.Env, r.cmd.Stdout, r.cmd.Stderr = dir, env, pw, pw
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = r.cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		t.Fatalf("make run in %s: %v", dir, err)
	}
	module := filepath.Base(dir)
	go func() {
		defer close(r.read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		loaded, failed := false, false
		for sc.Scan() {
			line := sc.Bytes()
			r.log.Write(line)
			r.log.Write([]byte{'\n'})
			var entry struct{ Msg, Module, Err string }
			if json.Unmarshal(line, &entry) != nil || entry.Module != module {
				continue
			}
			switch {
			case entry.Msg == "module loaded" && !loaded:
				loaded = true
				close(r.loaded)
			case strings.HasPrefix(entry.Msg, "a module did not start") && !failed && !loaded:
				failed = true
				r.failure = entry.Err
				close(r.failed)
			}
		}
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// waitLoaded waits until meshd logged module loaded, and fails the test at
// once when it logged that the module did not start.
func (r *makeRun) waitLoaded(t *testing.T, ctx context.Context, module string) {
	t.Helper()
	select {
	case <-r.loaded:
	case <-r.failed:
		t.Fatalf("make run: module %s did not start: %s\nmake run printed:\n%s", module, r.failure, r.log.String())
	case <-r.read:
		t.Fatalf("make run ended before module %s loaded:\n%s", module, r.log.String())
	case <-ctx.Done():
		t.Fatalf("make run: module %s did not load: %v\nmake run printed:\n%s", module, ctx.Err(), r.log.String())
	}
}

// stop stops make run as Ctrl-C does (SIGINT to its process group) and
// waits for make to exit, then ends what is left of the group; SIGKILL
// if make is not gone within 30 s.
func (r *makeRun) stop(t *testing.T) {
	t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	pgid := r.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGINT)
	exited := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Errorf("make run did not stop within 30 s of SIGINT; killed:\n%s", r.log.String())
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // whatever of the group outlived make
	r.out.Close()
	<-r.read
}

// TestNewModuleRefuses: a bad name or kind is a usage error (exit 2), and
// a directory that is not empty is left alone (exit 1).
func TestNewModuleRefuses(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"new", "module", "a.b"}, 2},
		{[]string{"new", "module", "ok", "--kind", "robot"}, 2},
		{[]string{"new", "module", "ok", "--kind", "agent", "--with-db"}, 2},
		{[]string{"new", "module"}, 2},
		{[]string{"new", "module", "ok", "--dir", dir}, 1},
		{[]string{"new", "module", "ok", "--dir", filepath.Join(dir, "x"), "--mesh", dir}, 2},
	} {
		if _, stderr, code := meshctl(t, bin, "amqp://unused", tc.args...); code != tc.code {
			t.Errorf("meshctl %v exited %d, want %d: %s", tc.args, code, tc.code, stderr)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "keep")); err != nil || string(b) != "mine" {
		t.Errorf("the existing directory was touched: %q, %v", b, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the existing directory holds %d entries, want 1", len(entries))
	}
}
