package main

import (
	"fmt"
	"path"
	"strings"
)

// A change is one line of apidiff's report on one package.
type change struct {
	pkg        string // the import path of the package compared
	message    string // apidiff's line, without its "- "
	compatible bool
}

// parseReport reads apidiff's text report on the package pkg: an optional
// "Incompatible changes:" list and an optional "Compatible changes:" list,
// each line of them "- MESSAGE". Anything else is an error, so that a new
// apidiff whose output changed fails the check instead of passing it.
func parseReport(pkg, out string) ([]change, error) {
	var (
		changes []change
		section string
	)
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case line == "":
		case line == "Incompatible changes:" || line == "Compatible changes:":
			section = line
		case strings.HasPrefix(line, "- ") && section != "":
			changes = append(changes, change{
				pkg:        pkg,
				message:    strings.TrimPrefix(line, "- "),
				compatible: section == "Compatible changes:",
			})
		default:
			return nil, fmt.Errorf("apidiff's report on %s: unexpected line %q", pkg, line)
		}
	}
	return changes, nil
}

// identifier returns the package-qualified identifier that records c in the
// changelog (see the package comment for the rule). modulePath is the path of
// the module the sdk is in.
func identifier(modulePath string, c change) (string, error) {
	if rest, ok := strings.CutPrefix(c.message, "package "); ok {
		// A package added or removed: "package PATH: removed".
		p, _, ok := strings.Cut(rest, ": ")
		if !ok {
			return "", fmt.Errorf("cannot read %q", c.message)
		}
		return strings.TrimPrefix(p, modulePath+"/"), nil
	}
	subject, _, ok := cutOutsideBrackets(c.message, ": ")
	if !ok || subject == "" {
		return "", fmt.Errorf("cannot read %q: no \"NAME: \" in front", c.message)
	}
	// A method promoted from an embedded type and lost: "T.M, method set of
	// *U" (T may be unexported, or in another package). It is U's method M.
	var methodSetOf string
	if i := strings.Index(subject, ", method set of "); i >= 0 {
		methodSetOf = strings.TrimPrefix(subject[i+len(", method set of "):], "*")
		subject = subject[:i]
	}
	subject = dropBrackets(subject)
	qualifier := path.Base(c.pkg)
	// An object of another package: "./sub.T..." or "example.com/x/sub.T...".
	if slash := strings.LastIndex(subject, "/"); slash >= 0 {
		dot := strings.Index(subject[slash:], ".")
		if dot < 0 {
			return "", fmt.Errorf("cannot read %q: a path without a name", c.message)
		}
		qualifier = path.Base(subject[:slash+dot])
		subject = subject[slash+dot+1:]
	}
	subject = strings.NewReplacer("(", "", ")", "", "*", "").Replace(subject)
	if methodSetOf != "" {
		method := subject[strings.LastIndex(subject, ".")+1:]
		return path.Base(c.pkg) + "." + dropBrackets(methodSetOf) + "." + method, nil
	}
	if subject == "" || strings.ContainsAny(subject, " ,") {
		return "", fmt.Errorf("cannot read %q: %q is not a name", c.message, subject)
	}
	return qualifier + "." + subject, nil
}

// cutOutsideBrackets is strings.Cut for the first sep outside square
// brackets (a generic type's type arguments).
func cutOutsideBrackets(s, sep string) (before, after string, found bool) {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		default:
			if depth == 0 && strings.HasPrefix(s[i:], sep) {
				return s[:i], s[i+len(sep):], true
			}
		}
	}
	return s, "", false
}

// dropBrackets removes the square-bracketed parts of s, with what they hold:
// "(*Box[K, V]).Get" is "(*Box).Get".
func dropBrackets(s string) string {
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '[':
			depth++
		case r == ']' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}
