package dedup_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/meshkit/mesh/internal/dedup"
)

// A module's handler runs once per event id, however often the event is
// delivered.
func Example() {
	stateDir, err := os.MkdirTemp("", "mesh-state-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(stateDir)

	set, err := dedup.Open(filepath.Join(stateDir, "dedup", "umami.log"), dedup.Options{Retention: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close()

	deliver := func(eventID string) {
		seen, err := set.Seen(eventID)
		if err != nil {
			fmt.Println("refused:", err)
			return
		}
		if seen {
			fmt.Println("ack without running the handler:", eventID)
			return
		}
		fmt.Println("run the handler:", eventID)
		if err := set.Record(eventID, dedup.NoDigest); err != nil {
			log.Print(err) // at worst a redelivery runs the handler again
		}
	}

	deliver("01KB3ZQ5T8WJ3X6M0G9H2C4N7P")
	deliver("01KB3ZQ5T8WJ3X6M0G9H2C4N7P") // a broker redelivery
	deliver("not-an-id")
	// Output:
	// run the handler: 01KB3ZQ5T8WJ3X6M0G9H2C4N7P
	// ack without running the handler: 01KB3ZQ5T8WJ3X6M0G9H2C4N7P
	// refused: dedup: event id is not a ULID: "not-an-id": ulid: bad data size when unmarshaling
}

// A Set survives a restart: the ids recorded before are still seen.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "mesh-state-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "umami.log")

	set, err := dedup.Open(path, dedup.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := set.Record("01KB3ZQ5T8WJ3X6M0G9H2C4N7P", dedup.NoDigest); err != nil {
		log.Fatal(err)
	}
	set.Close()

	set, err = dedup.Open(path, dedup.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close()
	seen, _ := set.Seen("01KB3ZQ5T8WJ3X6M0G9H2C4N7P")
	fmt.Println(seen, set.Len())
	// Output: true 1
}
