package dedup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/stateformat"
)

// TestNewerFormat: a log whose header says a later format (a later
// release's, before a rollback) is refused with ErrFormat and
// stateformat.ErrNewer, naming both formats, and left untouched.
func TestNewerFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	h := header
	h[headerSize-1]++
	if err := os.WriteFile(path, h[:], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrFormat) || !errors.Is(err, stateformat.ErrNewer) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("a log of a newer format: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != string(h[:]) {
		t.Errorf("the refused log changed: %q", b)
	}
}
