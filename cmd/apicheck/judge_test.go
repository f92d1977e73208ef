package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const (
	mod = "github.com/meshkit/mesh"
	sdk = mod + "/sdk"
)

func TestJudge(t *testing.T) {
	removed := change{pkg: sdk, message: "ErrRefused: removed"}
	field := change{pkg: sdk, message: "Config.Timeout: changed from int to string"}
	method := change{pkg: sdk + "/meshtest", message: "(*Mesh).On: removed"}
	added := change{pkg: sdk, message: "New: added", compatible: true}
	for _, tc := range []struct {
		name     string
		c        change
		breaking []string
		recorded bool
	}{
		{"named in backquotes", removed, []string{"`sdk.ErrRefused` is gone. Migration: use `sdk.ErrDenied`."}, true},
		{"named in a later bullet", removed, []string{"meshd no longer exits.", "`sdk.Other`, `sdk.ErrRefused`: removed."}, true},
		{"in double backquotes", removed, []string{"`` sdk.ErrRefused `` is gone."}, true},
		{"a method by its type", method, []string{"`meshtest.Mesh.On` is gone."}, true},
		{"a field", field, []string{"`sdk.Config.Timeout` is a string."}, true},
		{"no Breaking bullets", removed, nil, false},
		{"named in prose only", removed, []string{"sdk.ErrRefused is gone."}, false},
		{"without its package", removed, []string{"`ErrRefused` is gone."}, false},
		{"by its import path", removed, []string{"`github.com/meshkit/mesh/sdk.ErrRefused` is gone."}, false},
		{"with more in the span", removed, []string{"`sdk.ErrRefused()` is gone."}, false},
		{"by another name", removed, []string{"`sdk.ErrRefusedNow` is new."}, false},
		{"its type, not the field", field, []string{"`sdk.Config` changed."}, false},
		{"the pointer method's spelling", method, []string{"`(*meshtest.Mesh).On` is gone."}, false},
		{"a compatible change", added, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := judge(mod, []change{tc.c}, tc.breaking)
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != 1 || fs[0].recorded != tc.recorded {
				t.Fatalf("judge = %+v, want recorded %v", fs, tc.recorded)
			}
			want := 0
			if !tc.c.compatible && !tc.recorded {
				want = 1
			}
			if n := unrecorded(fs); n != want {
				t.Errorf("unrecorded = %d, want %d", n, want)
			}
		})
	}
	if _, err := judge(mod, []change{{pkg: sdk, message: "garbage"}}, nil); err == nil {
		t.Error("judge of a line it cannot read: no error")
	}
}

