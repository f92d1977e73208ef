//go:build release

// Package release tests make release (scripts/release.sh) and the package
// it makes: two builds of one commit from two directories give the same
// bytes; the archive, SBOM and checksums hold what they should; the unit
// lints with an exposure of 4.0 or less; and, as root on a machine with
// dpkg, the .deb installs, runs its meshd with its config as the unit
// would (a module as a user of its own, confined), upgrades over itself
// keeping an edited config, removes and purges cleanly
// (docs/adr/0047-packages-and-the-hardened-unit.md). Build tag release:
// make test runs it beside the fault tests, after the soak, rather than
// within go test ./..., where its two builds slowed every other package.
package release

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/unitfile"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// arch is the one architecture the test builds (make release builds
// amd64 and arm64 alike, with the same steps).
const arch = "amd64"

// release runs scripts/release.sh from dir into out for arch alone.
func release(t *testing.T, dir, out string) {
	t.Helper()
	cmd := exec.Command("scripts/release.sh", out)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RELEASE_ARCHS="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh in %s: %v\n%s", dir, err, b)
	}
}

// copyTree copies the repository (its git directory with it, less what
// builds leave) to a directory of its own, so that a second release is
// made from another path.
func copyTree(t *testing.T, to string) {
	t.Helper()
	tar := exec.Command("bash", "-c", `tar -C "$1" --exclude=./bin --exclude=./dist --exclude=./meshbench -cf - . | tar -C "$2" -xf -`, "copy", root, to)
	if b, err := tar.CombinedOutput(); err != nil {
		t.Fatalf("copy the tree: %v\n%s", err, b)
	}
}

// TestRelease builds the release twice, from the tree and from a copy of
// it elsewhere, compares them byte for byte, checks what they hold, then
// (as root, with dpkg) installs the package on this machine and removes it.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release twice")
	}
	tmp := t.TempDir()
	out1, out2, elsewhere := filepath.Join(tmp, "out1"), filepath.Join(tmp, "out2"), filepath.Join(tmp, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	copyTree(t, elsewhere)
	release(t, root, out1)
	release(t, elsewhere, out2)
	if keep := os.Getenv("RELEASE_KEEP_DIST"); keep != "" {
		// The as-shipped suite (test/shipped, SHIPPED_DIST) tests these
		// artifacts rather than building them a third time.
		if out, err := exec.Command("cp", "-R", out1+"/.", keep).CombinedOutput(); err != nil {
			t.Fatalf("keep the release in %s: %v\n%s", keep, err, out)
		}
	}

	sums := readSums(t, out1)
	if len(sums) != 4 {
		t.Fatalf("SHA256SUMS names %d artifacts, want the archive, its SBOM, the .deb and the .rpm: %v", len(sums), sums)
	}
	for name, sum := range sums {
		b1, err := os.ReadFile(filepath.Join(out1, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(b1); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: SHA256SUMS says %s, the file's is %x", name, sum, h)
		}
		b2, err := os.ReadFile(filepath.Join(out2, name))
		if err != nil {
			t.Errorf("the second build made no %s: %v", name, err)
			continue
		}
		if !bytes.Equal(b1, b2) {
			t.Errorf("%s differs between two builds of one commit (%d and %d bytes)", name, len(b1), len(b2))
		}
	}
	checkArchive(t, out1, sums)
	checkSBOM(t, out1, sums)
	checkUnit(t, filepath.Join(root, "packaging", "meshd.service"))

	deb, rpm := "", ""
	for name := range sums {
		switch {
		case strings.HasSuffix(name, "_"+arch+".deb"):
			deb = filepath.Join(out1, name)
		case strings.HasSuffix(name, ".rpm"):
			rpm = filepath.Join(out1, name)
		}
	}
	version, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if rpm == "" {
		t.Errorf("no .rpm among %v", sums)
	} else {
		checkRPM(t, rpm, strings.TrimPrefix(strings.TrimSpace(string(version)), "v"))
	}
	if deb == "" {
		t.Fatalf("no .deb for %s among %v", arch, sums)
	}
	t.Run("install", func(t *testing.T) { install(t, deb) })
}

// readSums reads out's SHA256SUMS: file name → hex digest.
func readSums(t *testing.T, out string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for line := range strings.Lines(string(b)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		sums[name] = sum
	}
	return sums
}

// checkArchive lists the archive: the binaries executable, the rest not,
// every entry root's and of the commit's time.
func checkArchive(t *testing.T, out string, sums map[string]string) {
	t.Helper()
	var archive string
	for name := range sums {
		if strings.HasSuffix(name, "_linux_"+arch+".tar.gz") {
			archive = name
		}
	}
	if archive == "" {
		t.Fatalf("no archive for %s among %v", arch, sums)
	}
	top := strings.TrimSuffix(archive, ".tar.gz") + "/"
	list, err := exec.Command("tar", "--numeric-owner", "-tvzf", filepath.Join(out, archive)).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bin/meshd": "-rwxr-xr-x", "bin/meshctl": "-rwxr-xr-x",
		"modules/audit-logger": "-rwxr-xr-x", "modules/dispatcher": "-rwxr-xr-x", "modules/agent": "-rwxr-xr-x",
		"mesh.yaml.example": "-rw-r--r--", "meshd.env.example": "-rw-r--r--", "systemd/meshd.service": "-rw-r--r--",
		"README.md": "-rw-r--r--", "CHANGELOG.md": "-rw-r--r--", "docs/operator-guide.md": "-rw-r--r--", "docs/security.md": "-rw-r--r--",
	}
	times := map[string]bool{}
	for line := range strings.Lines(string(list)) {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		mode, owner, name := f[0], f[1], f[len(f)-1]
		if owner != "0/0" {
			t.Errorf("%s is owned by %s, want 0/0", name, owner)
		}
		times[f[3]+" "+f[4]] = true
		if w, ok := want[strings.TrimPrefix(name, top)]; ok {
			if mode != w {
				t.Errorf("%s: mode %s, want %s", name, mode, w)
			}
			delete(want, strings.TrimPrefix(name, top))
		}
	}
	for name := range want {
		t.Errorf("the archive holds no %s", name)
	}
	if len(times) != 1 {
		t.Errorf("the archive's entries have %d different times, want one, the commit's: %v", len(times), times)
	}
}

