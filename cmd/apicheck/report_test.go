package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// readFile returns the content of the file at path.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// An apidiff report (the pinned version's) on a package p with removed,
// changed and added names of every kind.
const apidiffReport = `Incompatible changes:
- (*Box[K, V]).Get: changed from func(K) V to func(K, V) V
- (*T).B: removed
- Config.Name: removed
- ErrRefused: removed
- inner.Hidden, method set of *Outer: removed
Compatible changes:
- Config.Extra: added
- New: added
`

func TestParseReport(t *testing.T) {
	got, err := parseReport("example.com/p", apidiffReport)
	if err != nil {
		t.Fatal(err)
	}
	want := []change{
		{"example.com/p", "(*Box[K, V]).Get: changed from func(K) V to func(K, V) V", false},
		{"example.com/p", "(*T).B: removed", false},
		{"example.com/p", "Config.Name: removed", false},
		{"example.com/p", "ErrRefused: removed", false},
		{"example.com/p", "inner.Hidden, method set of *Outer: removed", false},
		{"example.com/p", "Config.Extra: added", true},
		{"example.com/p", "New: added", true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	for _, out := range []string{"", "\n", "Compatible changes:\n"} {
		if got, err := parseReport("p", out); err != nil || len(got) != 0 {
			t.Errorf("parseReport(%q) = %v, %v; want no change", out, got, err)
		}
	}
	for _, out := range []string{
		"- ErrRefused: removed\n", // before a heading
		"Incompatible changes:\n* ErrRefused: removed\n",
		"Breaking changes:\n- ErrRefused: removed\n",
	} {
		if _, err := parseReport("p", out); err == nil || !strings.Contains(err.Error(), "unexpected line") {
			t.Errorf("parseReport(%q): err %v, want an unexpected line", out, err)
		}
	}
}

func TestIdentifier(t *testing.T) {
	const mod = "github.com/meshkit/mesh"
	for _, tc := range []struct {
		pkg, message string
		want         string // "" for an error
	}{
		{mod + "/sdk", "ErrRefused: removed", "sdk.ErrRefused"},
		{mod + "/sdk/process", "Run: changed from func(context.Context, sdk.Module) error to func(context.Context) error", "process.Run"},
		{mod + "/sdk/meshtest", "(*Mesh).On: removed", "meshtest.Mesh.On"},
		{mod + "/sdk/meshtest", "Mesh.On: changed from func(string) to func(string, int)", "meshtest.Mesh.On"},
		{mod + "/sdk", "Config.Timeout: changed from int to string", "sdk.Config.Timeout"},
		{mod + "/sdk", "Handler.Handle: added", "sdk.Handler.Handle"},
		{mod + "/sdk", "Mesh.emit: added unexported method", "sdk.Mesh.emit"},
		{mod + "/sdk", "Impl: no longer implements Emitter", "sdk.Impl"},
		{mod + "/sdk", "Max: value changed from 3 to 4", "sdk.Max"},
		{mod + "/sdk", "Kind: changed from type to const", "sdk.Kind"},
		{mod + "/sdk", "Config: old is comparable, new is not", "sdk.Config"},
		{mod + "/sdk", "(*Box[K, V]).Get: changed from func(K) V to func(K, V) V", "sdk.Box.Get"},
		{mod + "/sdk", "Box[K, V].Len: removed", "sdk.Box.Len"},
		{mod + "/sdk", "(*Box[map[string]example.com/x.Y]).Get: removed", "sdk.Box.Get"},
		{mod + "/sdk", "inner.Hidden, method set of *Outer: removed", "sdk.Outer.Hidden"},
		{mod + "/sdk", "Inner.Hidden, method set of Outer: removed", "sdk.Outer.Hidden"},
		{mod + "/sdk/meshtest", mod + "/sdk.(*Event).Ack, method set of *Delivery: removed", "meshtest.Delivery.Ack"},
		{mod + "/sdk/meshtest", mod + "/sdk.Event.Source: removed", "sdk.Event.Source"},
		{mod + "/sdk/meshtest", mod + "/sdk.(*Event).Ack: removed", "sdk.Event.Ack"},
		{mod + "/sdk", "./process.Options.Name: removed", "process.Options.Name"},
		{mod + "/sdk", "package " + mod + "/sdk/foo: removed", "sdk/foo"},
		{mod + "/sdk", "package " + mod + "/sdk/bar: added", "sdk/bar"},
		{mod + "/sdk", "package example.com/other: removed", "example.com/other"},
		// Lines it cannot read: the check fails rather than guess.
		{mod + "/sdk", "removed", ""},
		{mod + "/sdk", ": removed", ""},
		{mod + "/sdk", "package " + mod + "/sdk/foo", ""},
		{mod + "/sdk", "./nodot: removed", ""},
		{mod + "/sdk", "two words: removed", ""},
	} {
		got, err := identifier(mod, change{pkg: tc.pkg, message: tc.message})
		if tc.want == "" {
			if err == nil {
				t.Errorf("identifier(%q, %q) = %q, want an error", tc.pkg, tc.message, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("identifier(%q, %q) = %q, %v; want %q", tc.pkg, tc.message, got, err, tc.want)
		}
	}
}
