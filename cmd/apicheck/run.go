package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

const (
	// apidiffPkg is the apidiff apicheck runs: installed at this version
	// into a temporary directory, so the module's go.mod does not change.
	apidiffPkg = "golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4"
	// sdkPattern is the packages whose API is the sdk's promise.
	sdkPattern = "./sdk/..."
	// changelogFile is the changelog, at the root of the repository.
	changelogFile = "CHANGELOG.md"
)

// errUsage is returned for a command line apicheck cannot read.
var errUsage = errors.New("usage: go run ./cmd/apicheck [-release vX.Y.Z]")

// run checks the sdk of the repository in the working directory, writes the
// findings to stdout and errors to stderr, and returns the exit status: 0
// when every incompatible change is recorded, 1 when one is not, 2 when it
// cannot check.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("apicheck", flag.ContinueOnError)
	flags.SetOutput(stderr)
	version := flags.String("release", os.Getenv("MESH_APICHECK_RELEASE"),
		"the release to compare with (env MESH_APICHECK_RELEASE); default the newest released section of "+changelogFile)
	if err := flags.Parse(args); err != nil || flags.NArg() > 0 {
		fmt.Fprintln(stderr, errUsage)
		return 2
	}
	text, err := os.ReadFile(changelogFile)
	if err != nil {
		fmt.Fprintln(stderr, "apicheck: run it from the repository's root:", err)
		return 2
	}
	releases := parseChangelog(string(text))
	base, err := baseRelease(releases, *version)
	if err != nil {
		fmt.Fprintf(stderr, "apicheck: %s: %v\n", changelogFile, err)
		return 2
	}
	current, hasCurrent := inProgress(releases)
	modulePath, changes, err := compare(ctx, ".", base)
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "apicheck: interrupted")
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "apicheck:", err)
		return 2
	}
	findings, err := judge(modulePath, changes, current.breaking)
	if err != nil {
		fmt.Fprintln(stderr, "apicheck:", err)
		return 2
	}
	if report(stdout, findings, base, current, hasCurrent) > 0 {
		return 1
	}
	return 0
}

// compare returns the module path of the repository at dir and apidiff's
// changes to the sdk's packages since base: it checks base's commit out in
// a temporary worktree, which it removes before it returns.
func compare(ctx context.Context, dir string, base release) (modulePath string, changes []change, err error) {
	commit, err := resolveCommit(ctx, dir, base)
	if err != nil {
		return "", nil, err
	}
	tmp, err := os.MkdirTemp("", "apicheck-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(tmp)
	old := filepath.Join(tmp, base.version)
	if _, err := command(ctx, dir, nil, "git", "worktree", "add", "--detach", old, commit); err != nil {
		return "", nil, fmt.Errorf("check out %s: %w", base.version, err)
	}
	defer func() {
		// Remove it even when ctx is cancelled (an interrupt).
		_, rmErr := command(context.WithoutCancel(ctx), dir, nil, "git", "worktree", "remove", "--force", old)
		if rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove the worktree of %s (git worktree prune removes what is left): %w", base.version, rmErr))
		}
	}()

	bin := filepath.Join(tmp, "bin")
	if _, err := command(ctx, tmp, []string{"GOBIN=" + bin}, "go", "install", apidiffPkg); err != nil {
		return "", nil, fmt.Errorf("install apidiff: %w", err)
	}
	apidiff := filepath.Join(bin, "apidiff")

	out, err := command(ctx, dir, nil, "go", "list", "-m")
	if err != nil {
		return "", nil, err
	}
	modulePath = strings.TrimSpace(out)
	newPkgs, err := listPackages(ctx, dir, nil)
	if err != nil {
		return "", nil, err
	}
	// The old tree is a module of its own; no go.work of the caller's may
	// choose its dependencies.
	oldEnv := []string{"GOWORK=off"}
	oldPkgs, err := listPackages(ctx, old, oldEnv)
	if err != nil {
		return "", nil, fmt.Errorf("the sdk of %s: %w", base.version, err)
	}
	for i, pkg := range oldPkgs {
		if !slices.Contains(newPkgs, pkg) {
			changes = append(changes, change{pkg: pkg, message: "package " + pkg + ": removed"})
			continue
		}
		data := filepath.Join(tmp, fmt.Sprintf("%d.export", i))
		if _, err := command(ctx, old, oldEnv, apidiff, "-w", data, pkg); err != nil {
			return "", nil, fmt.Errorf("%s of %s: %w", pkg, base.version, err)
		}
		out, err := command(ctx, dir, nil, apidiff, data, pkg)
		if err != nil {
			return "", nil, err
		}
		cs, err := parseReport(pkg, out)
		if err != nil {
			return "", nil, err
		}
		changes = append(changes, cs...)
	}
	for _, pkg := range newPkgs {
		if !slices.Contains(oldPkgs, pkg) {
			changes = append(changes, change{pkg: pkg, message: "package " + pkg + ": added", compatible: true})
		}
	}
	return modulePath, changes, nil
}

// resolveCommit returns the full hash of base's commit in the repository at
// dir, or an error that says how to get it.
func resolveCommit(ctx context.Context, dir string, base release) (string, error) {
	out, err := command(ctx, dir, nil, "git", "rev-parse", "--verify", "--quiet", base.commit+"^{commit}")
	if err == nil {
		return strings.TrimSpace(out), nil
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	fix := "fetch it (git fetch origin)"
	if shallow, _ := command(ctx, dir, nil, "git", "rev-parse", "--is-shallow-repository"); strings.TrimSpace(shallow) == "true" {
		fix = "this clone is shallow: fetch the history with git fetch --unshallow"
	}
	return "", fmt.Errorf("the commit of %s, %s (%s's Commit: line), is not in this repository: %s",
		base.version, base.commit, changelogFile, fix)
}

// listPackages returns the import paths of the sdk's packages in the module
// at dir, less internal ones.
func listPackages(ctx context.Context, dir string, env []string) ([]string, error) {
	out, err := command(ctx, dir, env, "go", "list", sdkPattern)
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(out) {
		if !isInternal(p) {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// isInternal tells whether the package at the import path p is internal to
// its module (has an element "internal").
func isInternal(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "internal")
}

// command runs name with args in dir, with env added to apicheck's, and
// returns its standard output; an error carries its standard error.
func command(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, indent(stderr.String()))
	}
	return stdout.String(), nil
}
