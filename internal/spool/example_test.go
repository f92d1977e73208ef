package spool_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshkit/mesh/internal/spool"
)

// Spool events while the broker is away, then resend them in order and
// delete each one once the broker confirmed it.
func Example() {
	stateDir, err := os.MkdirTemp("", "meshd-state-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(stateDir)

	s, err := spool.Open(filepath.Join(stateDir, "spool.db"), spool.Options{MaxBytes: 16})
	if err != nil {
		panic(err) // errors.Is(err, spool.ErrLocked): another meshd has this state dir
	}
	defer s.Close()

	for _, event := range []string{"created", "updated", "deleted"} {
		if _, err := s.Append([]byte(event)); errors.Is(err, spool.ErrFull) {
			fmt.Println("full, not spooled:", event)
		}
	}
	fmt.Println(s.Len(), "events,", s.Bytes(), "bytes spooled")

	recs, err := s.Oldest(10)
	if err != nil {
		panic(err)
	}
	for _, r := range recs {
		fmt.Printf("resend %d %s\n", r.Seq, r.Data) // publish, wait for the confirm, then:
		if err := s.Delete(r.Seq); err != nil {
			panic(err)
		}
	}
	fmt.Println(s.Len(), "events spooled")
	// Output:
	// full, not spooled: deleted
	// 2 events, 14 bytes spooled
	// resend 1 created
	// resend 2 updated
	// 0 events spooled
}
