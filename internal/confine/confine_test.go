package confine_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/internal/testdir"
)

// TestMain makes the test binary the confined launcher when it is started
// as one, as meshd's binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == confine.Arg {
		if err := confine.Main(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(111)
	}
	if len(os.Args) > 1 && os.Args[1] == netProbeArg {
		netProbe(os.Args[2:])
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fixture is a tree with a state dir (denied), a module's directory in
// it (allowed), a file outside it, and a link into the state dir.
type fixture struct {
	root, state, own, open, link string
	user                         *confine.User // who the script runs as (nil: the test's user)
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	root := testdir.Reachable(t) // the user the launcher takes on passes through
	f := fixture{root: root, state: filepath.Join(root, "state"), open: filepath.Join(root, "open")}
	f.own = filepath.Join(f.state, "modules", "m")
	f.link = filepath.Join(root, "link")
	for _, d := range []string{f.own, f.open} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, file := range []string{filepath.Join(f.state, "secret"), filepath.Join(f.own, "mine"), filepath.Join(f.open, "file")} {
		if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(f.state, f.link); err != nil {
		t.Fatal(err)
	}
	// A hard link to the denied file, beside the denied dir: the same file.
	if err := os.Link(filepath.Join(f.state, "secret"), filepath.Join(root, "hardlink")); err != nil {
		t.Fatal(err)
	}
	return f
}

// run runs a shell script confined to all but f.state, f.own allowed.
func (f fixture) run(t *testing.T, script string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(confine.Command(self, confine.Options{Deny: []string{f.state}, Allow: []string{f.own}, User: f.user}), "sh", "-c", script)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

func TestConfinedProcessStaysOutOfTheDeniedPaths(t *testing.T) {
	if confine.ABI() < 1 {
		t.Skip("this kernel offers no Landlock")
	}
	f := newFixture(t)
	// What the confined process may still do.
	for _, script := range []string{
		"cat " + filepath.Join(f.open, "file"),
		"cat " + filepath.Join(f.own, "mine"),
		"echo y > " + filepath.Join(f.own, "new") + " && cat " + filepath.Join(f.own, "new"),
		"mkdir " + filepath.Join(f.open, "sub") + " && rmdir " + filepath.Join(f.open, "sub"),
		"cat /proc/self/status > /dev/null",
		"ls /usr/bin > /dev/null",
	} {
		if out, err := f.run(t, script); err != nil {
			t.Errorf("%q confined: %v\n%s", script, err, out)
		}
	}
	// What it may not: the denied path, through its name, a link, /proc,
	// or by its parent (a rename or a new entry beside it).
	for _, script := range []string{
		"cat " + filepath.Join(f.state, "secret"),
		"cat " + filepath.Join(f.link, "secret"),
		"cat /proc/self/root" + filepath.Join(f.state, "secret"),
		"cat " + filepath.Join(f.root, "hardlink"),
		"ls " + f.state,
		"echo y > " + filepath.Join(f.state, "planted"),
		"mv " + f.state + " " + filepath.Join(f.open, "moved"),
		"rm " + filepath.Join(f.state, "secret"),
	} {
		out, err := f.run(t, script)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 111 {
			t.Errorf("%q confined: want the script to fail, got %v\n%s", script, err, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(f.state, "secret")); err != nil || string(b) != "x" {
		t.Fatalf("the denied file was touched: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(f.state, "planted")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was planted in the denied dir: %v", err)
	}
}

// TestConfinedScript: a script runs through the launcher as a binary does
// (its interpreter opens it by the launcher's descriptor).
func TestConfinedScript(t *testing.T) {
	if confine.ABI() < 1 {
		t.Skip("this kernel offers no Landlock")
	}
	f := newFixture(t)
	script := filepath.Join(f.open, "module.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho confined script $1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(confine.Command(self, confine.Options{Deny: []string{f.state}}), script, "ran")
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil || string(out) != "confined script ran\n" {
		t.Fatalf("the script through the launcher: %v\n%s", err, out)
	}
}

func TestConfinedProcessCannotSignalOutside(t *testing.T) {
	if confine.ABI() < 6 {
		t.Skip("this kernel's Landlock has no signal scope (version 6)")
	}
	f := newFixture(t)
	// kill -0 checks the permission to signal without sending anything:
	// the test process is outside the confined one's domain; the shell's
	// own child is inside.
	if out, err := f.run(t, "kill -0 "+strconv.Itoa(os.Getpid())); err == nil {
		t.Fatalf("the confined process may signal the process that started it\n%s", out)
	}
	if out, err := f.run(t, "sleep 1000 & kill $!"); err != nil {
		t.Fatalf("the confined process may not signal its own child: %v\n%s", err, out)
	}
}

func TestPlanGrantsAllButTheDenied(t *testing.T) {
	f := newFixture(t)
	rules, err := confine.Plan([]string{f.state}, []string{f.own})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, r := range rules {
		paths = append(paths, r.Path)
		if r.Path != f.own && (r.Path == f.state || strings.HasPrefix(r.Path, f.state+"/") || strings.HasPrefix(f.state, r.Path+"/") || r.Path == "/") {
			t.Errorf("rule %s grants the denied %s", r.Path, f.state)
		}
	}
	for _, want := range []string{f.open, f.own, "/usr", "/proc"} {
		if !slices.Contains(paths, want) {
			t.Errorf("no rule grants %s", want)
		}
	}
	if slices.Contains(paths, f.link) {
		t.Errorf("the link into the denied dir is granted")
	}
	if rules, _ := confine.Plan(nil, nil); len(rules) != 1 || rules[0].Path != "/" {
		t.Errorf("nothing denied: want / granted, got %v", rules)
	}
}

func TestMainRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{{"--deny"}, {"--bogus", "x", "--", "sh"}, {"--deny", "/x"}, {"--", "no-such-binary-anywhere"}, {"--user", "x", "--", "sh"}} {
		if err := confine.Main(args); err == nil {
			t.Errorf("Main(%q): want an error", args)
		}
	}
}

// TestLauncherTakesTheUserOn (as root): the binary, in a directory only
// root may pass, runs as the user given, with no other group, confined.
func TestLauncherTakesTheUserOn(t *testing.T) {
	if confine.ABI() < 1 || os.Geteuid() != 0 {
		t.Skip("needs Landlock and root")
	}
	f := newFixture(t)
	private := filepath.Join(f.root, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(private, "sh")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(confine.Command(self, confine.Options{Deny: []string{f.state}, User: &confine.User{UID: 65534, GID: 65534}}),
		bin, "-c", "id -u; id -G; cat "+filepath.Join(f.open, "file")+"; cat "+filepath.Join(private, "sh")+" >/dev/null && echo read-private")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	got := string(out)
	if !strings.HasPrefix(got, "65534\n65534\nx") || strings.Contains(got, "read-private") {
		t.Fatalf("want uid and only group 65534, the open file read and the private dir not: %v\n%s", err, got)
	}
}
