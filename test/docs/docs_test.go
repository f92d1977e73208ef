//go:build linux

// The doc check: the commands that README.md and the guides in docs/ (not
// docs/adr) mark runnable are run, in order, against the test broker, so
// the docs cannot rot.
//
// The convention. A fenced code block whose info string is `sh runnable`
// (three backticks, then "sh runnable"; GitHub renders it as sh) is
// runnable; every other block is only read. The runnable blocks of one
// Markdown file run in order in ONE bash process (set -euo pipefail), so
// cd, variables and background jobs carry from block to block, as in a
// reader's terminal. It starts in a fresh empty temporary directory, with
// the test's environment (less its MESH_* variables) and:
//   - MESH: the repository root (a guide tells the reader to
//     `export MESH=~/src/mesh` in a block that is not runnable);
//   - MESH_AMQP_URL: a virtual host made for this file and deleted after
//     it (brokertest.VHost). meshd and meshctl read it, and it overrides a
//     config file's amqp_url, so runnable configs leave amqp_url out;
//   - HOME and XDG_STATE_HOME: temporary directories;
//   - GOCACHE, GOMODCACHE, GOPATH, GOFLAGS, GOPROXY...: the go command's
//     own settings, so go build and make -C "$MESH" build are fast.
//
// A block that needs the binaries starts with `make -C "$MESH" build` and
// `export PATH="$MESH/bin:$PATH"`. A doc waits for something observable,
// never for a fixed time: a node with meshd's --http-addr and
// `curl --retry 30 --retry-connrefused --retry-delay 1 -fsS
// http://127.0.0.1:PORT/readyz`, a handler with a bounded retry loop on a
// meshctl command. Each file uses fixed ports of its own in 184xx. A doc
// stops what it starts (`kill $pid; wait $pid`): bash runs in a process
// group of its own, and a doc that leaves a process of it running when
// its last block ends fails. Whatever is left then, or after fileTimeout,
// gets SIGTERM and, stopGrace later, SIGKILL: nothing outlives the test.
//
// Before each block the script writes "--- FILE:LINE" (the block's opening
// fence) to stderr; a failure reports the script's combined output, the
// line of the doc where it stopped, and the end of each *.log file left in
// its working directory. A file without runnable blocks is skipped.
package docs_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/proctest"
	"github.com/meshkit/mesh/internal/testdir"
)

const (
	// fileTimeout bounds the run of one file's blocks.
	fileTimeout = 5 * time.Minute
	// stopGrace is how long the processes of a doc have after SIGTERM
	// before SIGKILL.
	stopGrace = 10 * time.Second
)

// block is one runnable block of a Markdown file.
type block struct {
	line int    // the line of its opening fence, from 1
	text string // what is between its fences
}

var fenceRE = regexp.MustCompile("^( *)(`{3,}|~{3,})(.*)$")

// runnableBlocks returns the runnable blocks of a Markdown text, in order.
// A fence may be indented (a block in a list item); its indentation is
// taken off the block's lines.
func runnableBlocks(md string) []block {
	var blocks []block
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(strings.TrimSuffix(lines[i], "\r"))
		if m == nil {
			continue
		}
		indent, fence, info := len(m[1]), m[2], m[3]
		if fence[0] == '`' && strings.Contains(info, "`") {
			continue // inline code at the start of a line, not a fence
		}
		var body []string
		j := i + 1
		for ; j < len(lines); j++ {
			l := strings.TrimSuffix(lines[j], "\r")
			if closes(l, fence) {
				break
			}
			body = append(body, l[min(indent, len(l)-len(strings.TrimLeft(l, " "))):])
		}
		if slices.Equal(strings.Fields(info), []string{"sh", "runnable"}) {
			blocks = append(blocks, block{line: i + 1, text: strings.Join(body, "\n")})
		}
		i = j
	}
	return blocks
}

// closes says whether line closes a block opened by fence: the same
// character, at least as many times, and nothing else.
func closes(line, fence string) bool {
	t := strings.TrimLeft(line, " ")
	n := len(t) - len(strings.TrimLeft(t, fence[:1]))
	return n >= len(fence) && strings.TrimSpace(t[n:]) == ""
}

