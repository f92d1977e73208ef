package hostile

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/caps"
)

// usersWarning is what meshd's warning that it cannot give its modules
// users of their own begins with.
const usersWarning = "meshd cannot give its modules users of their own"

// TestMeshdWarnsWithoutModuleUsers (as root) runs the meshd binary as
// packaging/meshd.service runs it (unitfile: its capabilities, no new
// privileges, umask; nobody for its user), and as the unit less some of
// its capabilities, until it says it runs: short of one capability (the
// unit as v0.2.0's first package shipped it) or of all with the config
// asking for a user of its own, it warns, naming what it lacks and the
// unit's lines that give it; with the unit's capabilities, or with none
// and nothing asked (meshd run by hand, the documented mode), it does
// not.
func TestMeshdWarnsWithoutModuleUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can start meshd as another user with capabilities")
	}
	meshd := buildMeshd(t, "0")
	var all []string
	for _, c := range caps.ForModuleUsers {
		all = append(all, c.String())
	}
	for _, tc := range []struct {
		name    string
		without []string // capabilities of the unit's it is started without
		user    string   // the module entry's user:
		// runsAs is how the module runs, as the start log says ("": it
		// does not start); warn is what the warning says (none: no
		// warning).
		runsAs string
		warn   []string
	}{
		{name: "the unit", runsAs: "its own user mesh-evil"},
		{name: "the unit without CAP_DAC_OVERRIDE", without: []string{"CAP_DAC_OVERRIDE"}, runsAs: "meshd's user",
			warn: []string{"without CAP_DAC_OVERRIDE", "AmbientCapabilities=CAP_DAC_OVERRIDE and CapabilityBoundingSet=CAP_DAC_OVERRIDE"}},
		{name: "no capabilities, user: auto", without: all, user: "auto",
			warn: []string{"AmbientCapabilities=" + strings.Join(all, " "), "modules[0] (evil) says user: auto"}},
		{name: "no capabilities, nothing asked", without: all, runsAs: "meshd's user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "hostile-unit-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			report := newReports(t, dir, "report")
			cfg := filepath.Join(dir, "mesh.yaml")
			user := ""
			if tc.user != "" {
				user = "\n    user: " + tc.user
			}
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`node: anchor
amqp_url: %s
state_dir: %s
modules:
  - name: evil
    path: %s%s
    config: {attack: none, report: %s, name: evil}
`, brokertest.VHost(t), filepath.Join(dir, "state"), evilBin, user, report.path)), 0o644); err != nil {
				t.Fatal(err)
			}
			lines := runMeshdUntilRunning(t, append(asTheUnit(t, tc.without), meshd, "run", "--config", cfg))
			var warnings []string
			runsAs := ""
			for _, l := range lines {
				if l.Level == "WARN" && strings.HasPrefix(l.Msg, usersWarning) {
					warnings = append(warnings, l.Msg+" "+strings.Join(l.Why, "; "))
				}
				var modules map[string]string
				if l.Msg == "module isolation" && json.Unmarshal(l.Modules, &modules) == nil {
					runsAs = modules["evil"]
				}
			}
			if !strings.HasPrefix(runsAs, tc.runsAs) || (tc.runsAs == "") != (runsAs == "") {
				t.Errorf("the module runs as %q, want %q", runsAs, tc.runsAs)
			}
			if len(tc.warn) == 0 {
				if len(warnings) > 0 {
					t.Errorf("meshd warned: %q", warnings)
				}
				return
			}
			if len(warnings) != 1 {
				t.Fatalf("meshd warned %d times that it cannot give its modules users of their own, want once: %q", len(warnings), warnings)
			}
			for _, w := range tc.warn {
				if !strings.Contains(warnings[0], w) {
					t.Errorf("the warning does not say %q: %s", w, warnings[0])
				}
			}
		})
	}
}

// logLine is what the tests read of a line of meshd's log.
type logLine struct {
	Level, Msg string
	Why        []string
	// Modules is "module isolation"'s (how each module runs) and
	// another's (a number).
	Modules json.RawMessage
}

// buildMeshd builds meshd with CGO_ENABLED=cgo, as make release does with
// 0, beside the hostile module.
func buildMeshd(t *testing.T, cgo string) string {
	t.Helper()
	meshd := filepath.Join(filepath.Dir(evilBin), "meshd-cgo"+cgo)
	build := exec.Command("go", "build", "-o", meshd, "../../cmd/meshd")
	build.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build meshd: %v\n%s", err, out)
	}
	return meshd
}

// runMeshdUntilRunning runs meshd (argv) until its log says the node
// runs, stops it with SIGTERM and returns its log's lines up to there.
func runMeshdUntilRunning(t *testing.T, argv []string) []logLine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start meshd: %v", err)
	}
	var lines []logLine
	var text strings.Builder
	running := false
	sc := bufio.NewScanner(stderr)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		text.WriteString(sc.Text() + "\n")
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		lines = append(lines, l)
		if strings.HasPrefix(l.Msg, "node running") {
			running = true
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	drained := make(chan struct{})
	go func() { // what it says as it stops
		defer close(drained)
		for sc.Scan() {
		}
	}()
	werr := cmd.Wait()
	<-drained
	if !running {
		t.Fatalf("meshd did not say it runs (exit: %v); its log:\n%s", werr, text.String())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("meshd's log:\n%s", text.String())
		}
	})
	return lines
}
