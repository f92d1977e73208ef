package nodeconfig_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestConfigErrorsSpeakMeshYAML: a typo, a value of the wrong kind and an
// unknown module kind are named by their key and place in mesh.yaml, with
// the nearest key, the kind of value wanted and an example; never by Go's
// types.
func TestConfigErrorsSpeakMeshYAML(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"typo", "node: n\nmodules:\n  - name: ledger\n    path: /bin/true\n    concurency: 4\n",
			[]string{"line 5: modules[0] (ledger).concurency: no such key; did you mean concurrency?"}},
		{"list wanted", "node: n\nmodules:\n  - name: billing\n    path: /bin/true\n    calls: receipts.*\n",
			[]string{`line 5: modules[0] (billing).calls: wants a list, e.g. ["tax.*"], not "receipts.*"`}},
		{"duration", "node: n\ngrace: soon\n", []string{`line 2: grace: wants a duration, e.g. `, `not "soon"`}},
		{"number", "node: n\ndefaults:\n  prefetch: lots\n", []string{`line 3: defaults.prefetch: wants a whole number`}},
		{"single value wanted", "node: [a, b]\n", []string{`line 1: node: wants a single value`, `not a list`}},
		{"nested typo", "node: n\ntls:\n  ca_fle: x\n", []string{"line 3: tls.ca_fle: no such key; did you mean ca_file?"}},
		{"far off", "node: n\nzzzzzzzzzzzz: 1\n", []string{"line 2: zzzzzzzzzzzz: no such key (the keys here: amqp_password_file, "}},
		{"two at once", "node: n\nmodules:\n  - name: a\n    path: /bin/true\n    prefech: 2\n    tools: x.y\n",
			[]string{"line 5: modules[0] (a).prefech: no such key; did you mean prefetch?", "line 6: modules[0] (a).tools: wants a list"}},
		{"empty", "", []string{"the file is empty"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mesh.yaml")
			if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := nodeconfig.Load(path)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, go_ := range []string{"nodeconfig.", "[]string", "!!str", "time.Duration", "not found in type"} {
				if strings.Contains(err.Error(), go_) {
					t.Errorf("error %q speaks Go (%s)", err, go_)
				}
			}
		})
	}

	// An unknown kind is Validate's, with the nearest kind.
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte("node: n\nmodules:\n  - name: d\n    kind: dispatchr\n    path: /bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), `modules[0].kind: "dispatchr" is not a kind of module`) || !strings.Contains(err.Error(), "did you mean dispatcher?") {
		t.Errorf("validate: %v, want the kind named with the nearest", err)
	}
}

// FuzzLoadShape: any file either loads or is refused with an error;
// never a panic.
func FuzzLoadShape(f *testing.F) {
	f.Add("node: n\nmodules:\n  - name: a\n    path: /x\n    calls: [a.*]\n")
	f.Add("modules: {a: 1}\ndefaults: [1]\n")
	f.Add("a: &x [1]\nb: *x\n")
	f.Add("tls:\n  ca_file: [x]\nmodules:\n  - [x]\n  - name: {a: b}\n")
	f.Fuzz(func(t *testing.T, s string) {
		path := filepath.Join(t.TempDir(), "mesh.yaml")
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = nodeconfig.Load(path)
	})
}

// TestNetworkGrantsAreRead: an entry's network grants are read as the
// launcher enforces them, and a malformed one is named by its place.
func TestNetworkGrantsAreRead(t *testing.T) {
	n := nodeconfig.Network{Connect: []string{"db.internal:5432", "*:8000-8010", "[::1]:443"}, Bind: []string{":0", "127.0.0.1:9000"}}
	c, err := n.Confine()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.Connect, c.Bind); got != "[5432 8000-8010 443] [0 9000]" {
		t.Errorf("the ports: %s", got)
	}
	for _, c := range []struct {
		n    nodeconfig.Network
		want string
	}{
		{nodeconfig.Network{Connect: []string{":5432"}}, `connect[0]: ":5432" names no host`},
		{nodeconfig.Network{Connect: []string{"db"}}, `connect[0]: "db": want HOST:PORT`},
		{nodeconfig.Network{Connect: []string{"db:0"}}, `connect[0]: "db:0": port 0 is for bind`},
		{nodeconfig.Network{Connect: []string{"ok:1", "db:10-5"}}, `connect[1]: port range "10-5": 10 is above 5`},
		{nodeconfig.Network{Bind: []string{":70000"}}, `bind[0]: port "70000"`},
		{nodeconfig.Network{Connect: []string{"a b:80"}}, `is not a host name`},
	} {
		if _, _, err := c.n.Parse(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.n, err, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte("node: n\nmodules:\n  - name: a\n    path: /bin/true\n    network: {conect: [\"db:5432\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeconfig.Load(path); err == nil || !strings.Contains(err.Error(), "network.conect: no such key; did you mean connect?") {
		t.Errorf("a typo under network: %v", err)
	}
	if err := os.WriteFile(path, []byte("node: n\nmodules:\n  - name: a\n    path: /bin/true\n    network: {connect: [\"db\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), `modules[0].network.connect[0]: "db"`) {
		t.Errorf("a grant without a port: %v", err)
	}
}
