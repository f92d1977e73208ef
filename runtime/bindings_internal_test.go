package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshkit/mesh/internal/stateformat"
)

// TestBindingRecordFormats: a record of format 1 (a JSON list, v0.1.0's and
// this release's) is read; one of a later format (an object that says it)
// is refused with stateformat.ErrNewer.
func TestBindingRecordFormats(t *testing.T) {
	r := bindingRecord{dir: t.TempDir()}
	if err := r.store("n.m.events", []string{"b.#", "a.*"}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := r.recorded("n.m.events")
	if err != nil || !ok || len(got) != 2 || got[0] != "a.*" {
		t.Fatalf("recorded: %v %v %v", got, ok, err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "bindings", "n.m.events.json"), []byte(`{"format":2,"patterns":["a.*"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.recorded("n.m.events"); !errors.Is(err, stateformat.ErrNewer) {
		t.Fatalf("a record of a newer format: %v", err)
	}
}
