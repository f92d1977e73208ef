package release

import (
	"io/fs"
	"os"
	"path"
	"regexp"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"
)

// statedMode is the mode a configuration file says it has: the first
// "mode NNNN" of its text (its header comment); ok is false if it says
// none.
func statedMode(text string) (mode fs.FileMode, ok bool) {
	m := regexp.MustCompile(`(?i)\bmode (0[0-7]{3})\b`).FindStringSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseUint(m[1], 8, 32)
	return fs.FileMode(v), err == nil
}

// TestPackagedConfigsSayTheirModes: each configuration file the package
// installs (packaging/nfpm.yaml's config entries, from packaging/ by the
// same name) says in its comment the mode the package gives it, so that
// what an operator reads in /etc/mesh is what the file is. (The release
// test checks the installed files against the same statements.)
func TestPackagedConfigsSayTheirModes(t *testing.T) {
	b, err := os.ReadFile("../../packaging/nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var nfpm struct {
		Contents []struct {
			Dst      string `yaml:"dst"`
			Type     string `yaml:"type"`
			FileInfo struct {
				Mode string `yaml:"mode"`
			} `yaml:"file_info"`
		} `yaml:"contents"`
	}
	if err := yaml.Unmarshal(b, &nfpm); err != nil {
		t.Fatal(err)
	}
	configs := 0
	for _, c := range nfpm.Contents {
		if c.Type != "config|noreplace" {
			continue
		}
		configs++
		want, err := strconv.ParseUint(c.FileInfo.Mode, 8, 32)
		if err != nil {
			t.Errorf("nfpm.yaml: %s: mode %q: %v", c.Dst, c.FileInfo.Mode, err)
			continue
		}
		src := "../../packaging/" + path.Base(c.Dst)
		text, err := os.ReadFile(src)
		if err != nil {
			t.Errorf("%s: %v", c.Dst, err)
			continue
		}
		if got, ok := statedMode(string(text)); !ok || got != fs.FileMode(want) {
			t.Errorf("%s says mode %04o (stated: %v); the package installs it %s as %04o", src, got, ok, c.Dst, want)
		}
	}
	if configs < 2 {
		t.Errorf("nfpm.yaml has %d configuration files, want mesh.yaml and meshd.env", configs)
	}
}
