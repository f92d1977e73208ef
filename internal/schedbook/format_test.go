package schedbook

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/meshkit/mesh/internal/stateformat"
)

// TestFormat: a book of a newer format (a later release's, before a
// rollback) is refused with stateformat.ErrNewer, and neither moved aside
// nor remade, as a broken one is.
func TestFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "delays.db")
	b, _, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.db.Update(func(tx *bolt.Tx) error { return stateformat.SetBolt(tx, stateformat.DelaysBook.Version+1) }); err != nil {
		t.Fatal(err)
	}
	b.Close()
	_, remade, err := Open(path)
	if !errors.Is(err, stateformat.ErrNewer) || remade {
		t.Fatalf("a book of a newer format: %v (remade %v), want stateformat.ErrNewer", err, remade)
	}
	if _, err := os.Stat(path + ".broken"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the newer book was moved aside: %v", err)
	}
}
