// Package version is the release of mesh a binary was built from: one
// string, the same in meshd, meshctl, the shipped modules and every module
// process built with the sdk, with the commit the go command stamped.
//
// The release is the repository's VERSION file, copied here
// (TestReleaseIsTheVersionFile keeps them equal); a build may set it, and
// the commit where the go command stamps none, as the Makefile does:
//
//	go build -ldflags "-X github.com/meshkit/mesh/internal/version.release=$(cat VERSION) \
//		-X github.com/meshkit/mesh/internal/version.commit=$(git rev-parse --short=12 HEAD)"
//
// A release in progress carries the version it will have: what is built
// between v0.1.0 and v0.2.0 says v0.2.0, with its commit.
package version

import (
	"runtime/debug"
	"strings"
)

// release is the release this build belongs to (VERSION). A string
// variable, so that a test or a build can set it with -ldflags -X.
var release = "v0.2.0"

// commit is the commit the build says it is of (-ldflags -X, as the
// Makefile sets it), for builds the go command stamped no commit into
// (-buildvcs=false, or outside the work tree).
var commit = ""

// Release is the release this build belongs to, as "v0.2.0".
func Release() string { return release }

// Commit is the commit this binary was built from, its first 12 hex
// digits with "+dirty" for a work tree with changes, or "" when the go
// command stamped none (a build outside a git work tree, or with
// -buildvcs=false). A module built against a tagged mesh names its own
// repository's commit, not mesh's.
func Commit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		if c := commitOf(info); c != "" {
			return c
		}
	}
	return commit
}

// commitOf is Commit for info.
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
	if rev == "" {
		return ""
	}
	return rev + dirty
}

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
