package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFormatVersion: a new database says FormatVersion; one of v0.1.0
// (user_version 0) is read and says it from then on; one of a newer
// format (a later release's, before a rollback) is refused with
// ErrNewerFormat, naming both formats, and left as it was.
func TestFormatVersion(t *testing.T) {
	dir := t.TempDir()
	version := func(path string) int {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v int
		if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	setVersion := func(path string, v int) {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec("PRAGMA user_version = " + strconv.Itoa(v)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "audit.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(context.Background(), Event{ID: "01J00000000000000000000000", Type: "module.a.b", Source: "a", Node: "n", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if v := version(path); v != FormatVersion {
		t.Fatalf("a new database says format %d, want %d", v, FormatVersion)
	}
	setVersion(path, 0) // as v0.1.0 left it
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("a database of v0.1.0: %v", err)
	}
	s.Close()
	if v := version(path); v != FormatVersion {
		t.Fatalf("a database of v0.1.0 says format %d once opened, want %d", v, FormatVersion)
	}
	setVersion(path, FormatVersion+1)
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "format 2") || !strings.Contains(err.Error(), "up to 1") {
		t.Fatalf("a database of a newer format: %v, want ErrNewerFormat naming both", err)
	}
	if v := version(path); v != FormatVersion+1 {
		t.Errorf("the refused database says format %d, want it left at %d", v, FormatVersion+1)
	}
}
