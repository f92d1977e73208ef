package hostile

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/internal/unitfile"
)

// nobody is the unprivileged user meshd runs as when the test runs as
// root (as CI does).
const nobody = 65534

// TestModuleCannotReachTheNodesSecrets runs meshd as an unprivileged user
// (setpriv when the test is root) with its password in
// amqp_password_file, and a hostile module that reads its own
// environment and meshd's /proc entries: none of them holds the password
// or the node's configuration.
func TestModuleCannotReachTheNodesSecrets(t *testing.T) {
	dir, err := os.MkdirTemp("", "hostile-meshd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	meshd := filepath.Join(filepath.Dir(evilBin), "meshd")
	if out, err := exec.Command("go", "build", "-o", meshd, "../../cmd/meshd").CombinedOutput(); err != nil {
		t.Fatalf("build meshd: %v\n%s", err, out)
	}
	vhostURL := brokertest.VHost(t)
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	u.User = url.User(u.User.Username()) // no password in the config
	passwordFile := filepath.Join(dir, "amqp-password")
	report := newReports(t, dir, "report")
	cfg := filepath.Join(dir, "mesh.yaml")
	state := filepath.Join(dir, "state")
	// meshd's files, which its module runs as its user may read as far as
	// their modes go: Landlock is what keeps it out.
	targets := []string{cfg, passwordFile, state, filepath.Join(state, "spool.db")}
	writeOwned(t, passwordFile, password+"\n")
	writeOwned(t, cfg, fmt.Sprintf(`node: anchor
amqp_url: %s
amqp_password_file: %s
state_dir: %s
modules:
  - name: evil
    path: %s
    config: {attack: snoop, report: %s, name: evil, queue: %q}
`, u.String(), passwordFile, state, evilBin, report.path, strings.Join(targets, ",")))

	var cmd []string
	if os.Geteuid() == 0 {
		cmd = []string{"setpriv", fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups"}
	}
	// Secrets in meshd's environment, as an operator might have them.
	env := []string{"AWS_SECRET_ACCESS_KEY=s3cret-aws", "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer s3cret", "MESH_CONFIG=" + cfg}
	lines := runMeshdUntilReported(t, append(cmd, meshd, "run", "--config", cfg), env, report)

	procEnv := step(lines, "environ").Got
	for _, secret := range []string{":" + password + "@", "MESH_CONFIG", "AWS_SECRET_ACCESS_KEY", "OTEL_EXPORTER_OTLP_HEADERS", "s3cret", "MESH_AMQP"} {
		if strings.Contains(procEnv, secret) {
			t.Errorf("the module's environment holds %q:\n%s", secret, procEnv)
		}
	}
	for _, what := range []string{"proc.environ", "proc.mem"} {
		l := step(lines, what)
		if l.Err == "" || !strings.Contains(l.Err, "permission denied") {
			t.Errorf("the module read meshd's %s: %+v, want permission denied", what, l)
		}
	}
	if l := step(lines, "proc.cmdline"); l.Step == "" || strings.Contains(l.Got, ":"+password+"@") || !strings.Contains(l.Got, "run") {
		t.Errorf("meshd's command line holds the password: %q", l.Got)
	}
	if confine.ABI() < 1 {
		t.Logf("this kernel offers no Landlock: the module runs as meshd's user unconfined, as meshd's log says")
		return
	}
	for _, path := range targets {
		if l := step(lines, "read "+path); l.Step == "" || !strings.Contains(l.Err, "permission denied") {
			t.Errorf("the module confined by Landlock read %s: %+v, want permission denied", path, l)
		}
	}
	if l := step(lines, "write "+filepath.Join(state, "planted-by-evil")); l.Step == "" || !strings.Contains(l.Err, "permission denied") {
		t.Errorf("the module confined by Landlock wrote into the state dir: %+v", l)
	}
	if confine.ABI() >= 6 {
		if l := step(lines, "signal meshd"); l.Step == "" || !strings.Contains(l.Err, "operation not permitted") {
			t.Errorf("the module confined by Landlock may signal meshd: %+v", l)
		}
	}
	if l := step(lines, "own dir "+filepath.Join(state, "modules", "evil")); l.Step == "" || l.Err != "" {
		t.Errorf("the confined module has no directory of its own: %+v", l)
	}
}

// runMeshdUntilReported runs meshd (argv, with env added to the test's
// environment) until the hostile module's report says it is done, then
// stops it with SIGTERM; it returns the report.
func runMeshdUntilReported(t *testing.T, argv, env []string, report *reports) []reportLine {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...) // stopped with SIGTERM at cleanup, not killed when ctx ends
	cmd.Env = append(os.Environ(), env...)
	var logs strings.Builder
	cmd.Stderr, cmd.Stdout = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start meshd: %v", err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-stopped
		}
		if t.Failed() {
			t.Logf("meshd's log:\n%s", logs.String())
		}
	})
	exited := make(chan error, 1)
	go func() { // tells waitReport, and gives stopped back for the cleanup
		err := <-stopped
		stopped <- err
		exited <- err
	}()
	return waitReport(t, report, "done", exited)
}

