package spool_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/spool"
)

// The lock and crash tests re-run this test binary as a child process that
// opens a spool; these variables tell TestMain which part to play.
const (
	envHelper  = "SPOOL_TEST_HELPER" // "hold" or "append"
	envPath    = "SPOOL_TEST_PATH"
	envWorkers = "SPOOL_TEST_WORKERS" // appending goroutines, for "append"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envHelper) {
	case "":
		os.Exit(m.Run())
	case "hold":
		os.Exit(helperHold(os.Getenv(envPath)))
	case "append":
		workers, _ := strconv.Atoi(os.Getenv(envWorkers))
		os.Exit(helperAppend(os.Getenv(envPath), max(workers, 1)))
	default:
		fmt.Fprintf(os.Stderr, "unknown %s %q\n", envHelper, os.Getenv(envHelper))
		os.Exit(2)
	}
}

// helperHold opens the spool, says "ready" and holds it until its stdin
// closes (the test died) or a minute passed; the test kills it first.
func helperHold(path string) int {
	s, err := spool.Open(path, spool.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
	}
	return 0
}

// helperAppend appends records "<worker> <i>" from each worker goroutine and,
// after each Append returns, prints the same line in one write. It stops
// after a minute; the test kills it long before.
func helperAppend(path string, workers int) int {
	s, err := spool.Open(path, spool.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	deadline := time.Now().Add(time.Minute)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				line := fmt.Sprintf("%d %d", w, i)
				if _, err := s.Append([]byte(line)); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				os.Stdout.WriteString(line + "\n") // one write: lines do not interleave
			}
		})
	}
	wg.Wait()
	return 0
}

// helper starts this test binary as a child process playing role on the
// spool at path, and returns it with its stdout. The child is killed (by
// its PID) and waited for when the test ends, if it is still running.
func helper(t *testing.T, role, path string, workers int) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+role, envPath+"="+path, envWorkers+"="+strconv.Itoa(workers))
	cmd.Stderr = &syncBuffer{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		cancel()
		if t.Failed() {
			t.Logf("child %s stderr:\n%s", role, cmd.Stderr)
		}
	})
	return cmd, bufio.NewScanner(stdout)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func open(t testing.TB, path string, opts spool.Options) *spool.Spool {
	t.Helper()
	s, err := spool.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func all(t testing.TB, s *spool.Spool) []spool.Record {
	t.Helper()
	recs, err := s.Oldest(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func record(i int) []byte { return []byte(fmt.Sprintf("record %d", i)) }

// checkSequence checks that recs hold record(want[0]), record(want[1]), ...
// with strictly increasing Seqs.
func checkSequence(t *testing.T, recs []spool.Record, want []int) {
	t.Helper()
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		if i > 0 && r.Seq <= recs[i-1].Seq {
			t.Fatalf("record %d has seq %d after seq %d", i, r.Seq, recs[i-1].Seq)
		}
		if !bytes.Equal(r.Data, record(want[i])) {
			t.Fatalf("record %d (seq %d) is %q, want %q", i, r.Seq, r.Data, record(want[i]))
		}
	}
}

func count(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func TestAppendKeepsOrderAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := open(t, path, spool.Options{})
	const n = 300
	var size int64
	var last uint64
	for i := range n {
		seq, err := s.Append(record(i))
		if err != nil {
			t.Fatal(err)
		}
		if seq <= last {
			t.Fatalf("Append %d returned seq %d after seq %d", i, seq, last)
		}
		last = seq
		size += int64(len(record(i)))
	}
	checkSequence(t, all(t, s), count(n))
	if s.Len() != n || s.Bytes() != size {
		t.Fatalf("Len, Bytes = %d, %d; want %d, %d", s.Len(), s.Bytes(), n, size)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, spool.Options{})
	if s.Len() != n || s.Bytes() != size {
		t.Fatalf("after reopen Len, Bytes = %d, %d; want %d, %d", s.Len(), s.Bytes(), n, size)
	}
	checkSequence(t, all(t, s), count(n))
	seq, err := s.Append(record(n))
	if err != nil {
		t.Fatal(err)
	}
	if seq <= last {
		t.Fatalf("after reopen Append returned seq %d, not above %d", seq, last)
	}
	checkSequence(t, all(t, s), count(n+1))

	first, err := s.Oldest(10)
	if err != nil {
		t.Fatal(err)
	}
	checkSequence(t, first, count(10))
}

func TestOldestReturnsCopies(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "spool.db"), spool.Options{})
	data := []byte("abc")
	if _, err := s.Append(data); err != nil {
		t.Fatal(err)
	}
	data[0] = 'X' // Append must not keep the caller's slice
	recs := all(t, s)
	recs[0].Data[1] = 'Y' // nor Oldest hand out the store's memory
	if got := all(t, s)[0].Data; string(got) != "abc" {
		t.Fatalf("stored record is %q, want %q", got, "abc")
	}
	if recs, err := s.Oldest(0); err != nil || len(recs) != 0 {
		t.Fatalf("Oldest(0) = %v, %v; want nothing", recs, err)
	}
}

func TestEmptyRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := open(t, path, spool.Options{})
	seq, err := s.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append([]byte{}); err != nil {
		t.Fatal(err)
	}
	recs := all(t, s)
	if len(recs) != 2 || len(recs[0].Data) != 0 || len(recs[1].Data) != 0 || s.Len() != 2 || s.Bytes() != 0 {
		t.Fatalf("got %v, Len %d, Bytes %d; want two empty records", recs, s.Len(), s.Bytes())
	}
	if err := s.Delete(seq); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d after deleting an empty record, want 1", s.Len())
	}
}

func TestConcurrentAppends(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "spool.db"), spool.Options{})
	const goroutines, each = 64, 20
	seqs := make([][]uint64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				seq, err := s.Append(record(g*each + i))
				if err != nil {
					t.Error(err)
					return
				}
				seqs[g] = append(seqs[g], seq)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	stored := map[uint64]string{}
	for _, r := range all(t, s) {
		stored[r.Seq] = string(r.Data)
	}
	if len(stored) != goroutines*each || s.Len() != goroutines*each {
		t.Fatalf("stored %d records, Len %d; want %d", len(stored), s.Len(), goroutines*each)
	}
	for g := range goroutines {
		for i, seq := range seqs[g] {
			if i > 0 && seq <= seqs[g][i-1] {
				t.Fatalf("goroutine %d: Append %d returned seq %d after %d", g, i, seq, seqs[g][i-1])
			}
			if want := string(record(g*each + i)); stored[seq] != want {
				t.Fatalf("seq %d holds %q, want %q", seq, stored[seq], want)
			}
		}
	}
}

func TestDeleteThenReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := open(t, path, spool.Options{})
	var seqs []uint64
	for i := range 10 {
		seq, err := s.Append(record(i))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	// Even records, one twice, plus Seqs never handed out.
	if err := s.Delete(seqs[0], seqs[2], seqs[4], seqs[4], seqs[6], seqs[8], 0, 1<<40); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(); err != nil {
		t.Fatal(err)
	}
	odd := []int{1, 3, 5, 7, 9}
	wantBytes := int64(0)
	for _, i := range odd {
		wantBytes += int64(len(record(i)))
	}
	checkSequence(t, all(t, s), odd)
	if s.Len() != 5 || s.Bytes() != wantBytes {
		t.Fatalf("Len, Bytes = %d, %d; want 5, %d", s.Len(), s.Bytes(), wantBytes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, spool.Options{})
	checkSequence(t, all(t, s), odd)
	if s.Len() != 5 || s.Bytes() != wantBytes {
		t.Fatalf("after reopen Len, Bytes = %d, %d; want 5, %d", s.Len(), s.Bytes(), wantBytes)
	}
	// Deleting everything does not reset the sequence either.
	if err := s.Delete(seqs...); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("Len, Bytes = %d, %d after deleting all; want 0, 0", s.Len(), s.Bytes())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, spool.Options{})
	seq, err := s.Append(record(10))
	if err != nil {
		t.Fatal(err)
	}
	if seq <= seqs[9] {
		t.Fatalf("Append after deleting all and reopening returned seq %d, not above %d", seq, seqs[9])
	}
}

func TestFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := open(t, path, spool.Options{MaxBytes: 100})
	rec := bytes.Repeat([]byte("x"), 10)
	var seqs []uint64
	for range 10 {
		seq, err := s.Append(rec)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	_, err := s.Append([]byte("y"))
	if !errors.Is(err, spool.ErrFull) {
		t.Fatalf("Append at the bound: %v, want ErrFull", err)
	}
	for _, want := range []string{path, "100 of 100 bytes", "1-byte"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ErrFull message %q does not contain %q", err, want)
		}
	}
	if s.Len() != 10 || s.Bytes() != 100 || len(all(t, s)) != 10 {
		t.Fatalf("a refused Append changed the spool: Len %d, Bytes %d", s.Len(), s.Bytes())
	}
	if _, err := s.Append(nil); err != nil {
		t.Fatalf("an empty record should fit a full spool: %v", err)
	}

	if err := s.Delete(seqs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(rec); err != nil {
		t.Fatalf("Append after Delete made room: %v", err)
	}
	if _, err := s.Append([]byte("y")); !errors.Is(err, spool.ErrFull) {
		t.Fatalf("Append at the bound again: %v, want ErrFull", err)
	}
	if err := s.Delete(seqs[1:]...); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(make([]byte, 101)); !errors.Is(err, spool.ErrFull) {
		t.Fatalf("a record larger than MaxBytes: %v, want ErrFull", err)
	}
	if _, err := s.Append(make([]byte, 90)); err != nil {
		t.Fatal(err)
	}
	if s.Bytes() != 100 {
		t.Fatalf("Bytes = %d, want 100", s.Bytes())
	}

	// The bound is an option, not a property of the file.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, spool.Options{MaxBytes: 200})
	if _, err := s.Append(rec); err != nil {
		t.Fatalf("Append after reopening with a larger bound: %v", err)
	}
}

// TestFullConcurrent checks the bound is exact when many goroutines race
// for the last bytes while records are deleted.
func TestFullConcurrent(t *testing.T) {
	const recSize, fit = 10, 50
	s := open(t, filepath.Join(t.TempDir(), "spool.db"), spool.Options{MaxBytes: recSize * fit})
	var mu sync.Mutex
	stored, full := 0, 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 5 {
				_, err := s.Append(make([]byte, recSize))
				mu.Lock()
				switch {
				case err == nil:
					stored++
				case errors.Is(err, spool.ErrFull):
					full++
				default:
					t.Error(err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if stored != fit || full != 64*5-fit {
		t.Fatalf("%d Appends stored, %d full; want %d and %d", stored, full, fit, 64*5-fit)
	}
	if s.Len() != fit || s.Bytes() != recSize*fit || len(all(t, s)) != fit {
		t.Fatalf("Len %d, Bytes %d; want %d, %d", s.Len(), s.Bytes(), fit, recSize*fit)
	}
}

// TestConcurrentAppendAndDelete runs appenders against a resender that
// deletes what it reads, then checks Len and Bytes against a fresh count.
func TestConcurrentAppendAndDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s := open(t, path, spool.Options{MaxBytes: 4000})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				_, err := s.Append(record(g*1_000_000 + i))
				if err != nil && !errors.Is(err, spool.ErrFull) {
					t.Error(err)
					return
				}
			}
		})
	}
	deleted := 0
	wg.Go(func() {
		for ctx.Err() == nil {
			recs, err := s.Oldest(7)
			if err != nil {
				t.Error(err)
				return
			}
			var seqs []uint64
			for _, r := range recs {
				seqs = append(seqs, r.Seq)
			}
			if err := s.Delete(seqs...); err != nil {
				t.Error(err)
				return
			}
			deleted += len(seqs)
			if n, b := s.Len(), s.Bytes(); n < 0 || b < 0 || b > 4000 {
				t.Errorf("Len %d, Bytes %d out of range", n, b)
				return
			}
		}
	})
	wg.Wait()
	if deleted == 0 {
		t.Error("the resender deleted nothing")
	}
	n, b := s.Len(), s.Bytes()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, spool.Options{MaxBytes: 4000})
	if s.Len() != n || s.Bytes() != b {
		t.Fatalf("counted Len %d, Bytes %d; the file holds %d, %d", n, b, s.Len(), s.Bytes())
	}
}

func TestClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	s, err := spool.Open(path, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(record(0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
	if _, err := s.Append(record(1)); !errors.Is(err, spool.ErrClosed) {
		t.Errorf("Append after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Oldest(1); !errors.Is(err, spool.ErrClosed) {
		t.Errorf("Oldest after Close: %v, want ErrClosed", err)
	}
	if err := s.Delete(1); !errors.Is(err, spool.ErrClosed) {
		t.Errorf("Delete after Close: %v, want ErrClosed", err)
	}
	if s.Len() != 1 {
		t.Errorf("Len after Close = %d, want the last count 1", s.Len())
	}
	// Closing released the file.
	s = open(t, path, spool.Options{LockTimeout: 100 * time.Millisecond})
	checkSequence(t, all(t, s), count(1))
}

func TestOpenCreatesDirsAndFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "node-a")
	path := filepath.Join(dir, "spool.db")
	open(t, path, spool.Options{})
	for _, c := range []struct {
		path string
		perm os.FileMode
	}{{dir, 0o700}, {filepath.Dir(dir), 0o700}, {path, 0o600}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.perm {
			t.Errorf("%s has mode %v, want %v", c.path, fi.Mode().Perm(), c.perm)
		}
	}
}

func TestOpenNotASpool(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	if err := os.WriteFile(path, bytes.Repeat([]byte("not bbolt"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := spool.Open(path, spool.Options{})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a file that is not a spool: %v, want an error naming it", err)
	}
	// The failed Open did not leave the path marked open.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	open(t, path, spool.Options{})
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		opts spool.Options
		want []string // substrings of the error; none: valid
	}{
		{"zero", spool.Options{}, nil},
		{"set", spool.Options{MaxBytes: 1, LockTimeout: time.Millisecond}, nil},
		{"negative MaxBytes", spool.Options{MaxBytes: -1}, []string{"MaxBytes", "negative"}},
		{"negative LockTimeout", spool.Options{LockTimeout: -time.Second}, []string{"LockTimeout", "negative"}},
		{"both", spool.Options{MaxBytes: -1, LockTimeout: -1}, []string{"MaxBytes", "LockTimeout"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.opts.Validate()
			if (err != nil) != (len(c.want) > 0) {
				t.Fatalf("Validate() = %v, want error: %v", err, len(c.want) > 0)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not name %q", err, w)
				}
			}
			if err != nil {
				if _, openErr := spool.Open(filepath.Join(t.TempDir(), "spool.db"), c.opts); openErr == nil {
					t.Error("Open accepted invalid options")
				}
			}
		})
	}
}

func TestOpenTwiceInOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	open(t, path, spool.Options{})
	start := time.Now()
	_, err := spool.Open(path, spool.Options{LockTimeout: 5 * time.Second})
	if !errors.Is(err, spool.ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "this process") {
		t.Errorf("%q does not say this process holds it", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("second Open took %v; it should not wait for the lock", d)
	}
	// The same file by another name.
	if _, err := spool.Open(filepath.Join(filepath.Dir(path), ".", "spool.db"), spool.Options{}); !errors.Is(err, spool.ErrLocked) {
		t.Fatalf("second Open by another name: %v, want ErrLocked", err)
	}
}

func TestLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.db")
	child, out := helper(t, "hold", path, 0)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("child did not open the spool: %q %v", out.Text(), out.Err())
	}

	const timeout = 300 * time.Millisecond
	start := time.Now()
	_, err := spool.Open(path, spool.Options{LockTimeout: timeout})
	elapsed := time.Since(start)
	if !errors.Is(err, spool.ErrLocked) {
		t.Fatalf("Open while another process holds it: %v, want ErrLocked", err)
	}
	for _, want := range []string{path, "another process", "meshd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ErrLocked message %q does not contain %q", err, want)
		}
	}
	if elapsed < timeout/2 || elapsed > timeout+2*time.Second {
		t.Errorf("Open gave up after %v, want about %v", elapsed, timeout)
	}

	// Once the holder is gone its lock is too.
	if err := syscall.Kill(child.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	open(t, path, spool.Options{LockTimeout: timeout})
}

