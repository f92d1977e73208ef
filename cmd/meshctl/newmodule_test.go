package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestNewModule: meshctl new module writes, for each kind, a module that
// vets, whose unit tests pass and that builds, as written. Loaded by a
// node on the real broker from the node-config entry the scaffold wrote
// (its path, kind and grants), each serves its tool, and the plain one
// handles its event and emits.
func TestNewModule(t *testing.T) {
	bin := build(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	url := brokertest.VHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, err := runtime.New(ctx, runtime.Config{Node: "scaffolds", AMQPURL: url, StateDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	greetings := brokertest.Tap(t, url, "mesh.events", "module.newplain.greeting.sent")

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
		dir := filepath.Join(t.TempDir(), name)
		want(t, bin, url, 0, append([]string{"new", "module", name, "--dir", dir, "--mesh", repo}, args...), "wrote "+dir, tc.tool)
		for _, args := range [][]string{{"vet", "./..."}, {"test", "-count=1", "./..."}, {"build", "-o", "bin/" + name, "."}} {
			cmd := exec.CommandContext(ctx, "go", args...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: go %v: %v\n%s", name, args, err, out)
			}
		}

		f, err := nodeconfig.Load(filepath.Join(dir, "mesh.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Modules) != 1 {
			t.Fatalf("%s: mesh.yaml has %d modules", name, len(f.Modules))
		}
		entry := f.Modules[0]
		entry.Path = filepath.Join(dir, entry.Path) // relative to where make run runs meshd
		if tc.db {
			if len(entry.Args) != 1 || !strings.HasSuffix(entry.Args[0], "newdb.db") {
				t.Errorf("the --with-db entry's args %q, want its database's path", entry.Args)
			}
			entry.Args = []string{filepath.Join(dir, "newdb.db")}
		}
		f.Modules[0] = entry
		if err := f.Validate(); err != nil {
			t.Fatalf("%s: mesh.yaml: %v", name, err)
		}
		pm, err := node.LoadPlugin(ctx, entry.Path, entry.Args, entry.ModuleConfig())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if pm.Name() != entry.Name || string(pm.Kind()) != entry.Kind {
			t.Errorf("the binary says %s (kind %q), its entry %s (kind %q)", pm.Name(), pm.Kind(), entry.Name, entry.Kind)
		}
		var got json.RawMessage
		if err := node.Call(ctx, "test", tc.tool, json.RawMessage(tc.req), &got); err != nil {
			t.Fatalf("%s %s: %v", tc.tool, tc.req, err)
		}
		if string(got) != tc.want {
			t.Errorf("%s %s answered %s, want %s", tc.tool, tc.req, got, tc.want)
		}
	}

	dbGreetings := brokertest.Tap(t, url, "mesh.events", "module.newdb.greeting.sent")
	id, err := node.Emit(ctx, "accounts", "module.accounts.user.created", map[string]string{"name": "ada"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-greetings:
		if d.Headers["x-causation-id"] != id || string(d.Body) != `{"to":"ada","text":"Hello, ada!"}` {
			t.Errorf("greeting %s caused by %v, want one to ada caused by %s", d.Body, d.Headers["x-causation-id"], id)
		}
	case <-ctx.Done():
		t.Fatal("the plain module emitted no greeting")
	}
	// The --with-db module handled the same event through its inbox, and
	// its relay published the greeting after the commit.
	select {
	case d := <-dbGreetings:
		if d.Headers["x-causation-id"] != id || string(d.Body) != `{"to":"ada","text":"Hello, ada!"}` {
			t.Errorf("greeting %s caused by %v, want one to ada caused by %s", d.Body, d.Headers["x-causation-id"], id)
		}
	case <-ctx.Done():
		t.Fatal("the --with-db module emitted no greeting")
	}
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
