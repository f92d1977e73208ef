package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/caps"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestWarnModuleUsers: meshd warns where it was meant to give its modules
// users of their own and cannot (the config asks for one, it holds some
// of the capabilities, it is the system service meshd.service), naming
// what it lacks and the unit's lines that give it; a meshd run by hand
// with none and nothing asked (the documented mode) does not warn. The
// binary's path is test/hostile's TestMeshdWarnsWithoutModuleUsers.
func TestWarnModuleUsers(t *testing.T) {
	four := caps.Set(1<<caps.SetUID | 1<<caps.SetGID | 1<<caps.Chown | 1<<caps.Kill)
	plain := nodeconfig.File{Modules: []nodeconfig.Module{{Name: "audit-logger"}}}
	asks := nodeconfig.File{Modules: []nodeconfig.Module{{Name: "audit-logger"}, {Name: "billing", User: "auto"}}}
	for _, tc := range []struct {
		name    string
		f       nodeconfig.File
		missing []caps.Cap
		held    caps.Set
		unit    string
		want    []string // in the warning; none: no warning
	}{
		{name: "all held", f: asks, held: four | 1<<caps.DACOverride, unit: "meshd.service"},
		{name: "by hand, none, nothing asked", f: plain, missing: caps.ForModuleUsers},
		{name: "four of five", f: plain, missing: []caps.Cap{caps.DACOverride}, held: four,
			want: []string{"without CAP_DAC_OVERRIDE", "AmbientCapabilities=CAP_DAC_OVERRIDE and CapabilityBoundingSet=CAP_DAC_OVERRIDE", "meshd holds CAP_CHOWN CAP_KILL CAP_SETGID CAP_SETUID"}},
		{name: "the config asks", f: asks, missing: caps.ForModuleUsers,
			want: []string{"AmbientCapabilities=CAP_CHOWN CAP_DAC_OVERRIDE CAP_KILL CAP_SETGID CAP_SETUID", "modules[1] (billing) says user: auto"}},
		{name: "the system service, none held", f: plain, missing: caps.ForModuleUsers, unit: "meshd.service",
			want: []string{"CapabilityBoundingSet=CAP_CHOWN", "the system service meshd.service"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			warnModuleUsers(slog.New(slog.NewJSONHandler(&out, nil)), tc.f, tc.missing, tc.held, tc.unit)
			if len(tc.want) == 0 {
				if out.Len() > 0 {
					t.Errorf("want no warning, got %s", out.String())
				}
				return
			}
			var line struct {
				Level, Msg string
				Why        []string
			}
			if err := json.Unmarshal(out.Bytes(), &line); err != nil {
				t.Fatalf("%v: %q", err, out.String())
			}
			text := line.Msg + " " + strings.Join(line.Why, "; ")
			if line.Level != "WARN" {
				t.Errorf("level %s, want WARN", line.Level)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("the warning does not say %q: %s", w, out.String())
				}
			}
		})
	}
}

func TestMeshdService(t *testing.T) {
	for cgroup, want := range map[string]string{
		"0::/system.slice/meshd.service\n": "meshd.service",
		"12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/system-meshd.slice/meshd@anchor.service\n0::/system.slice/system-meshd.slice/meshd@anchor.service\n": "meshd@anchor.service",
		"0::/system.slice/actions.runner.service\n":                                  "",
		"0::/user.slice/user-1000.slice/user@1000.service/app.slice/meshd.service\n": "",
		"0::/\n": "",
	} {
		if got := meshdService(cgroup); got != want {
			t.Errorf("meshdService(%q) = %q, want %q", cgroup, got, want)
		}
	}
}