// TestSurvivesSIGKILL kills a child process while it appends and checks
// that every record whose Append had returned is there after reopening, in
// order. A record whose Append had not returned yet may be there too.
func TestSurvivesSIGKILL(t *testing.T) {
	for _, workers := range []int{1, 8} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "spool.db")
			child, out := helper(t, "append", path, workers)
			returned := make([]int, workers) // Appends returned, per worker
			lines := 0
			read := func() {
				var w, i int
				if _, err := fmt.Sscanf(out.Text(), "%d %d", &w, &i); err != nil || w >= workers {
					t.Fatalf("bad line from child: %q", out.Text())
				}
				if i != returned[w] {
					t.Fatalf("worker %d printed %d after %d", w, i, returned[w]-1)
				}
				returned[w]++
				lines++
			}
			for lines < 200 && out.Scan() {
				read()
			}
			if lines < 200 {
				t.Fatalf("child stopped after %d appends: %v", lines, out.Err())
			}
			if err := syscall.Kill(child.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for out.Scan() { // what it printed before it died
				read()
			}
			err := child.Wait()
			if ws, ok := child.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed by SIGKILL: %v", err)
			}

			s := open(t, path, spool.Options{})
			got := make([]int, workers) // records found, per worker
			var last uint64
			for _, r := range all(t, s) {
				var w, i int
				if _, err := fmt.Sscanf(string(r.Data), "%d %d", &w, &i); err != nil || w >= workers {
					t.Fatalf("bad record %q", r.Data)
				}
				if i != got[w] || r.Seq <= last {
					t.Fatalf("record %q (seq %d) out of order: want worker %d's record %d after seq %d", r.Data, r.Seq, w, got[w], last)
				}
				got[w]++
				last = r.Seq
			}
			for w := range workers {
				// At most one Append per worker was in progress.
				if got[w] < returned[w] || got[w] > returned[w]+1 {
					t.Errorf("worker %d: %d Appends returned, %d records found", w, returned[w], got[w])
				}
			}
			t.Logf("%d Appends returned before SIGKILL, %d records found", lines, s.Len())
		})
	}
}

func BenchmarkAppendSequential(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "spool.db"), spool.Options{MaxBytes: 1 << 40})
	data := bytes.Repeat([]byte("e"), 256)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := s.Append(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "spool.db"), spool.Options{MaxBytes: 1 << 40})
	data := bytes.Repeat([]byte("e"), 256)
	b.SetBytes(int64(len(data)))
	b.SetParallelism(32) // 32 emitting goroutines per CPU
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Append(data); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkOldestDelete drains a spool the way the resender does: read the
// oldest 100, delete them, repeat. One op is one record.
func BenchmarkOldestDelete(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "spool.db"), spool.Options{MaxBytes: 1 << 40})
	data := bytes.Repeat([]byte("e"), 256)
	// Fill with parallel appends, which share fsyncs.
	var wg sync.WaitGroup
	const fillers = 64
	for f := range fillers {
		wg.Go(func() {
			for i := f; i < b.N; i += fillers {
				if _, err := s.Append(data); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for done := 0; done < b.N; {
		recs, err := s.Oldest(100)
		if err != nil {
			b.Fatal(err)
		}
		seqs := make([]uint64, len(recs))
		for i, r := range recs {
			seqs[i] = r.Seq
		}
		if err := s.Delete(seqs...); err != nil {
			b.Fatal(err)
		}
		done += len(recs)
	}
	b.StopTimer()
	if s.Len() != 0 {
		b.Fatalf("%d records left", s.Len())
	}
}
