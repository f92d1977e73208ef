// Command apicheck fails when the sdk's exported API has a change that would
// break a module author's code and the changelog does not record it. It is
// run by `make lint`, from the repository's root:
//
//	go run ./cmd/apicheck [-release vX.Y.Z]
//
// It compares every package under sdk/... (internal packages are not part of
// the promise) with the same package at the previous release: the newest
// released section of CHANGELOG.md (`## [vX.Y.Z] - DATE`), or the one -release
// (MESH_APICHECK_RELEASE) names, at the commit its `Commit:` line gives. It
// checks that commit out in a temporary git worktree, removed afterwards, and
// compares with golang.org/x/exp/cmd/apidiff at a pinned version (apidiffPkg),
// installed in a temporary directory: the module's go.mod does not change. A
// shallow clone may lack the commit; apicheck then says to run
// `git fetch --unshallow`.
//
// # The rule
//
// Each incompatible change apidiff reports must be recorded in the release in
// progress, the first `## [vX.Y.Z] - unreleased` section: a bullet of its
// `### Breaking` subsection must hold, as a code span (in backquotes), exactly
// the package-qualified identifier of what changed. That identifier is the last
// element of the package's import path (the package's name, for every sdk
// package), a dot, and the name apidiff gives the changed object, with a
// method's receiver written as its bare type name (no `*`, parentheses or type
// parameters):
//
//	ErrRefused: removed                       in sdk          `sdk.ErrRefused`
//	Run: changed from func(...) to ...        in sdk/process  `process.Run`
//	(*Mesh).On: removed                       in sdk/meshtest `meshtest.Mesh.On`
//	Config.Timeout: changed from int to ...   in sdk          `sdk.Config.Timeout` (a field)
//	Handler.Handle: added                     in sdk          `sdk.Handler.Handle` (an interface method)
//	(*Box[K, V]).Get: changed from ...        in sdk          `sdk.Box.Get`
//	inner.M, method set of *Outer: removed    in sdk          `sdk.Outer.M` (a promoted method)
//
// An object of another package that apidiff names by its path (`./sub.T` or
// `github.com/.../sub.T`) is qualified by that path's last element instead. A
// removed sdk package is named by its path in the module, `sdk/foo`. One bullet
// may name several identifiers, on any of its lines; a name in its prose, outside
// backquotes, or a code span with more in it (`sdk.Mesh.On(ctx)`) does not
// count. For each incompatible change not recorded apicheck prints apidiff's
// line and a bullet to add, and it exits with status 1; compatible changes are
// listed and need no entry. It exits with status 2 when it cannot check.
package main
