//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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
const killChildEnv = "MESH_DEDUP_KILL_CHILD_LOG"

// TestSIGKILLSurvival runs the test binary as a child that records ids and
// prints each one after Record returned, kills it with SIGKILL mid-stream,
// and checks that every id it printed is Seen when the log is reopened.
func TestSIGKILLSurvival(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		t.Skip("in the child")
	}
	path := filepath.Join(t.TempDir(), "m.log")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSIGKILLChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	const killAfter = 5000
	var printed []string
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

	s := open(t, path, Options{})
	for i, id := range printed {
		ok, err := s.Seen(id)
		if err != nil {
			t.Fatalf("line %d %q: %v", i, id, err)
		}
		if !ok {
			t.Fatalf("id %d of %d (%s) printed after Record returned is not Seen after SIGKILL", i, len(printed), id)
		}
	}
	if size := fileSize(t, path); (size-headerSize)%recordSize != 0 {
		t.Fatalf("log is %d bytes after Open: not aligned", size)
	}
	t.Logf("child printed %d ids before it died; the log holds %d", len(printed), s.Len())
}

// TestSIGKILLChild is the child of TestSIGKILLSurvival: it records ids from
// four goroutines until it is killed, printing each after Record returned.
func TestSIGKILLChild(t *testing.T) {
	path := os.Getenv(killChildEnv)
	if path == "" {
		t.Skip("only run as the child of TestSIGKILLSurvival")
	}
	s, err := Open(path, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				id := ulid.Make().String()
				if err := s.Record(id); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					os.Exit(3)
				}
				fmt.Fprintln(os.Stdout, id) // one write(2) per line
			}
		})
	}
	wg.Wait() // never: the parent kills the process
}