// checkSBOM reads the SBOM: CycloneDX, naming mesh and the modules its
// binaries are built from, with no serial number or time that would make
// two builds differ.
func checkSBOM(t *testing.T, out string, sums map[string]string) {
	t.Helper()
	for name := range sums {
		if !strings.HasSuffix(name, ".sbom.cdx.json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		var bom struct {
			BOMFormat string `json:"bomFormat"`
			Serial    string `json:"serialNumber"`
			Metadata  struct {
				Timestamp string `json:"timestamp"`
				Component struct {
					Name string `json:"name"`
				} `json:"component"`
			} `json:"metadata"`
			Components []struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &bom); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != "github.com/meshkit/mesh" {
			t.Errorf("%s: format %q, component %q", name, bom.BOMFormat, bom.Metadata.Component.Name)
		}
		if bom.Serial != "" || bom.Metadata.Timestamp != "" {
			t.Errorf("%s has a serial %q or time %q: two builds would differ", name, bom.Serial, bom.Metadata.Timestamp)
		}
		found := map[string]bool{}
		for _, c := range bom.Components {
			found[c.Name] = true
		}
		for _, dep := range []string{"github.com/rabbitmq/amqp091-go", "github.com/hashicorp/go-plugin", "std"} {
			if !found[dep] {
				t.Errorf("%s names no %s among its %d components", name, dep, len(bom.Components))
			}
		}
		return
	}
	t.Errorf("no SBOM among %v", sums)
}

// exposure is systemd-analyze security's verdict line.
var exposure = regexp.MustCompile(`Overall exposure level for meshd\.service: ([0-9.]+)`)

// maxExposure is issue 49's target: "OK" or better.
const maxExposure = 4.0

