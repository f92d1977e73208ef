package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// A finding is a change with the identifier that records it and whether the
// release in progress does.
type finding struct {
	change
	ident    string
	recorded bool // the Breaking section names ident; false for every compatible change
}

// judge decides, for each change, whether the Breaking bullets record it: an
// incompatible change is recorded when a code span of a bullet is exactly its
// identifier. Compatible changes need no record.
func judge(modulePath string, changes []change, breaking []string) ([]finding, error) {
	named := map[string]bool{}
	for _, b := range breaking {
		for _, s := range codeSpans(b) {
			named[s] = true
		}
	}
	findings := make([]finding, 0, len(changes))
	for _, c := range changes {
		id, err := identifier(modulePath, c)
		if err != nil {
			return nil, err
		}
		findings = append(findings, finding{change: c, ident: id, recorded: !c.compatible && named[id]})
	}
	return findings, nil
}

// unrecorded counts the incompatible findings the changelog does not record.
func unrecorded(findings []finding) int {
	n := 0
	for _, f := range findings {
		if !f.compatible && !f.recorded {
			n++
		}
	}
	return n
}

// suggestion is a Breaking bullet that records f: its identifier and what
// apidiff says changed, with the migration left for the author to write.
func suggestion(f finding) string {
	_, what, ok := cutOutsideBrackets(f.message, ": ")
	if !ok {
		what = f.message
	}
	return fmt.Sprintf("- `%s`: %s. Migration: <what a module author changes>.", f.ident, what)
}

// report writes the findings against base to w, and for the unrecorded ones
// where in the changelog to record them and how (current is the release in
// progress, if there is one). It returns the number of unrecorded ones.
func report(w io.Writer, findings []finding, base release, current release, hasCurrent bool) int {
	fmt.Fprintf(w, "apicheck: the sdk's exported API against %s (commit %.12s):", base.version, base.commit)
	if len(findings) == 0 {
		fmt.Fprintln(w, " no change")
		return 0
	}
	fmt.Fprintln(w)
	list := func(title string, keep func(finding) bool) {
		fs := slices.DeleteFunc(slices.Clone(findings), func(f finding) bool { return !keep(f) })
		if len(fs) == 0 {
			return
		}
		fmt.Fprintln(w, title)
		for _, f := range fs {
			fmt.Fprintf(w, "  %s: %s\n", f.pkg, f.message)
		}
	}
	list("compatible changes (no entry needed):", func(f finding) bool { return f.compatible })
	list("incompatible changes the Breaking section records:", func(f finding) bool { return f.recorded })
	n := unrecorded(findings)
	if n == 0 {
		return 0
	}
	where := "CHANGELOG.md has no release in progress: start a section `## [vX.Y.Z] - unreleased` with a `### Breaking` subsection"
	switch {
	case hasCurrent && current.hasBreaking:
		where = fmt.Sprintf("add to CHANGELOG.md, under `%s`, `### Breaking`", current.heading())
	case hasCurrent:
		where = fmt.Sprintf("add a `### Breaking` subsection to CHANGELOG.md's `%s`", current.heading())
	}
	fmt.Fprintln(w, "incompatible changes the Breaking section does not record:")
	seen := map[string]bool{}
	for _, f := range findings {
		if f.compatible || f.recorded {
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", f.pkg, f.message)
		if seen[f.ident] {
			fmt.Fprintf(w, "    (recorded by the bullet naming `%s` above)\n", f.ident)
			continue
		}
		seen[f.ident] = true
		fmt.Fprintf(w, "    %s:\n    %s\n", where, suggestion(f))
	}
	s := "s"
	if n == 1 {
		s = ""
	}
	fmt.Fprintf(w, "apicheck: %d incompatible change%s to the sdk's API since %s not recorded: "+
		"a bullet of the release in progress's ### Breaking section must name each, in backquotes, "+
		"as `package.Name` (`sdk.ErrRefused`, `process.Run`, `meshtest.Mesh.On`; go doc ./cmd/apicheck has the rule)\n",
		n, s, base.version)
	return n
}

// indent prefixes every line of s with two spaces.
func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}
