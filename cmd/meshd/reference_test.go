package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestFlagsAreTheReferences: meshd run's flags and environment variables
// are exactly the ones the configuration reference lists, and each sets
// the key the reference says: a file with the key, the environment
// variable and the flag give the same configuration.
func TestFlagsAreTheReferences(t *testing.T) {
	flags := map[string]string{} // flag name -> env
	for _, f := range runFlags() {
		env := ""
		if e, ok := f.(interface{ GetEnvVars() []string }); ok && len(e.GetEnvVars()) == 1 {
			env = e.GetEnvVars()[0]
		}
		flags[f.Names()[0]] = env
	}
	listed := map[string]string{}
	for _, s := range nodeconfig.Settings() {
		if s.Flag != "" {
			listed[s.Flag] = s.Env
		} else if s.Env != "" && s.Scope != nodeconfig.ScopeProcess {
			t.Errorf("%s: an environment variable without a flag", s.Key)
		}
	}
	if !reflect.DeepEqual(flags, listed) {
		t.Errorf("meshd run's flags and their environment variables\n%v\ndiffer from the reference's\n%v", flags, listed)
	}

	dir := t.TempDir()
	load := func(args []string) nodeconfig.File {
		t.Helper()
		var got nodeconfig.File
		a := &cli.App{Name: "meshd", Flags: runFlags(), Action: func(c *cli.Context) error {
			var err error
			got, err = config(c)
			return err
		}}
		if err := a.Run(append([]string{"meshd"}, args...)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return got
	}
	base := filepath.Join(dir, "base.yaml")
	if err := os.WriteFile(base, []byte("node: base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, s := range nodeconfig.Settings() {
		if s.Flag == "" || s.Key == "" || len(s.Valid) == 0 {
			continue
		}
		var v any
		if err := yaml.Unmarshal([]byte(s.Valid[0]), &v); err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprint(v)
		if list, ok := v.([]any); ok {
			var parts []string
			for _, p := range list {
				parts = append(parts, fmt.Sprint(p))
			}
			text = strings.Join(parts, ",")
		}
		withKey := filepath.Join(dir, s.Flag+".yaml")
		content := "node: base\n"
		if s.Key == "node" {
			content = ""
		}
		keyLine := s.Key + ": " + s.Valid[0] + "\n"
		if parent, child, nested := strings.Cut(s.Key, "."); nested { // tls.server_name
			keyLine = parent + ":\n  " + child + ": " + s.Valid[0] + "\n"
		}
		if err := os.WriteFile(withKey, []byte(content+keyLine), 0o644); err != nil {
			t.Fatal(err)
		}
		want := load([]string{"--config", withKey})
		if got := load([]string{"--config", base, "--" + s.Flag, text}); !reflect.DeepEqual(got, want) {
			t.Errorf("--%s %s gives %+v, the file's %s: %s gives %+v", s.Flag, text, got, s.Key, s.Valid[0], want)
		}
		t.Setenv(s.Env, text)
		if got := load([]string{"--config", base}); !reflect.DeepEqual(got, want) {
			t.Errorf("%s=%s gives %+v, the file's %s: %s gives %+v", s.Env, text, got, s.Key, s.Valid[0], want)
		}
		os.Unsetenv(s.Env)
		checked++
	}
	if checked < 5 {
		t.Errorf("only %d flags checked", checked)
	}
}
