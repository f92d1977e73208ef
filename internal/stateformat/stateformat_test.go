package stateformat

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	f := Format{Name: "spool", Version: 2}
	for _, found := range []int{0, 1, 2} {
		if err := f.Check("/s/spool.db", found); err != nil {
			t.Errorf("format %d: %v", found, err)
		}
	}
	err := f.Check("/s/spool.db", 3)
	if !errors.Is(err, ErrNewer) || !strings.Contains(err.Error(), "spool /s/spool.db is of format 3") || !strings.Contains(err.Error(), "up to 2") {
		t.Errorf("format 3: %v", err)
	}
}
