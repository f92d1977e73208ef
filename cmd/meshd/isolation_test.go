package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

func TestModuleUserByDefault(t *testing.T) {
	c, err := moduleUser("anchor", nodeconfig.Module{Name: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if c != nil {
			t.Fatalf("meshd unprivileged: a module without user: runs as meshd's user, got %+v", c)
		}
		return
	}
	if c == nil || c.UID < dynamicFirst || c.UID > dynamicLast || c.Name != "mesh-billing" {
		t.Fatalf("meshd as root: a module without user: runs as a user of its own, got %+v", c)
	}
	if again, _ := moduleUser("anchor", nodeconfig.Module{Name: "billing", User: "auto"}); again == nil || again.UID != c.UID {
		t.Fatalf("the default is user: auto: %+v and %+v", c, again)
	}
	if root, err := moduleUser("anchor", nodeconfig.Module{Name: "billing", User: "root"}); err != nil || root != nil {
		t.Fatalf("user: root runs as meshd's user, root: %+v %v", root, err)
	}
}

func TestReachable(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	closed := filepath.Join(dir, "closed")
	for d, mode := range map[string]os.FileMode{open: 0o755, closed: 0o700} {
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "bin"), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(open, "data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Someone who is neither the owner nor of the group: others' bits.
	other := runtime.Credential{UID: 65534, GID: 65534}
	if os.Geteuid() == 65534 {
		other = runtime.Credential{UID: 65533, GID: 65533}
	}
	if err := reachable(filepath.Join(open, "bin"), other, 0o1); err != nil {
		t.Errorf("an open path: %v", err)
	}
	err := reachable(filepath.Join(closed, "bin"), other, 0o1)
	if err == nil || !strings.Contains(err.Error(), closed+" (mode 0700") || !strings.Contains(err.Error(), "pass through") {
		t.Errorf("a path through a closed directory: want an error naming %s, got %v", closed, err)
	}
	err = reachable(filepath.Join(open, "data"), other, 0o1)
	if err == nil || !strings.Contains(err.Error(), "execute") {
		t.Errorf("a file that is not executable: want an error, got %v", err)
	}
	// The owner passes by the owner's bits.
	owner := runtime.Credential{UID: uint32(os.Getuid()), GID: 12345}
	if err := reachable(filepath.Join(closed, "bin"), owner, 0o1); err != nil {
		t.Errorf("the owner of the closed directory: %v", err)
	}
}

// TestOwnAllAfterAUserChange (as root): a module directory left by
// another user becomes the module's user's, with all in it.
func TestOwnAllAfterAUserChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changes owners only as root")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "audit.db"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &runtime.Credential{UID: 65534, GID: 65534}
	if err := ownAll(dir, c); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "sub"), filepath.Join(dir, "sub", "audit.db")} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("%s belongs to %d:%d, want 65534:65534", p, st.Uid, st.Gid)
		}
	}
}
