//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// killChildEnv names the log the child process of TestSIGKILLSurvival
// records into; the test binary runs as that child when it is set.
// killModeEnv says how: "concurrent" (four goroutines, default options) or
// "compacting" (one goroutine, a small MaxEntries and compaction every
// thousand records or so, so that the kill often lands in a compaction).
const (
	killChildEnv = "MESH_DEDUP_KILL_CHILD_LOG"
	killModeEnv  = "MESH_DEDUP_KILL_CHILD_MODE"
)

// compactingOptions are the options of the "compacting" child.
var compactingOptions = Options{MaxEntries: 1000, compactMin: 1000, Logger: quiet}

// TestSIGKILLSurvival runs the test binary as a child that records ids and
// prints each one after Record returned, kills it with SIGKILL mid-stream,
// and checks that every id it printed (that MaxEntries lets it keep) is Seen
// when the log is reopened.
func TestSIGKILLSurvival(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		t.Skip("in the child")
	}
	t.Run("concurrent", func(t *testing.T) {
		printed, path := runKilledChild(t, "concurrent", 5000)
		s := open(t, path, Options{})
		checkAllSeen(t, s, printed)
		t.Logf("child printed %d ids before it died; the log holds %d", len(printed), s.Len())
	})
	t.Run("batched", func(t *testing.T) {
		printed, path := runKilledChild(t, "batched", 5000)
		s := open(t, path, Options{})
		checkAllSeen(t, s, printed)
	})
	t.Run("compacting", func(t *testing.T) {
		inCompaction := 0
		for range 5 {
			printed, path := runKilledChild(t, "compacting", 4000+rand.IntN(3000))
			if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) > 2 {
				inCompaction++ // a temporary file shows the kill hit one
			}
			s := open(t, path, compactingOptions)
			// One goroutine: the ids are recorded in the order printed,
			// and at most one more was recorded after the last printed.
			keep := compactingOptions.MaxEntries - 1
			checkAllSeen(t, s, printed[len(printed)-keep:])
			checkInvariants(t, s)
			if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 2 {
				t.Fatalf("%d files next to the log and its digests after Open, want none", len(entries)-2)
			}
		}
		t.Logf("%d of 5 kills landed in a compaction", inCompaction)
	})
}

// runKilledChild runs the child in mode, kills it with SIGKILL by its pid
// after it printed killAfter ids, and returns every id it printed and the
// path of its log.
func runKilledChild(t *testing.T, mode string, killAfter int) (printed []string, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "m.log")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSIGKILLChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+path, killModeEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	sc := bufio.NewScanner(out)
	for sc.Scan() {
		printed = append(printed, sc.Text())
		if len(printed) == killAfter {
			if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill %d: %v", cmd.Process.Pid, err)
			}
		}
	}
	// Lines the child wrote before it died are still read above.
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child ended with %v, want killed", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	if len(printed) < killAfter {
		t.Fatalf("child printed only %d ids", len(printed))
	}
	return printed, path
}

// checkAllSeen checks that s has seen every id in printed.
func checkAllSeen(t *testing.T, s *Set, printed []string) {
	t.Helper()
	for i, id := range printed {
		ok, err := s.Seen(id)
		if err != nil {
			t.Fatalf("line %d %q: %v", i, id, err)
		}
		if !ok {
			t.Fatalf("id %d of %d (%s) printed after Record returned is not Seen after SIGKILL", i, len(printed), id)
		}
	}
	if size := fileSize(t, s.path); (size-headerSize)%recordSize != 0 {
		t.Fatalf("log is %d bytes after Open: not aligned", size)
	}
}

// TestSIGKILLChild is the child of TestSIGKILLSurvival: it records ids
// until it is killed, printing each after Record returned; in mode
// "batched", four goroutines each Add eight ids and then Flush, printing
// the eight after Flush returned (as the runtime acknowledges a group of
// deliveries once their records are written).
func TestSIGKILLChild(t *testing.T) {
	path := os.Getenv(killChildEnv)
	if path == "" {
		t.Skip("only run as the child of TestSIGKILLSurvival")
	}
	opts, workers := Options{Logger: quiet}, 4
	if os.Getenv(killModeEnv) == "compacting" {
		opts, workers = compactingOptions, 1
	}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	if os.Getenv(killModeEnv) == "batched" {
		for range workers {
			wg.Go(func() {
				for {
					group := ids(8)
					for _, id := range group {
						if err := s.Add(id, NoDigest); err != nil {
							fmt.Fprintln(os.Stderr, "child:", err)
							os.Exit(3)
						}
					}
					if err := s.Flush(); err != nil {
						fmt.Fprintln(os.Stderr, "child:", err)
						os.Exit(3)
					}
					for _, id := range group {
						fmt.Fprintln(os.Stdout, id)
					}
				}
			})
		}
		wg.Wait() // never: the parent kills the process
	}
	for range workers {
		wg.Go(func() {
			for {
				id := ulid.Make().String()
				if err := s.Record(id, NoDigest); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					os.Exit(3)
				}
				fmt.Fprintln(os.Stdout, id) // one write(2) per line
			}
		})
	}
	wg.Wait() // never: the parent kills the process
}
