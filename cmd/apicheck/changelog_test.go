package main

import (
	"slices"
	"strings"
	"testing"
)

const changelog = "# Changelog\n" + `
Prose that mentions ` + "`sdk.Intro`" + `.

## [v0.3.0] - unreleased

### Added
- ` + "`sdk.New`" + `.

### Breaking
- ` + "`sdk.ErrRefused`" + ` is gone. Migration: use
  ` + "`sdk.ErrDenied`" + `, and
` + "`process.Run`" + ` (a lazy continuation line).
* ` + "`meshtest.Mesh.On`" + ` takes a context.

  A second paragraph of the same bullet names ` + "`sdk.Config.Timeout`" + `.

A paragraph after the list names ` + "`sdk.NotABullet`" + `.
- ` + "`schema.File`" + `, last.

### Fixed
- ` + "`sdk.Fixed`" + ` is not a Breaking bullet.

## [v0.2.0] - 2026-12-10

Commit: 0123456789abcdef0123456789abcdef01234567

### Breaking
- ` + "`sdk.Old`" + `.

## [v0.1.0] - 2026-12-04

Commit: b02ef46
` + "```" + `
## [v9.9.9] - in a fence, not a heading
### Breaking
` + "```" + `
`

func TestParseChangelog(t *testing.T) {
	got := parseChangelog(changelog)
	want := []release{
		{version: "v0.3.0", date: "unreleased", hasBreaking: true, breaking: []string{
			"`sdk.ErrRefused` is gone. Migration: use `sdk.ErrDenied`, and `process.Run` (a lazy continuation line).",
			"`meshtest.Mesh.On` takes a context. A second paragraph of the same bullet names `sdk.Config.Timeout`.",
			"`schema.File`, last.",
		}},
		{version: "v0.2.0", date: "2026-12-10", commit: "0123456789abcdef0123456789abcdef01234567",
			hasBreaking: true, breaking: []string{"`sdk.Old`."}},
		{version: "v0.1.0", date: "2026-12-04", commit: "b02ef46"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d releases, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.version != w.version || g.date != w.date || g.commit != w.commit || g.hasBreaking != w.hasBreaking ||
			!slices.Equal(g.breaking, w.breaking) {
			t.Errorf("release %d:\n got %+v %q\nwant %+v %q", i, g, g.breaking, w, w.breaking)
		}
	}
}

func TestTheRepositorysChangelogParses(t *testing.T) {
	// The real one, which make lint reads: the release in progress and the
	// release it is compared with are where apicheck looks for them.
	releases := parseChangelog(readFile(t, "../../CHANGELOG.md"))
	cur, ok := inProgress(releases)
	if !ok || !cur.hasBreaking || len(cur.breaking) == 0 {
		t.Errorf("release in progress: %+v, %v; want one with a Breaking bullet", cur, ok)
	}
	base, err := baseRelease(releases, "")
	if err != nil || len(base.commit) != 40 {
		t.Errorf("base release: %+v, %v; want one with a full Commit:", base, err)
	}
}

func TestBaseRelease(t *testing.T) {
	releases := []release{
		{version: "v0.4.0", date: "unreleased"},
		{version: "v0.3.0", date: "2027-01-01", commit: "ccc"},
		{version: "v0.2.0", date: "2026-12-10"},
		{version: "v0.1.0", date: "2026-12-04", commit: "aaa"},
	}
	for _, tc := range []struct {
		releases []release
		version  string
		commit   string // want; "" for an error
		err      string // in the error
	}{
		{releases, "", "ccc", ""},
		{releases, "v0.1.0", "aaa", ""},
		{releases, "v0.2.0", "", "has no `Commit:` line"},
		{releases, "v0.4.0", "", "is not released"},
		{releases, "v1.0.0", "", "no section `## [v1.0.0] - DATE`"},
		{releases[:1], "", "", "no released section"},
		{nil, "", "", "no released section"},
	} {
		got, err := baseRelease(tc.releases, tc.version)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("baseRelease(%q) = %+v, %v; want an error with %q", tc.version, got, err, tc.err)
			}
			continue
		}
		if err != nil || got.commit != tc.commit {
			t.Errorf("baseRelease(%q) = %+v, %v; want commit %q", tc.version, got, err, tc.commit)
		}
	}
}

func TestCodeSpans(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"no spans", nil},
		{"`sdk.A` and `process.Run`.", []string{"sdk.A", "process.Run"}},
		{"`` `sdk.A` ``", []string{"`sdk.A`"}},
		{"`` sdk.A ``", []string{"sdk.A"}},
		{"` sdk.A`", []string{" sdk.A"}},
		{"`  `", []string{"  "}},
		{"an unclosed `sdk.A", nil},
		{"``sdk.A` ``", []string{"sdk.A` "}},
		{"\\`sdk.A\\` is escaped", nil},
		{"`sdk.Mesh.On(ctx)`", []string{"sdk.Mesh.On(ctx)"}},
		{"``", nil},
	} {
		if got := codeSpans(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("codeSpans(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}
