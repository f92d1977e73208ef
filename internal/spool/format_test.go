package spool_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/meshkit/mesh/internal/spool"
	"github.com/meshkit/mesh/internal/stateformat"
)

// TestFormat: a spool of v0.1.0 (no format record) opens; one a later
// release wrote (a newer format) is refused with stateformat.ErrNewer and
// left as it was.
func TestFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s, err := spool.Open(path, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	set := func(v int) {
		t.Helper()
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(func(tx *bolt.Tx) error {
			if v == 0 {
				return tx.DeleteBucket([]byte("meta")) // as v0.1.0 left it
			}
			return stateformat.SetBolt(tx, v)
		}); err != nil {
			t.Fatal(err)
		}
	}
	set(0)
	if s, err = spool.Open(path, spool.Options{}); err != nil {
		t.Fatalf("a spool of v0.1.0: %v", err)
	}
	s.Close()
	set(stateformat.Spool.Version + 1)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spool.Open(path, spool.Options{}); !errors.Is(err, stateformat.ErrNewer) {
		t.Fatalf("a spool of a newer format: %v, want stateformat.ErrNewer", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("the refused spool changed")
	}
}
