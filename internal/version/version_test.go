package version

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// The release compiled in is the repository's VERSION file, so that the
// Makefile's stamp and a plain go build agree.
func TestReleaseIsTheVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Release(), strings.TrimSpace(string(b)); got != want {
		t.Fatalf("Release() = %q, VERSION says %q: change internal/version's release with VERSION", got, want)
	}
	if !regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`).MatchString(Release()) {
		t.Fatalf("Release() = %q is not a semantic version (vMAJOR.MINOR.PATCH)", Release())
	}
}

// The release in progress is the CHANGELOG's first, unreleased, section.
func TestReleaseIsTheChangelogsNext(t *testing.T) {
	b, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "## [") {
			if want := "## [" + Release() + "]"; !strings.HasPrefix(line, want) {
				t.Fatalf("CHANGELOG.md's first release is %q, VERSION says %s", strings.TrimSpace(line), Release())
			}
			return
		}
	}
	t.Fatal("CHANGELOG.md has no release section")
}

func TestCommitOf(t *testing.T) {
	for _, tc := range []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{nil, ""},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "b02ef4696ef4e343b2d5612cae1e185e6ca8ee39"}}, "b02ef4696ef4"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "b02ef4696ef4e343"}, {Key: "vcs.modified", Value: "true"}}, "b02ef4696ef4+dirty"},
		{[]debug.BuildSetting{{Key: "vcs.modified", Value: "false"}, {Key: "vcs.revision", Value: "abc"}}, "abc"},
	} {
		if got := commitOf(&debug.BuildInfo{Settings: tc.settings}); got != tc.want {
			t.Errorf("commitOf(%v) = %q, want %q", tc.settings, got, tc.want)
		}
	}
	// go install ...@COMMIT stamps no VCS settings; its main module's
	// pseudo-version names the commit.
	for version, want := range map[string]string{
		"v0.0.0-20261207043528-8ba640e225d1":                "8ba640e225d1",
		"v0.2.1-0.20261207043528-8ba640e225d1":              "8ba640e225d1",
		"v0.3.0-rc.1.0.20261207043528-8ba640e225d1":         "8ba640e225d1",
		"v0.0.0-20261207043528-8ba640e225d1+dirty":          "8ba640e225d1+dirty",
		"v2.0.1-0.20261207043528-8ba640e225d1+incompatible": "8ba640e225d1",
		"v0.2.0":  "",
		"(devel)": "",
		"":        "",
	} {
		info := &debug.BuildInfo{Main: debug.Module{Version: version}}
		if got := commitOf(info); got != want {
			t.Errorf("commitOf of main module version %q = %q, want %q", version, got, want)
		}
	}
}
