package unitfile_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/caps"
	"github.com/meshkit/mesh/internal/unitfile"
)

func TestService(t *testing.T) {
	u, err := unitfile.Parse(strings.NewReader(`# a comment
[Unit]
Description=x
[Service]
User=mesh
ExecStart=-/usr/bin/meshd run \
  --config /etc/mesh/mesh.yaml
AmbientCapabilities=CAP_SETUID cap_setgid
AmbientCapabilities=CAP_KILL CAP_SETUID
CapabilityBoundingSet=CAP_CHOWN
CapabilityBoundingSet=
CapabilityBoundingSet=CAP_SETUID
; another comment
NoNewPrivileges=yes
UMask=0077
WorkingDirectory=-/var/lib/mesh
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := u.Service()
	if err != nil {
		t.Fatal(err)
	}
	if s.User != "mesh" || s.Group != "" || !s.NoNewPrivileges || s.UMask != 0o077 || s.WorkingDirectory != "/var/lib/mesh" {
		t.Errorf("service %+v", s)
	}
	if !slices.Equal(s.ExecStart, []string{"/usr/bin/meshd", "run", "--config", "/etc/mesh/mesh.yaml"}) {
		t.Errorf("ExecStart %q", s.ExecStart)
	}
	if !slices.Equal(s.AmbientCapabilities, []string{"CAP_SETUID", "CAP_SETGID", "CAP_KILL"}) {
		t.Errorf("AmbientCapabilities %q (want each assignment added, once each)", s.AmbientCapabilities)
	}
	if !s.Bounded || !slices.Equal(s.CapabilityBoundingSet, []string{"CAP_SETUID"}) {
		t.Errorf("CapabilityBoundingSet %q (want the empty assignment to reset it)", s.CapabilityBoundingSet)
	}
	want := []string{"setpriv", "--reuid=7", "--regid=8", "--init-groups", "--inh-caps=+setuid,+setgid,+kill",
		"--ambient-caps=+setuid,+setgid,+kill", "--bounding-set=-all,+setuid", "--no-new-privs"}
	if got := s.Setpriv(7, 8); !slices.Equal(got, want) {
		t.Errorf("Setpriv = %q, want %q", got, want)
	}
	if got := s.Shell("meshd", "run"); !slices.Equal(got, []string{"sh", "-c", `umask 0077 && exec "$@"`, "sh", "meshd", "run"}) {
		t.Errorf("Shell = %q", got)
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"User=mesh\n", "before any [section]"},
		{"[Service]\nUser\n", "not Key=Value"},
		{"[Service\n", "without ]"},
		{"[Service]\nExecStart=a \\\n", "ends within a continued line"},
		{"[Service]\nAmbientCapabilities=~CAP_SYS_ADMIN\n", "inverted"},
		{"[Service]\nNoNewPrivileges=maybe\n", "not a boolean"},
		{"[Service]\nUMask=0999\n", "not an octal mode"},
		{"[Unit]\nDescription=x\n", "no [Service] section"},
	} {
		u, err := unitfile.Parse(strings.NewReader(tc.text))
		if err == nil {
			_, err = u.Service()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.text, err, tc.want)
		}
	}
}

// TestPackagedUnit reads the unit the package installs: meshd runs as
// mesh with the five capabilities it needs to give modules users of
// their own (internal/caps.ForModuleUsers; ADR 47).
func TestPackagedUnit(t *testing.T) {
	u, err := unitfile.Read("../../packaging/meshd.service")
	if err != nil {
		t.Fatal(err)
	}
	s, err := u.Service()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range caps.ForModuleUsers {
		want = append(want, c.String())
	}
	slices.Sort(want)
	for name, got := range map[string][]string{"AmbientCapabilities": s.AmbientCapabilities, "CapabilityBoundingSet": s.CapabilityBoundingSet} {
		got = slices.Sorted(slices.Values(got))
		if !slices.Equal(got, want) {
			t.Errorf("packaging/meshd.service's %s= is %q, want %q", name, got, want)
		}
	}
	if s.User != "mesh" || !s.NoNewPrivileges || s.UMask != 0o077 || s.WorkingDirectory != "/var/lib/mesh" {
		t.Errorf("packaging/meshd.service: %+v", s)
	}
}
