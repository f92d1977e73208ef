package auditlogger_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshkit/mesh/auditlogger"
)

// FuzzCheckpoint: a checkpoint body from the mesh (anyone on # may send
// one) is read without a panic, and one signed by a logger verifies only
// as it was signed: any change to its bytes that still decodes to another
// checkpoint does not verify.
func FuzzCheckpoint(f *testing.F) {
	signed := auditlogger.SignForTest()
	good, _ := json.Marshal(signed)
	f.Add(good)
	f.Add([]byte(`{"chain":"history","head":"00","public_key":"AAAA","signature":"AAAA"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c auditlogger.Checkpoint
		if json.Unmarshal(b, &c) != nil {
			return
		}
		if !c.Valid() {
			return
		}
		again, _ := json.Marshal(c)
		if !bytes.Equal(again, good) {
			t.Fatalf("a checkpoint that is not the one signed verifies: %s", b)
		}
	})
}

// TestLoadKey: the key is made on first use, mode 0600, and the same one
// is read back; a file that is not a key is refused, not replaced.
func TestLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db.key")
	k1, err := auditlogger.LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v, %v", fi, err)
	}
	k2, err := auditlogger.LoadKey(path)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("read back another key (%v)", err)
	}
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := auditlogger.LoadKey(path); err == nil {
		t.Fatal("a file that is not a key was taken for one")
	}
	if b, _ := os.ReadFile(path); string(b) != "not a key" {
		t.Fatal("the file that is not a key was replaced")
	}
}