// checkUnit scores the unit with systemd-analyze security --offline, where
// this systemd has it (252 and later).
func checkUnit(t *testing.T, unit string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("no systemd-analyze here: the unit's exposure is not scored")
		return
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unit).CombinedOutput()
	m := exposure.FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security --offline=true %s: %v\n%s", unit, err, out)
	}
	score, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("meshd.service's exposure: %.1f", score)
	if score > maxExposure {
		t.Errorf("meshd.service's exposure is %.1f, want %.1f or less:\n%s", score, maxExposure, out)
	}
}

// install installs deb on this machine (root and dpkg only; not where a
// mesh package or user is already there), checks its files, runs its
// meshd as the unit would, upgrades it over itself with an edited config,
// removes and purges it; the cleanup purges whatever a failure left.
func install(t *testing.T, deb string) {
	if os.Geteuid() != 0 {
		t.Skip("installs a package: root only")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg here")
	}
	if exec.Command("dpkg-query", "-W", "-f=${Status}", "mesh").Run() == nil {
		t.Skip("a mesh package is installed on this machine: not touched")
	}
	if _, err := user.Lookup("mesh"); err == nil {
		t.Skip("this machine has a user mesh of its own: not touched")
	}
	t.Cleanup(func() {
		if exec.Command("dpkg-query", "-W", "-f=${Status}", "mesh").Run() == nil {
			if b, err := dpkg("--purge", "mesh"); err != nil {
				t.Errorf("purge at cleanup: %v\n%s", err, b)
			}
		}
	})
	if b, err := dpkg("--install", deb); err != nil {
		t.Fatalf("dpkg --install: %v\n%s", err, b)
	}
	mesh, err := user.Lookup("mesh")
	if err != nil {
		t.Fatalf("the package made no user mesh: %v", err)
	}
	uid, _ := strconv.Atoi(mesh.Uid)
	gid, _ := strconv.Atoi(mesh.Gid)
	for _, f := range packaged {
		fi, err := os.Lstat(f.path)
		if err != nil {
			t.Errorf("installed: %v", err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		ids := map[string]int{"root": 0, "mesh": uid}
		gids := map[string]int{"root": 0, "mesh": gid}
		if fi.Mode() != f.mode || int(st.Uid) != ids[f.owner] || int(st.Gid) != gids[f.group] {
			t.Errorf("%s: %v %d:%d, want %v %s:%s", f.path, fi.Mode(), st.Uid, st.Gid, f.mode, f.owner, f.group)
		}
	}
	for _, c := range conffiles { // what its comment says is what it is (TestPackagedConfigsSayTheirModes)
		b, err := os.ReadFile(c)
		fi, serr := os.Stat(c)
		if err != nil || serr != nil {
			t.Errorf("installed %s: %v %v", c, err, serr)
			continue
		}
		if stated, ok := statedMode(string(b)); !ok || stated != fi.Mode().Perm() {
			t.Errorf("installed %s says mode %04o (stated: %v) and is %04o", c, stated, ok, fi.Mode().Perm())
		}
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f=${Conffiles}", "mesh").Output(); err != nil {
		t.Errorf("dpkg-query: %v", err)
	} else {
		for _, c := range conffiles {
			if !strings.Contains(string(out), " "+c+" ") {
				t.Errorf("%s is not a conffile of the installed package: %q", c, out)
			}
		}
	}
	if mesh.HomeDir != "/var/lib/mesh" {
		t.Errorf("user mesh's home is %s, want /var/lib/mesh", mesh.HomeDir)
	}
	if b, err := exec.Command("/usr/bin/meshd", "config", "check", "--config", "/etc/mesh/mesh.yaml").CombinedOutput(); err != nil {
		t.Errorf("meshd config check on the packaged config: %v\n%s", err, b)
	}
	if b, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/meshd.service").CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze verify meshd.service: %v\n%s", err, b)
	}
	runAsTheUnit(t)

	// Upgrade over itself, the config edited: the edit stays.
	edited := "\n# edited by the operator\n"
	f, err := os.OpenFile("/etc/mesh/mesh.yaml", os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(edited); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, err := dpkg("--install", deb); err != nil {
		t.Fatalf("dpkg --install over itself: %v\n%s", err, b)
	}
	if b, err := os.ReadFile("/etc/mesh/mesh.yaml"); err != nil || !strings.HasSuffix(string(b), edited) {
		t.Errorf("the upgrade did not keep the edited config: %v\n%s", err, b)
	}

	// Remove: the binaries go, the config and the user stay.
	if b, err := dpkg("--remove", "mesh"); err != nil {
		t.Fatalf("dpkg --remove: %v\n%s", err, b)
	}
	for _, gone := range []string{"/usr/bin/meshd", "/usr/lib/mesh/modules/audit-logger", "/usr/lib/systemd/system/meshd.service"} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("after remove, %s: %v", gone, err)
		}
	}
	if _, err := os.Stat("/etc/mesh/mesh.yaml"); err != nil {
		t.Errorf("remove took the config: %v", err)
	}
	// Purge: the config, the state and the user go too.
	if b, err := dpkg("--purge", "mesh"); err != nil {
		t.Fatalf("dpkg --purge: %v\n%s", err, b)
	}
	for _, gone := range []string{"/etc/mesh", "/var/lib/mesh"} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("after purge, %s: %v", gone, err)
		}
	}
	if _, err := user.Lookup("mesh"); err == nil {
		t.Errorf("after purge, the user mesh is still there")
	}
}

