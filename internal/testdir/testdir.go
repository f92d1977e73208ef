// Package testdir gives tests that run meshd as root a temporary directory
// its module processes can reach: where meshd runs as root, every module
// runs as a user of its own (docs/security.md), which t.TempDir's 0700
// directories shut out of the binaries and state dirs placed in them.
package testdir

import (
	"os"
	"path/filepath"
	"testing"
)

// Reachable is t.TempDir, open to every user to pass through and read
// (0755, and so the directory above it that the testing package made):
// what a test puts in it keeps its own mode.
func Reachable(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