func TestReport(t *testing.T) {
	base := release{version: "v0.1.0", commit: "b02ef4696ef4e343b2d5612cae1e185e6ca8ee39"}
	current := release{version: "v0.2.0", date: "unreleased", hasBreaking: true}
	changes := []change{
		{pkg: sdk + "/process", message: "Run: changed from func() error to func(int) error"},
		{pkg: sdk, message: "ErrRefused: removed"},
		{pkg: sdk, message: "(*T).M: removed"},
		{pkg: sdk, message: "T.M: changed from func() to func(int)"},
		{pkg: sdk, message: "New: added", compatible: true},
	}
	fs, err := judge(mod, changes, []string{"`process.Run` takes a count."})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if n := report(&out, fs, base, current, true); n != 3 {
		t.Errorf("report = %d, want 3", n)
	}
	want := `apicheck: the sdk's exported API against v0.1.0 (commit b02ef4696ef4):
compatible changes (no entry needed):
  github.com/meshkit/mesh/sdk: New: added
incompatible changes the Breaking section records:
  github.com/meshkit/mesh/sdk/process: Run: changed from func() error to func(int) error
incompatible changes the Breaking section does not record:
  github.com/meshkit/mesh/sdk: ErrRefused: removed
    add to CHANGELOG.md, under ` + "`## [v0.2.0] - unreleased`, `### Breaking`" + `:
    - ` + "`sdk.ErrRefused`" + `: removed. Migration: <what a module author changes>.
  github.com/meshkit/mesh/sdk: (*T).M: removed
    add to CHANGELOG.md, under ` + "`## [v0.2.0] - unreleased`, `### Breaking`" + `:
    - ` + "`sdk.T.M`" + `: removed. Migration: <what a module author changes>.
  github.com/meshkit/mesh/sdk: T.M: changed from func() to func(int)
    (recorded by the bullet naming ` + "`sdk.T.M`" + ` above)
apicheck: 3 incompatible changes to the sdk's API since v0.1.0 not recorded: ` +
		"a bullet of the release in progress's ### Breaking section must name each, in backquotes, as `package.Name` " +
		"(`sdk.ErrRefused`, `process.Run`, `meshtest.Mesh.On`; go doc ./cmd/apicheck has the rule)\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}

	// Where the bullet goes when there is no place for it yet.
	for _, tc := range []struct {
		current    release
		hasCurrent bool
		where      string
	}{
		{release{version: "v0.2.0", date: "unreleased"}, true, "add a `### Breaking` subsection to CHANGELOG.md's `## [v0.2.0] - unreleased`"},
		{release{}, false, "start a section `## [vX.Y.Z] - unreleased`"},
	} {
		out.Reset()
		report(&out, fs[1:2], base, tc.current, tc.hasCurrent)
		if !strings.Contains(out.String(), tc.where) {
			t.Errorf("got:\n%s\nwant it to say %q", out.String(), tc.where)
		}
	}

	out.Reset()
	if n := report(&out, nil, base, current, true); n != 0 || out.String() != "apicheck: the sdk's exported API against v0.1.0 (commit b02ef4696ef4): no change\n" {
		t.Errorf("no change: %d, %q", n, out.String())
	}
}

func TestAMissingCommitSaysHowToFetchIt(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	origin := filepath.Join(dir, "origin")
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if err := os.Mkdir(origin, 0o755); err != nil {
		t.Fatal(err)
	}
	git(origin, "init", "-q")
	git(origin, "commit", "-q", "--allow-empty", "-m", "v0.1.0")
	first := git(origin, "rev-parse", "HEAD")
	git(origin, "commit", "-q", "--allow-empty", "-m", "later")
	git(dir, "clone", "-q", "--depth", "1", "file://"+origin, "shallow")

	ctx := context.Background()
	got, err := resolveCommit(ctx, origin, release{version: "v0.1.0", commit: first[:12]})
	if err != nil || got != first {
		t.Errorf("in the full clone: %q, %v; want %s", got, err, first)
	}
	_, err = resolveCommit(ctx, filepath.Join(dir, "shallow"), release{version: "v0.1.0", commit: first})
	if err == nil || !strings.Contains(err.Error(), "git fetch --unshallow") || !strings.Contains(err.Error(), first) {
		t.Errorf("in the shallow clone: %v; want an error naming the commit and git fetch --unshallow", err)
	}
	_, err = resolveCommit(ctx, origin, release{version: "v0.1.0", commit: strings.Repeat("0", 40)})
	if err == nil || strings.Contains(err.Error(), "unshallow") || !strings.Contains(err.Error(), "git fetch") {
		t.Errorf("a commit the full clone lacks: %v; want an error saying to fetch it", err)
	}
}

func TestIsInternal(t *testing.T) {
	for p, want := range map[string]bool{
		sdk:                           false,
		sdk + "/internal":             true,
		sdk + "/internal/x":           true,
		sdk + "/process/internal/y":   true,
		sdk + "/internals":            false,
		mod + "/internal/wire":        true,
		sdk + "/meshtest/internalize": false,
	} {
		if got := isInternal(p); got != want {
			t.Errorf("isInternal(%q) = %v, want %v", p, got, want)
		}
	}
}