// packaged is what the package installs that the tests check: each path
// with its mode and owners (the .deb installed, the .rpm read).
var packaged = []struct {
	path         string
	mode         fs.FileMode
	owner, group string
}{
	{"/usr/bin/meshd", 0o755, "root", "root"},
	{"/usr/bin/meshctl", 0o755, "root", "root"},
	{"/usr/lib/mesh/modules/audit-logger", 0o755, "root", "root"},
	{"/usr/lib/mesh/modules/dispatcher", 0o755, "root", "root"},
	{"/usr/lib/mesh/modules/agent", 0o755, "root", "root"},
	{"/usr/lib/systemd/system/meshd.service", 0o644, "root", "root"},
	{"/etc/mesh", fs.ModeDir | 0o750, "root", "mesh"},
	{"/etc/mesh/mesh.yaml", 0o640, "root", "mesh"},
	{"/etc/mesh/meshd.env", 0o600, "root", "root"},
	{"/var/lib/mesh", fs.ModeDir | 0o711, "mesh", "mesh"},
	{"/usr/share/doc/mesh/operator-guide.md", 0o644, "root", "root"},
}

// conffiles are the package's configuration files: an upgrade keeps them
// once edited.
var conffiles = []string{"/etc/mesh/mesh.yaml", "/etc/mesh/meshd.env"}

// checkRPM reads the .rpm (where rpm is installed: scripts/ensure-packaging.sh):
// its name and version, every packaged path with its mode and owners, its
// configuration files marked noreplace, and its four scriptlets.
func checkRPM(t *testing.T, rpm, version string) {
	t.Helper()
	if _, err := exec.LookPath("rpm"); err != nil {
		t.Log("no rpm here (scripts/ensure-packaging.sh installs it): the .rpm is not read")
		return
	}
	query := func(args ...string) string {
		out, err := exec.Command("rpm", append([]string{"-qp"}, append(args, rpm)...)...).Output()
		if err != nil {
			t.Fatalf("rpm -qp %v: %v", args, err)
		}
		return string(out)
	}
	if got, want := query("--queryformat", "%{NAME} %{VERSION} %{RELEASE}"), "mesh "+version+" 1"; got != want {
		t.Errorf("the .rpm is %q, want %q", got, want)
	}
	files := map[string][]string{} // path → mode (octal), owner, group, flags
	for line := range strings.Lines(query("--queryformat", "[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags}\n]")) {
		f := strings.Fields(line)
		if len(f) >= 4 {
			files[f[0]] = f[1:]
		}
	}
	for _, p := range packaged {
		f, ok := files[p.path]
		if !ok {
			t.Errorf("the .rpm holds no %s", p.path)
			continue
		}
		mode, _ := strconv.ParseUint(f[0], 8, 32)
		perm, dir := fs.FileMode(mode)&fs.ModePerm, mode&0o170000 == 0o040000
		if perm != p.mode.Perm() || dir != p.mode.IsDir() || f[1] != p.owner || f[2] != p.group {
			t.Errorf("the .rpm's %s: %s, want %v %s:%s", p.path, strings.Join(f, " "), p.mode, p.owner, p.group)
		}
	}
	for _, c := range conffiles {
		if f := files[c]; len(f) < 4 || !strings.Contains(f[3], "c") || !strings.Contains(f[3], "n") {
			t.Errorf("the .rpm's %s is not a configuration file kept on upgrade (noreplace): %v", c, f)
		}
	}
	scripts := query("--scripts")
	for _, s := range []string{"preinstall scriptlet", "postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet"} {
		if !strings.Contains(scripts, s) {
			t.Errorf("the .rpm has no %s", s)
		}
	}
}