// span is where a block's lines are in the script.
type span struct {
	first, last int // script lines, from 1
	docLine     int // the doc's line of the block's first line
}

// script is the bash script of one file's runnable blocks, and where each
// block is in it.
func script(file string, blocks []block) (string, []span) {
	lines := []string{
		"set -euo pipefail",
		`trap 'echo "--- exit status $? at script line $LINENO" >&2' ERR`,
	}
	var spans []span
	for _, b := range blocks {
		lines = append(lines, fmt.Sprintf("echo '--- %s:%d' >&2", file, b.line))
		body := strings.Split(b.text, "\n")
		spans = append(spans, span{first: len(lines) + 1, last: len(lines) + len(body), docLine: b.line + 1})
		lines = append(lines, body...)
	}
	return strings.Join(lines, "\n") + "\n", spans
}

var stoppedRE = regexp.MustCompile(`(?m)^--- exit status \d+ at script line (\d+)$`)

// stoppedAt says which line of the doc the script stopped at, from the
// last line its ERR trap wrote; "" if it wrote none.
func stoppedAt(file, output string, spans []span) string {
	all := stoppedRE.FindAllStringSubmatch(output, -1)
	if len(all) == 0 {
		return ""
	}
	n, _ := strconv.Atoi(all[len(all)-1][1])
	for _, s := range spans {
		if n >= s.first && n <= s.last {
			return fmt.Sprintf("%s:%d", file, s.docLine+n-s.first)
		}
	}
	return ""
}

func TestRunnableBlocks(t *testing.T) {
	md := strings.Join([]string{
		"# Title", // 1
		"",
		"```sh", // 3
		"echo read only",
		"```",
		"",
		"```go", // 7
		"package main",
		"```",
		"",
		"```sh runnable", // 11
		"echo one",
		"echo two",
		"```",
		"",
		"- in a list:",
		"  ```sh runnable", // 17
		"  cd here",
		"  ```",
	}, "\n")
	got := runnableBlocks(md)
	want := []block{{line: 11, text: "echo one\necho two"}, {line: 17, text: "cd here"}}
	if !slices.Equal(got, want) {
		t.Errorf("runnableBlocks = %+v, want %+v", got, want)
	}
	text, spans := script("x.md", got)
	out := "--- x.md:11\n--- exit status 1 at script line 5\n"
	if at := stoppedAt("x.md", out, spans); at != "x.md:13" {
		t.Errorf("stoppedAt = %q, want x.md:13; script:\n%s", at, text)
	}
}

// TestDocs runs the runnable blocks of README.md and docs/*.md, one file
// after the other (they build into the same bin/ and may use the same
// ports).
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the docs against the broker")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root: %v", err)
	}
	files := []string{"README.md"}
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guides {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(g, root+string(filepath.Separator))))
	}
	for _, file := range files {
		md, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		blocks := runnableBlocks(string(md))
		if len(blocks) == 0 {
			continue
		}
		t.Run(file, func(t *testing.T) { runDoc(t, root, file, blocks) })
	}
}

var subreaper = sync.OnceValue(func() error {
	// The processes a doc leaves behind are re-parented to this process
	// rather than to init when their parent exits, so stopGroup can wait
	// for them (wait4) instead of polling.
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
})

