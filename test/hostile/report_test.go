package hostile

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// reportLine is one line of evilmodule's report.
type reportLine struct {
	Attack, Step, Got, Err string
}

// reports collects what a hostile module reports: it listens on a unix
// socket (the module's "report" setting) and takes each JSON line the
// module writes, so a test waits for a report as it arrives.
type reports struct {
	path    string
	mu      sync.Mutex
	lines   []reportLine
	changed chan struct{} // closed and replaced at each line
}

// newReports listens at dir/name.sock, for a module of any user (the
// socket is 0666), until the test ends.
func newReports(t *testing.T, dir, name string) *reports {
	t.Helper()
	r := &reports{path: filepath.Join(dir, name+".sock"), changed: make(chan struct{})}
	ln, err := net.Listen("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r.path, 0o666); err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				go func() { <-done; c.Close() }()
				sc := bufio.NewScanner(c)
				sc.Buffer(make([]byte, 1<<20), 16<<20)
				for sc.Scan() {
					var l reportLine
					if json.Unmarshal(sc.Bytes(), &l) == nil {
						r.add(l)
					}
				}
			}()
		}
	}()
	return r
}

func (r *reports) add(l reportLine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, l)
	close(r.changed)
	r.changed = make(chan struct{})
}

// all is what was reported so far, and a channel closed at the next line.
func (r *reports) all() ([]reportLine, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reportLine(nil), r.lines...), r.changed
}

// readReport is what r holds now.
func readReport(r *reports) []reportLine {
	lines, _ := r.all()
	return lines
}

// waitReport waits until r holds a line of step, and returns the lines so
// far; stop, if it ends first, fails the test with why.
func waitReport(t *testing.T, r *reports, step string, stop ...<-chan error) []reportLine {
	t.Helper()
	timeout := time.After(60 * time.Second)
	var exited <-chan error
	if len(stop) > 0 {
		exited = stop[0]
	}
	for {
		lines, changed := r.all()
		if has(lines, step) {
			return lines
		}
		select {
		case <-changed:
		case err := <-exited:
			t.Fatalf("meshd exited before the module reported %q: %v; it reported %+v", step, err, lines)
		case <-timeout:
			t.Fatalf("the hostile module never reported %q; it reported %+v", step, lines)
		}
	}
}

func has(lines []reportLine, name string) bool { return step(lines, name).Step != "" }

func step(lines []reportLine, name string) reportLine {
	for _, l := range lines {
		if l.Step == name {
			return l
		}
	}
	return reportLine{}
}
