// Package version is the release of mesh a binary was built from: one
// string, the same in meshd, meshctl, the shipped modules and every module
// process built with the sdk, with the commit the go command stamped.
//
// The release is the repository's VERSION file, copied here
// (TestReleaseIsTheVersionFile keeps them equal). The commit is the one
// the go command stamps (go build in a git clone); a build may set both,
// as the Makefile and the release do (and then its commit wins):
//
//	go build -ldflags "-X github.com/meshkit/mesh/internal/version.release=$(cat VERSION) \
//		-X github.com/meshkit/mesh/internal/version.commit=$(git rev-parse --short=12 HEAD)"
//
// A release in progress carries the version it will have: what is built
// between v0.1.0 and v0.2.0 says v0.2.0, with its commit.
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// release is the release this build belongs to (VERSION). A string
// variable, so that a test or a build can set it with -ldflags -X.
var release = "v0.2.0"

// commit is the commit the build says it is of (-ldflags -X, as the
// Makefile and scripts/release.sh set it). When set, it is the commit:
// what a build says explicitly wins over what the go command stamped.
var commit = ""

// Release is the release this build belongs to, as "v0.2.0".
func Release() string { return release }

// Commit is the commit this binary was built from, its first 12 hex
// digits with "+dirty" for a work tree with changes (the Makefile's
// convention, and the go command's): what -ldflags -X set; else what the
// go command stamped (vcs.revision and vcs.modified, as go build stamps a
// binary built in a git clone); else the commit of a pseudo-version
// (go install ...@COMMIT); else "" (NoCommit says why). A module built
// against a tagged mesh names its own repository's commit, not mesh's.
func Commit() string {
	if commit != "" {
		return commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		return commitOf(info)
	}
	return ""
}

// NoCommit says why a build knows no commit and how to build one that
// does, for Commit's "".
const NoCommit = "the go command stamped none: go build stamps it in a git clone, " +
	"not with -buildvcs=false nor in a git worktree; make build sets it"

// commitOf is Commit for info, without -ldflags: its VCS stamp, else the
// commit of its main module's pseudo-version.
func commitOf(info *debug.BuildInfo) string {
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if rev != "" {
		return rev + dirty
	}
	if m := pseudoVersion.FindStringSubmatch(info.Main.Version); m != nil {
		return m[1] + m[2]
	}
	return ""
}

// pseudoVersion is a Go module pseudo-version (v0.2.1-0.20261207043528-8ba640e225d1,
// v0.0.0-20261207043528-8ba640e225d1+dirty): its commit, and "+dirty".
var pseudoVersion = regexp.MustCompile(`[-.][0-9]{14}-([0-9a-f]{12})(\+dirty)?(?:\+incompatible)?$`)

// GoVersion is the Go toolchain that built this binary.
func GoVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return info.GoVersion
}

// String is the release and, when known, the commit: "v0.2.0 (1a2b3c4d5e6f)".
func String() string {
	var b strings.Builder
	b.WriteString(release)
	if c := Commit(); c != "" {
		b.WriteString(" (" + c + ")")
	}
	return b.String()
}
