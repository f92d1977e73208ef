package main

import (
	"fmt"
	"regexp"
	"strings"
)

// A release is one `## [vX.Y.Z] - DATE` section of the changelog.
type release struct {
	version     string   // "v0.2.0"
	date        string   // "2026-12-04", or "unreleased" for the release in progress
	commit      string   // what its `Commit:` line names; "" when it has none
	hasBreaking bool     // it has a `### Breaking` subsection
	breaking    []string // the bullets of that subsection, each on one line
}

// unreleased tells whether r is a release in progress.
func (r release) unreleased() bool { return strings.EqualFold(r.date, "unreleased") }

// heading is how the changelog names r's section.
func (r release) heading() string { return fmt.Sprintf("## [%s] - %s", r.version, r.date) }

var (
	releaseHeading = regexp.MustCompile(`^## \[(v[0-9]+\.[0-9]+\.[0-9]+[^\]]*)\] - (\S.*?)\s*$`)
	commitLine     = regexp.MustCompile(`^Commit:\s*([0-9a-fA-F]{7,40})\s*$`)
	bulletStart    = regexp.MustCompile(`^[-*+]\s+`)
)

// parseChangelog returns the release sections of a changelog in Keep a
// Changelog's form, in their order in the text. A section runs from its
// heading to the next `## ` heading; its `### Breaking` subsection to the next
// `### ` or `## ` heading. A bullet starts with "- ", "* " or "+ " at the start
// of a line and takes the lines after it up to the next bullet, heading, or
// line at the start of a paragraph that is not indented; its lines are joined
// with single spaces. Headings inside fenced code blocks are not headings.
func parseChangelog(text string) []release {
	var (
		releases   []release
		cur        *release // the section being read
		inBreaking bool     // reading cur's Breaking subsection
		bullet     []string // the lines of the bullet being read
		fence      string   // the open code fence's marker, or ""
		prevBlank  = true
	)
	endBullet := func() {
		if cur != nil && len(bullet) > 0 {
			cur.breaking = append(cur.breaking, strings.Join(bullet, " "))
		}
		bullet = nil
	}
	endRelease := func() {
		endBullet()
		if cur != nil {
			releases = append(releases, *cur)
		}
		cur, inBreaking = nil, false
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		trimmed := strings.TrimSpace(line)
		blank := trimmed == ""
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		} else if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
		}
		switch {
		case fence == "" && strings.HasPrefix(line, "## "):
			endRelease()
			if m := releaseHeading.FindStringSubmatch(line); m != nil {
				cur = &release{version: m[1], date: m[2]}
			}
		case fence == "" && strings.HasPrefix(line, "### "):
			endBullet()
			inBreaking = cur != nil && strings.EqualFold(strings.TrimSpace(line[4:]), "Breaking")
			if inBreaking {
				cur.hasBreaking = true
			}
		case fence == "" && strings.HasPrefix(line, "# "):
			endRelease()
		case cur == nil:
		case inBreaking && fence == "" && bulletStart.MatchString(line):
			endBullet()
			bullet = []string{bulletStart.ReplaceAllString(line, "")}
		case inBreaking && len(bullet) > 0 && !blank && (line[0] == ' ' || line[0] == '\t' || !prevBlank):
			bullet = append(bullet, trimmed)
		case inBreaking && !blank && len(bullet) > 0:
			endBullet() // a paragraph of its own after the list
		case !inBreaking && cur.commit == "":
			if m := commitLine.FindStringSubmatch(trimmed); m != nil {
				cur.commit = m[1]
			}
		}
		prevBlank = blank
	}
	endRelease()
	return releases
}

// inProgress returns the release in progress: the first unreleased section.
func inProgress(releases []release) (release, bool) {
	for _, r := range releases {
		if r.unreleased() {
			return r, true
		}
	}
	return release{}, false
}

// baseRelease returns the release to compare the sdk with: the section of
// version, or with version "" the first released (not unreleased) section, the
// newest. It must name its commit.
func baseRelease(releases []release, version string) (release, error) {
	for _, r := range releases {
		if version == "" && r.unreleased() || version != "" && r.version != version {
			continue
		}
		if r.unreleased() {
			return release{}, fmt.Errorf("release %s is not released: there is no API to compare with", r.version)
		}
		if r.commit == "" {
			return release{}, fmt.Errorf("release %s has no `Commit:` line in its section", r.version)
		}
		return r, nil
	}
	if version != "" {
		return release{}, fmt.Errorf("no section `## [%s] - DATE`", version)
	}
	return release{}, fmt.Errorf("no released section (`## [vX.Y.Z] - DATE`): there is no API to compare with")
}

// codeSpans returns the contents of the code spans (text in backquotes) of a
// line of Markdown, as CommonMark reads them: a run of n backquotes opens a
// span that the next run of exactly n closes, and one space is stripped from
// each end of a content that has one at both and is not all spaces.
func codeSpans(text string) []string {
	var spans []string
	for i := 0; i < len(text); {
		if text[i] == '\\' && i+1 < len(text) {
			i += 2 // an escaped backquote opens nothing
			continue
		}
		if text[i] != '`' {
			i++
			continue
		}
		n := backquoteRun(text, i)
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := backquoteRun(text, j)
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n // no closing run: the backquotes are text
			continue
		}
		s := text[i+n : end]
		if len(s) >= 2 && s[0] == ' ' && s[len(s)-1] == ' ' && strings.Trim(s, " ") != "" {
			s = s[1 : len(s)-1]
		}
		spans = append(spans, s)
		i = end + n
	}
	return spans
}

// backquoteRun returns the length of the run of backquotes at text[i:].
func backquoteRun(text string, i int) int {
	n := 0
	for i+n < len(text) && text[i+n] == '`' {
		n++
	}
	return n
}