// writeOwned writes a file only nobody (meshd's user here) may read.
func writeOwned(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(path, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
}

// TestModulesRunAsTheirOwnUsers (as root): meshd runs modules as users of
// their own (user: auto, and so by default), each with a directory of its
// own; a hostile one can read neither the config (though its mode lets
// others read it), nor meshd's state, nor the other module's directory,
// write into neither, nor signal meshd, and holds no capability.
func TestModulesRunAsTheirOwnUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("meshd changes users only as root or with capabilities, which only root can give it here")
	}
	modulesRunAsTheirOwnUsers(t, nil, "")
}

// TestModulesOfAMeshdWithCapabilities (as root): meshd runs as the
// packaged unit runs it (packaging/meshd.service, read: its capabilities
// ambient and bounding, as systemd puts them, no new privileges, its
// umask; nobody standing in for its user; built without cgo, as make
// release builds it), and still runs each module as a user of its own,
// confined; the hostile module inherits none of meshd's capabilities: it
// cannot become root, give its directory away, signal init or read
// /etc/shadow, nor list or write the other module's TMPDIR.
func TestModulesOfAMeshdWithCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can start meshd as another user with capabilities")
	}
	modulesRunAsTheirOwnUsers(t, asTheUnit(t, nil), "0")
}

// asTheUnit is the command prefix that starts a program as
// packaging/meshd.service starts meshd (unitfile.Service.Setpriv and
// Shell), as nobody, less the capabilities named in without.
func asTheUnit(t *testing.T, without []string) []string {
	t.Helper()
	u, err := unitfile.Read("../../packaging/meshd.service")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := u.Service()
	if err != nil {
		t.Fatal(err)
	}
	svc.AmbientCapabilities = slices.DeleteFunc(svc.AmbientCapabilities, func(c string) bool { return slices.Contains(without, c) })
	svc.CapabilityBoundingSet = slices.DeleteFunc(svc.CapabilityBoundingSet, func(c string) bool { return slices.Contains(without, c) })
	return append(svc.Setpriv(nobody, nobody), svc.Shell()...)
}