// dpkg runs dpkg with args, no terminal to ask on.
func dpkg(args ...string) ([]byte, error) {
	cmd := exec.Command("dpkg", args...)
	cmd.Stdin = nil
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	return cmd.CombinedOutput()
}

// installedUnit is where the package installs meshd's unit.
const installedUnit = "/usr/lib/systemd/system/meshd.service"

// runAsTheUnit runs the packaged meshd with the packaged config as the
// installed unit starts it, each setting read from the unit file
// (unitfile: its User=, its capabilities ambient and bounding, no new
// privileges, its umask, working directory and ExecStart=), against a
// virtual host of the test broker, until its start log says how its
// module is isolated: the audit logger as a user of its own, confined by
// Landlock, with no warning that it could not be.
func runAsTheUnit(t *testing.T) {
	t.Helper()
	u, err := unitfile.Read(installedUnit)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := u.Service()
	if err != nil {
		t.Fatal(err)
	}
	if svc.User == "" || len(svc.ExecStart) == 0 {
		t.Fatalf("%s: no User= or ExecStart=: %+v", installedUnit, svc)
	}
	usr, err := user.Lookup(svc.User)
	if err != nil {
		t.Fatalf("the unit's User=%s: %v", svc.User, err)
	}
	uid, _ := strconv.Atoi(usr.Uid)
	gid, _ := strconv.Atoi(usr.Gid)
	httpAddr := freeport.Addr(t) // meshd listens on it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append(svc.Setpriv(uid, gid), svc.Shell(svc.ExecStart...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = svc.WorkingDirectory
	cmd.Env = append(os.Environ(), "MESH_AMQP_URL="+brokertest.VHost(t), "MESH_HTTP_ADDR="+httpAddr)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	isolation, running, warned := "", false, ""
	sc := bufio.NewScanner(stderr)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		logs.WriteString(sc.Text() + "\n")
		var line struct {
			Level   string          `json:"level"`
			Msg     string          `json:"msg"`
			Modules json.RawMessage `json:"modules"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		var modules map[string]string
		if line.Msg == "module isolation" && json.Unmarshal(line.Modules, &modules) == nil {
			isolation = modules["audit-logger"]
		}
		if line.Level == "WARN" && strings.Contains(line.Msg, "users of their own") {
			warned = line.Msg
		}
		if strings.HasPrefix(line.Msg, "node running") { // after every start warning
			running = true
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	go func() { _, _ = bytes.NewBuffer(nil).ReadFrom(stderr) }() // drain what it says as it stops
	werr := cmd.Wait()
	want := "its own user mesh-audit-logger, confined by Landlock"
	if confine.ABI() < 1 {
		want = "its own user mesh-audit-logger, without Landlock"
	}
	if !running {
		t.Errorf("the packaged meshd, run as its unit would, did not say it runs (exit: %v); its log:\n%s", werr, logs.String())
	}
	if warned != "" {
		t.Errorf("the packaged meshd, run as its unit would, warns: %s", warned)
	}
	if !strings.HasPrefix(isolation, want) {
		t.Errorf("the packaged meshd, run as its unit would, isolates the audit logger as %q, want %q (exit: %v); its log:\n%s",
			isolation, want, werr, logs.String())
	}
	t.Logf("the packaged meshd as its unit: audit-logger %s", isolation)
	if fi, err := os.Stat("/var/lib/mesh/mesh1/modules/audit-logger"); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the audit logger's own directory: %v %v", fi, err)
	}
}
