// Package releasetest builds the binaries of an earlier mesh release from
// the git history, for the tests that hold the compatibility promise
// (docs/compatibility.md): a module binary of the previous release runs
// under this meshd, a node of the previous release and one of this
// interoperate, and the previous release's files are read.
//
// A release is found in CHANGELOG.md: the newest section below the one in
// progress whose "Commit:" line names its commit. Its source is taken from
// the repository's history with git archive into a cache directory of its
// own (os.TempDir()/mesh-release-cache-UID/<release>-<commit>, shared by the
// test processes of a run and the runs after it, as the go command's build
// cache is), and its packages are built there, once each.
//
//	prev := releasetest.Previous(t)
//	bin := releasetest.Build(t, prev, "./test/conformance/module")
//
// A clone without that commit (a shallow one) fails the test with what to
// do: the promise is tested on every commit, not skipped.
package releasetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Release is a release of mesh as CHANGELOG.md records it.
type Release struct {
	// Version is its name, as "v0.1.0".
	Version string
	// Commit is the full hash of the commit it was made from.
	Commit string
}

// Previous is the newest release CHANGELOG.md records with a commit: the
// release before the one in progress.
func Previous(t testing.TB) Release {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Releases(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) == 0 {
		t.Fatal("releasetest: CHANGELOG.md records no release with a Commit: line")
	}
	return rs[0]
}

var (
	sectionLine = regexp.MustCompile(`^## \[(v[0-9]+\.[0-9]+\.[0-9]+)\]`)
	commitLine  = regexp.MustCompile(`^Commit: ([0-9a-f]{40})\s*$`)
)

// Releases reads the releases a changelog records with a commit, newest
// first.
func Releases(changelog string) ([]Release, error) {
	f, err := os.Open(changelog)
	if err != nil {
		return nil, fmt.Errorf("releasetest: %w", err)
	}
	defer f.Close()
	var out []Release
	var current string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := sectionLine.FindStringSubmatch(sc.Text()); m != nil {
			current = m[1]
			continue
		}
		if m := commitLine.FindStringSubmatch(sc.Text()); m != nil && current != "" {
			out = append(out, Release{Version: current, Commit: m[1]})
			current = ""
		}
	}
	return out, sc.Err()
}

// Root is the repository's top directory: the git work tree the tests run
// in.
func Root() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("releasetest: the tests that build an earlier release need the git history (git rev-parse: %w)", err)
	}
	return strings.TrimSpace(string(out)), nil
}

var (
	builtMu sync.Mutex
	built   = map[string]string{} // by release commit and package: the binary
)

// Build builds the main package pkg (a path relative to the repository's
// top, as "./cmd/meshd") of release r, and returns the binary's path; it
// builds each once per process, and reuses a binary an earlier process
// built. The binary and the directories above it can be read and run by
// every user (a module process may run as a user of its own).
func Build(t testing.TB, r Release, pkg string) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	key := r.Commit + " " + pkg
	if bin, ok := built[key]; ok {
		return bin
	}
	bin, err := build(r, pkg)
	if err != nil {
		t.Fatal(err)
	}
	built[key] = bin
	return bin
}

// build is Build, under a lock on the release's cache directory that
// other test processes of the run take too.
func build(r Release, pkg string) (string, error) {
	cache, err := cacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, r.Version+"-"+r.Commit[:12])
	unlock, err := lock(dir + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := extract(r, dir); err != nil {
		return "", err
	}
	name := strings.NewReplacer("./", "", "/", "_").Replace(pkg)
	bin := filepath.Join(dir, "bin", name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp := bin + ".partial"
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("releasetest: build %s of %s: %v\n%s", pkg, r.Version, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("releasetest: %w", err)
	}
	return bin, nil
}

// cacheDir is the user's release cache, os.TempDir()/mesh-release-cache-UID,
// made if missing. It is in the temporary directory, readable by all, so
// that module binaries built there run as the per-module users of the tests
// (a home directory is not theirs to read); and it is the user's alone: a
// directory of that name that another user made, or may write, or a link,
// is refused, since its binaries would run as this user.
func cacheDir() (string, error) {
	cache := filepath.Join(os.TempDir(), fmt.Sprintf("mesh-release-cache-%d", os.Getuid()))
	if err := os.Mkdir(cache, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("releasetest: %w", err)
	}
	fi, err := os.Lstat(cache)
	if err != nil {
		return "", fmt.Errorf("releasetest: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("releasetest: %s is not a directory of this user's that only it may write (mode %v): remove it", cache, fi.Mode())
	}
	return cache, nil
}

// extract puts r's source in dir, unless an earlier process did.
func extract(r Release, dir string) error {
	done := filepath.Join(dir, ".extracted")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	root, err := Root()
	if err != nil {
		return err
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").Run(); err != nil {
		return fmt.Errorf("releasetest: commit %s of %s is not in this clone (a shallow clone? git fetch --unshallow): %w", r.Commit, r.Version, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("releasetest: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return fmt.Errorf("releasetest: %w", err)
	}
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", r.Commit)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return fmt.Errorf("releasetest: %w", err)
	}
	untar.Stdin = pipe
	var stderr strings.Builder
	archive.Stderr, untar.Stderr = &stderr, &stderr
	if err := untar.Start(); err != nil {
		return fmt.Errorf("releasetest: tar: %w", err)
	}
	if err := errors.Join(archive.Run(), untar.Wait()); err != nil {
		return fmt.Errorf("releasetest: git archive %s of %s: %w\n%s", r.Commit, r.Version, err, stderr.String())
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return fmt.Errorf("releasetest: %w", err)
	}
	return nil
}

// lock takes an exclusive lock on path (made if missing), shared with the
// other processes of the run, until the returned func is called.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("releasetest: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("releasetest: lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