// runDoc runs one file's blocks in one bash process.
func runDoc(t *testing.T, root, file string, blocks []block) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("the docs run in bash: %v", err)
	}
	if err := subreaper(); err != nil {
		t.Fatalf("prctl(PR_SET_CHILD_SUBREAPER): %v", err)
	}
	url := brokertest.VHost(t)
	// Where meshd runs as root its modules run as users of their own: the
	// work and state dirs are where they can pass.
	work, home, state, scratch := testdir.Reachable(t), t.TempDir(), testdir.Reachable(t), t.TempDir()
	text, spans := script(file, blocks)
	path := filepath.Join(scratch, "script.sh")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(scratch, "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()

	cmd := exec.Command(bash, "--noprofile", "--norc", path)
	cmd.Dir = work
	cmd.Env = docEnv(t, root, url, home, state)
	cmd.Stdout, cmd.Stderr = out, out // a file, not a pipe: what the doc leaves running cannot hold Wait
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timeout := time.NewTimer(fileTimeout)
	defer timeout.Stop()
	var runErr error
	select {
	case runErr = <-exited:
	case <-timeout.C:
		runErr = fmt.Errorf("timed out after %v", fileTimeout)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		}
	}
	t.Logf("%s: %d runnable blocks in %v", file, len(blocks), time.Since(start).Round(100*time.Millisecond))

	// bash is gone; what is left of its group is the doc's.
	reap(pgid, unix.WNOHANG)
	if left := members(pgid); len(left) > 0 {
		err := fmt.Errorf("it left processes running (a doc stops what it starts): %s", strings.Join(left, "; "))
		runErr = errors.Join(runErr, err)
	}
	stopGroup(pgid)
	if left := members(pgid); len(left) > 0 {
		t.Errorf("%s: processes outlived SIGKILL: %s", file, strings.Join(left, "; "))
	}

	output, _ := os.ReadFile(out.Name())
	if runErr == nil {
		t.Logf("output:\n%s", output) // shown by go test -v
		return
	}
	{
		var b strings.Builder
		fmt.Fprintf(&b, "%s: %v", file, runErr)
		if at := stoppedAt(file, string(output), spans); at != "" {
			fmt.Fprintf(&b, "; it stopped at %s", at)
		}
		fmt.Fprintf(&b, "\n--- output (each block begins with its \"--- FILE:LINE\"):\n%s", output)
		logs, _ := filepath.Glob(filepath.Join(work, "*.log"))
		for _, l := range logs {
			fmt.Fprintf(&b, "\n--- the end of %s:\n%s", filepath.Base(l), tail(l, 40))
		}
		t.Error(b.String())
	}
}

// docEnv is the environment of a doc's script.
func docEnv(t *testing.T, root, url, home, state string) []string {
	goVars := []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOFLAGS", "GOPROXY", "GOSUMDB", "GOPRIVATE",
		"GONOPROXY", "GONOSUMDB", "GOINSECURE", "GOTOOLCHAIN"}
	// The go command's settings, as it sees them (the environment, or its
	// env file under the real HOME, or its defaults under it).
	goOut, err := exec.Command("go", append([]string{"env", "-json"}, goVars...)...).Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var goEnv map[string]string
	if err := json.Unmarshal(goOut, &goEnv); err != nil {
		t.Fatalf("go env: %v", err)
	}
	set := map[string]string{
		"MESH":           root,
		"MESH_AMQP_URL":  url,
		"HOME":           home,
		"XDG_STATE_HOME": state,
	}
	for k, v := range goEnv {
		if v != "" {
			set[k] = v
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; ours || strings.HasPrefix(k, "MESH_") || slices.Contains(goVars, k) {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return env
}

// stopGroup ends the processes of the group pgid: SIGTERM, then SIGKILL
// after stopGrace. It waits for them to exit and reaps them.
func stopGroup(pgid int) {
	if errors.Is(syscall.Kill(-pgid, syscall.SIGTERM), syscall.ESRCH) {
		return
	}
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		reap(pgid, 0)
	}()
	select {
	case <-reaped:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-reaped
	}
}

// reap waits for the children of this process in the group pgid (its
// own, or re-parented to it), until none is left (or, with WNOHANG, none
// has exited).
func reap(pgid, options int) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, options, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
		case err != nil || pid <= 0:
			return
		}
	}
}

// members lists the live (not zombie) processes of the group pgid, as
// "PID COMMAND LINE".
func members(pgid int) []string {
	var out []string
	for _, p := range proctest.List() {
		if p.State != "Z" && p.PGID == pgid {
			out = append(out, fmt.Sprintf("%d %s", p.PID, p.Cmdline))
		}
	}
	return out
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