// modulesRunAsTheirOwnUsers runs meshd (built with CGO_ENABLED=cgo, the
// go command's default if empty) under prefix (a setpriv command, or none
// for root) with a victim module and a hostile one, and checks what the
// hostile one could reach.
func modulesRunAsTheirOwnUsers(t *testing.T, prefix []string, cgo string) {
	dir, err := os.MkdirTemp("", "hostile-users-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // the modules write their reports here
		t.Fatal(err)
	}
	meshd := filepath.Join(filepath.Dir(evilBin), "meshd")
	if cgo != "" {
		meshd += "-cgo" + cgo
	}
	build := exec.Command("go", "build", "-o", meshd, "../../cmd/meshd")
	if cgo != "" {
		build.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build meshd: %v\n%s", err, out)
	}
	state := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "mesh.yaml")
	victimReport, evilReport := newReports(t, dir, "victim"), newReports(t, dir, "evil")
	victimSecret := filepath.Join(state, "modules", "victim", "secret")
	targetList := []string{cfg, state, filepath.Join(state, "spool.db"), filepath.Join(state, "modules", "victim"), victimSecret}
	writable := []string{state, filepath.Join(state, "modules", "victim")}
	if confine.ABI() >= 1 { // each confined module has a TMPDIR of its own, beside the others'
		victimTmp := "$TMPDIR/../victim"
		targetList, writable = append(targetList, victimTmp), append(writable, victimTmp)
	}
	targets := strings.Join(targetList, ",")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`node: anchor
amqp_url: %s
state_dir: %s
modules:
  - name: victim
    path: %s
    user: auto
    config: {attack: none, report: %s, name: victim}
  - name: evil
    path: %s
    config: {attack: snoop, report: %s, name: evil, queue: %q}
`, brokertest.VHost(t), state, evilBin, victimReport.path, evilBin, evilReport.path, targets)), 0o644); err != nil {
		t.Fatal(err)
	}
	lines := runMeshdUntilReported(t, append(prefix, meshd, "run", "--config", cfg), nil, evilReport)
	victim := readReport(victimReport)
	own := func(lines []reportLine, name string) string {
		for _, l := range lines {
			if strings.HasPrefix(l.Step, "own dir ") {
				if l.Err != "" || !strings.HasSuffix(l.Step, "/modules/"+name) {
					t.Errorf("%s's own directory: %+v", name, l)
				}
				return l.Got
			}
		}
		t.Errorf("%s reported no directory of its own: %+v", name, lines)
		return ""
	}
	evilUID, victimUID := own(lines, "evil"), own(victim, "victim")
	if evilUID == "uid 0" || victimUID == "uid 0" || evilUID == victimUID || evilUID == fmt.Sprintf("uid %d", nobody) {
		t.Errorf("the modules run as %s and %s: want two users of their own, neither root nor meshd's", evilUID, victimUID)
	}
	for _, path := range strings.Split(targets, ",") {
		l := step(lines, "read "+path)
		if l.Step == "" || !strings.Contains(l.Err, "permission denied") {
			t.Errorf("the hostile module read %s: %+v, want permission denied", path, l)
		}
	}
	for _, dir := range writable {
		if l := step(lines, "write "+dir+"/planted-by-evil"); l.Step == "" || !strings.Contains(l.Err, "permission denied") {
			t.Errorf("the hostile module wrote into %s: %+v", dir, l)
		}
	}
	if l := step(lines, "signal meshd"); l.Step == "" || !strings.Contains(l.Err, "operation not permitted") {
		t.Errorf("the hostile module may signal meshd: %+v", l)
	}
	checkNoPrivileges(t, lines)
	if b, err := os.ReadFile(victimSecret); err != nil || string(b) != "of victim" {
		t.Errorf("the victim's own file: %q %v", b, err)
	}
}

// checkNoPrivileges checks the hostile module's report of tryPrivileges:
// no capability in any set, and every attempt refused.
func checkNoPrivileges(t *testing.T, lines []reportLine) {
	t.Helper()
	caps := step(lines, "capabilities")
	if caps.Step == "" {
		t.Errorf("the hostile module reported no capabilities: %+v", lines)
	}
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if !strings.Contains(caps.Got, set+":\t0000000000000000") {
			t.Errorf("the hostile module holds capabilities in %s:\n%s", set, caps.Got)
		}
	}
	for _, what := range []string{"setuid root", "setgid root", "chown own dir to root", "signal init"} {
		if l := step(lines, what); l.Step == "" || !strings.Contains(l.Err, "operation not permitted") {
			t.Errorf("the hostile module tried %s: %+v, want operation not permitted", what, l)
		}
	}
	if l := step(lines, "read /etc/shadow"); l.Step == "" || !strings.Contains(l.Err, "permission denied") {
		t.Errorf("the hostile module read /etc/shadow: %+v, want permission denied", l)
	}
}
