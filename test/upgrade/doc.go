// Package upgrade holds the test of the release promise under load
// (docs/compatibility.md): a node of the previous release, built from the
// git history (internal/releasetest), beside a node of this one, upgraded
// in place, its module binaries swapped one at a time, rolled back and
// forward, with a checker over what crossed the wire and the audit log.
//
//	go test -count=1 -v ./test/upgrade
package upgrade
