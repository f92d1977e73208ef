package nodeconfig_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// yamlKeys lists the keys a struct type decodes, dotted for nested
// structs (tls.ca_file); defaults and modules are left to the caller.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		key := strings.Split(f.Tag.Get("yaml"), ",")[0]
		switch {
		case key == "" || key == "-":
			continue
		case key == "defaults" || key == "modules":
			continue
		case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)):
			keys = append(keys, yamlKeys(f.Type, prefix+key+".")...)
		default:
			keys = append(keys, prefix+key)
		}
	}
	return keys
}

// TestSettingsCoverTheFile: every key mesh.yaml can hold has a Setting in
// its scope, and every Setting's key is one mesh.yaml can hold.
func TestSettingsCoverTheFile(t *testing.T) {
	want := map[string]string{}
	for _, k := range yamlKeys(reflect.TypeOf(nodeconfig.File{}), "") {
		want[k] = nodeconfig.ScopeNode
	}
	entryOnly := []string{"name", "path", "args", "config", "kind", "user", "required", "group", "partitions", "order_key"}
	for _, k := range yamlKeys(reflect.TypeOf(nodeconfig.Module{}), "") {
		if slices.Contains(entryOnly, k) {
			want[k] = nodeconfig.ScopeEntry
		} else {
			want[k] = nodeconfig.ScopeModule
		}
	}
	got := map[string]string{}
	for _, s := range nodeconfig.Settings() {
		if s.Key == "" {
			if s.Scope != nodeconfig.ScopeProcess || (s.Env == "" && s.Flag == "") {
				t.Errorf("a setting without a key must be a flag or environment variable of meshd's: %+v", s)
			}
			continue
		}
		if _, dup := got[s.Key]; dup {
			t.Errorf("%s is listed twice", s.Key)
		}
		got[s.Key] = s.Scope
		if s.Doc == "" {
			t.Errorf("%s has no doc", s.Key)
		}
	}
	for k, scope := range want {
		if got[k] != scope {
			t.Errorf("mesh.yaml key %s (scope %s) is listed with scope %q in Settings", k, scope, got[k])
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("Settings lists %s, which mesh.yaml has no key for", k)
		}
	}
}

// fileWith writes a minimal valid mesh.yaml with s's key set to value
// (yaml), in a module entry for the module scopes (in defaults: instead
// when inDefaults), and loads it.
func fileWith(t *testing.T, s nodeconfig.Setting, value string, inDefaults bool) nodeconfig.File {
	t.Helper()
	dir := t.TempDir()
	exe := filepath.Join(dir, "module")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{"node": "ref", "amqp_url": "amqp://guest:guest@127.0.0.1:5672/"}
	entry := map[string]any{"name": "m", "path": exe}
	if s.Key != "" && value != "" {
		var v any
		if err := yaml.Unmarshal([]byte(value), &v); err != nil {
			t.Fatalf("%s: value %q is not yaml: %v", s.Key, value, err)
		}
		target := doc
		switch {
		case s.Scope == nodeconfig.ScopeModule && inDefaults:
			target = map[string]any{}
			doc["defaults"] = target
		case s.Scope != nodeconfig.ScopeNode:
			target = entry
		}
		path := strings.Split(s.Key, ".")
		for _, k := range path[:len(path)-1] {
			m, ok := target[k].(map[string]any)
			if !ok {
				m = map[string]any{}
				target[k] = m
			}
			target = m
		}
		target[path[len(path)-1]] = v
	}
	if s.Scope == nodeconfig.ScopeModule && !inDefaults || s.Scope == nodeconfig.ScopeEntry {
		doc["modules"] = []any{entry}
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Load(path)
	if err != nil {
		t.Fatalf("%s: %v\n%s", s.Key, err, b)
	}
	return f
}

// TestSettingsDefaultsAreTheCode's: a key set to the default the
// reference gives changes nothing in the configuration the node runs.
func TestSettingsDefaultsAreTheCodes(t *testing.T) {
	resolved := func(f nodeconfig.File) any {
		grace := f.Grace
		if grace == 0 {
			grace = nodeconfig.DefaultGrace
		}
		return []any{f.Runtime().Resolved(), grace}
	}
	checked := 0
	for _, s := range nodeconfig.Settings() {
		if s.Key == "" || s.Default == "" || s.DefaultInWords || s.Scope == nodeconfig.ScopeEntry {
			continue
		}
		none, set := fileWith(t, s, "", true), fileWith(t, s, s.Default, true)
		if !reflect.DeepEqual(resolved(none), resolved(set)) {
			t.Errorf("%s: the reference says its default is %s, but setting it to that changes the node's configuration:\n%+v\n%+v", s.Key, s.Default, resolved(none), resolved(set))
		}
		checked++
	}
	if checked < 20 {
		t.Errorf("only %d defaults checked", checked)
	}
}

// TestSettingsBoundsAreTheCodes: Validate accepts each value a setting
// lists as valid and refuses each listed as invalid, naming the key.
func TestSettingsBoundsAreTheCodes(t *testing.T) {
	checked := 0
	for _, s := range nodeconfig.Settings() {
		for _, v := range s.Valid {
			if err := fileWith(t, s, v, false).Validate(); err != nil {
				t.Errorf("%s: %s should be valid: %v", s.Key, v, err)
			}
			checked++
		}
		for _, v := range s.Invalid {
			err := fileWith(t, s, v, false).Validate()
			if err == nil {
				t.Errorf("%s: %s should be refused", s.Key, v)
			} else if !strings.Contains(err.Error(), s.Key) {
				t.Errorf("%s: %s is refused without naming the key: %v", s.Key, v, err)
			}
			checked++
		}
	}
	if checked < 40 {
		t.Errorf("only %d bounds checked", checked)
	}
}

// TestReferenceIsCurrent: docs/config.md is what WriteReference writes.
func TestReferenceIsCurrent(t *testing.T) {
	var b strings.Builder
	if err := nodeconfig.WriteReference(&b); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != b.String() {
		t.Error("docs/config.md and the code disagree; run: go run ./cmd/meshd config reference > docs/config.md")
	}
}

// TestEntryOnlyKeysRefusedInDefaults: history and required are granted
// module by module; under defaults: they are refused, naming the key.
func TestEntryOnlyKeysRefusedInDefaults(t *testing.T) {
	for key, d := range map[string]nodeconfig.Module{"defaults.history": {History: true}, "defaults.required": {Required: true},
		"defaults.network": {Network: nodeconfig.Network{Connect: []string{"db:5432"}}}} {
		f := nodeconfig.File{Node: "n", Defaults: d}
		if err := f.Validate(); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming it", key, err)
		}
	}
}
