package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionOfAGoBuild: meshd built with a plain go build (no -ldflags)
// in a git clone says the clone's commit, with "+dirty" once a file is
// changed; built where the go command stamps none (-buildvcs=false, as in
// a git worktree) it says why it knows none and how to build one that
// does; and the commit -ldflags sets (make build, the release) wins over
// the go command's stamp.
func TestVersionOfAGoBuild(t *testing.T) {
	src := cloneOfTheWorkTree(t)
	head := strings.TrimSpace(command(t, src, "git", "rev-parse", "--short=12", "HEAD"))
	out := t.TempDir()
	version := func(name string, buildArgs ...string) string {
		t.Helper()
		bin := filepath.Join(out, name)
		build := exec.Command("go", append(append([]string{"build"}, buildArgs...), "-o", bin, "./cmd/meshd")...)
		build.Dir = src
		// The go command's default (-buildvcs=auto) as a user has it; this
		// machine's go env may say otherwise.
		build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto")
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", buildArgs, err, b)
		}
		b, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("meshd version: %v\n%s", err, b)
		}
		return string(b)
	}
	if got := version("meshd"); !strings.Contains(got, "\ncommit: "+head+"\n") {
		t.Errorf("meshd of a go build in a clone at %s says:\n%s", head, got)
	}
	if got := version("meshd-flags", "-ldflags", "-X github.com/meshkit/mesh/internal/version.commit=0123456789ab"); !strings.Contains(got, "\ncommit: 0123456789ab\n") {
		t.Errorf("meshd built with -ldflags setting the commit says:\n%s", got)
	}
	if got := version("meshd-nostamp", "-buildvcs=false"); !strings.Contains(got, "\ncommit: unknown (the go command stamped none: go build stamps it in a git clone, not with -buildvcs=false nor in a git worktree; make build sets it)\n") {
		t.Errorf("meshd of a go build with no commit stamped says:\n%s", got)
	}
	if err := os.WriteFile(filepath.Join(src, "README.md"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := version("meshd-dirty"); !strings.Contains(got, "\ncommit: "+head+"+dirty\n") {
		t.Errorf("meshd of a go build in a changed clone at %s says:\n%s", head, got)
	}
}

// cloneOfTheWorkTree is a git repository (a .git directory: the go command
// stamps no commit in a git worktree) holding this work tree's files as
// they are, committed.
func cloneOfTheWorkTree(t *testing.T) string {
	t.Helper()
	root := strings.TrimSpace(command(t, ".", "git", "rev-parse", "--show-toplevel"))
	src := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(command(t, root, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"), "\x00"), "\x00") {
		from := filepath.Join(root, f)
		info, err := os.Lstat(from)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(src, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, info.Mode()&fs.ModePerm); err != nil {
			t.Fatal(err)
		}
	}
	command(t, src, "git", "init", "-q")
	command(t, src, "git", "add", "-A")
	command(t, src, "git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "the work tree")
	return src
}

// command runs a command in dir and returns its stdout.
func command(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if e, ok := err.(*exec.ExitError); ok {
			stderr = e.Stderr
		}
		t.Fatalf("%s %s: %v\n%s", name, args, err, stderr)
	}
	return string(b)
}
