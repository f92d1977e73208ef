package dispatcher

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFiresFormat: a new record says FiresFormat; one of v0.1.0
// (user_version 0) is read and says it from then on; one of a newer format
// is refused with ErrNewerFormat, naming both, and left as it was.
func TestFiresFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dispatcher.db")
	pragma := func(set int) int {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if set >= 0 {
			if _, err := db.Exec("PRAGMA user_version = " + strconv.Itoa(set)); err != nil {
				t.Fatal(err)
			}
		}
		var v int
		if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	f, err := openFires(path)
	if err != nil {
		t.Fatal(err)
	}
	f.close()
	if v := pragma(-1); v != FiresFormat {
		t.Fatalf("a new record says format %d", v)
	}
	pragma(0) // as v0.1.0 left it
	if f, err = openFires(path); err != nil {
		t.Fatalf("a record of v0.1.0: %v", err)
	}
	f.close()
	if v := pragma(-1); v != FiresFormat {
		t.Fatalf("a record of v0.1.0 says format %d once opened", v)
	}
	pragma(FiresFormat + 1)
	_, err = openFires(path)
	if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "format 2") || !strings.Contains(err.Error(), path) {
		t.Fatalf("a record of a newer format: %v", err)
	}
	if v := pragma(-1); v != FiresFormat+1 {
		t.Errorf("the refused record says format %d", v)
	}
}
