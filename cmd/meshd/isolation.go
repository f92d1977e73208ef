package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// isolation is how meshd keeps its module processes from its secrets, its
// state and each other (docs/adr/0029-trust-boundary.md): each runs as a
// user of its own where meshd may change users, and is confined with
// Landlock where it runs as meshd's own.
type isolation struct {
	stateDir string
	// secrets are the paths closed to a confined module: the state dir,
	// the config, the password file and the TLS key.
	secrets []string
	// self is meshd's binary, the confined launcher; landlock is the
	// kernel's Landlock version (0: none).
	self     string
	landlock int
	// tmp holds a confined module's own TMPDIR (tmp/NAME); removed when
	// meshd stops.
	tmp string
	// services are the ports of the node's own services (the broker's
	// AMQP and management ports, meshd's HTTP): a module granted one of
	// them is warned of.
	services map[uint16]string
	// resolve looks a host up (net.DefaultResolver's, by default).
	resolve func(ctx context.Context, host string) ([]string, error)
	// out, when not nil, is where config check says how each module
	// would run.
	out io.Writer
}

// shared are directories every process of the host may write and list,
// closed to a confined module: its TMPDIR is its own.
var shared = []string{"/dev/shm", "/var/tmp"}

// report says, for config check, how the module of entry would run and
// what of its grants an operator should know of.
func (iso *isolation) report(entry string, h how) {
	if iso.out == nil {
		return
	}
	fmt.Fprintf(iso.out, "%s: runs as %s\n", entry, h)
	for _, w := range h.warnings {
		fmt.Fprintf(iso.out, "%s: warning: %s\n", entry, w)
	}
}

// newIsolation gathers what isolating f's modules needs.
func newIsolation(f nodeconfig.File, stateDir, configPath string) (*isolation, error) {
	iso := &isolation{stateDir: stateDir, landlock: confine.ABI(), services: servicePorts(f), resolve: net.DefaultResolver.LookupHost}
	for _, p := range append([]string{stateDir, configPath, f.AMQPPasswordFile, f.TLS.KeyFile}, shared...) {
		if p != "" {
			iso.secrets = append(iso.secrets, p)
		}
	}
	var err error
	if iso.self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("meshd's binary: %w", err)
	}
	return iso, nil
}

// close removes the confined modules' TMPDIRs.
func (iso *isolation) close() {
	if iso.tmp != "" {
		_ = os.RemoveAll(iso.tmp)
	}
}

// how is what protects a module beyond what every module gets, as logged
// at start.
type how struct {
	user     string // "" for meshd's
	confined bool
	network  string // what network it has, as logged
	// warnings are what its entry grants that an operator should know
	// of (a port of the node's own services).
	warnings []string
}

func (h how) String() string {
	who := "meshd's user"
	if h.user != "" {
		who = "its own user " + h.user
	}
	if h.confined {
		who += ", confined by Landlock"
	} else {
		who += ", without Landlock"
	}
	return who + ", network: " + h.network
}

// apply sets, in mc, who module m of entry i runs as and how it is
// confined: its user (moduleUser) and its own directory, and Landlock
// around it where the kernel has it. With Landlock, meshd's launcher
// takes the user on after it opened the binary, so only the way to the
// module's directory must be open to the user; without, the binary's
// path must be too.
func (iso *isolation) apply(node string, i int, m nodeconfig.Module, mc *runtime.ModuleConfig) (how, error) {
	cred, err := moduleUser(node, m)
	if err != nil {
		return how{}, fmt.Errorf("modules[%d].%w", i, err)
	}
	if mc.Dir, err = prepareModuleDir(iso.stateDir, m.Name, cred); err != nil {
		return how{}, fmt.Errorf("modules[%d] (%s): %w", i, m.Name, err)
	}
	var h how
	if cred != nil {
		h.user = cred.Name
		if h.user == "" {
			h.user = "uid " + strconv.FormatUint(uint64(cred.UID), 10)
		}
		if err := reachable(filepath.Dir(mc.Dir), *cred, 0); err != nil {
			return how{}, fmt.Errorf("modules[%d] (%s) runs as %s (user: %s): its directory %s: %w; the state dir must be where every module's user can pass (docs/security.md)", i, m.Name, h.user, userSetting(m), mc.Dir, err)
		}
		if iso.landlock < 1 {
			if err := reachable(m.Path, *cred, 0o1); err != nil {
				return how{}, fmt.Errorf("modules[%d] (%s) runs as %s (user: %s): its binary: %w; make it reachable, or set user: in the entry (docs/security.md)", i, m.Name, h.user, userSetting(m), err)
			}
		}
		mc.RunAs = cred
	}
	network, err := m.Network.Confine()
	if err != nil {
		return how{}, fmt.Errorf("modules[%d].network.%w", i, err)
	}
	if iso.landlock < 1 {
		h.network = "open (no Landlock)"
		return h, nil
	}
	h.network, h.warnings = iso.describeNetwork(m), iso.networkWarnings(m)
	if mc.TempDir, err = iso.tempDir(m.Name, cred); err != nil {
		return how{}, fmt.Errorf("modules[%d] (%s): its TMPDIR: %w", i, m.Name, err)
	}
	o := confine.Options{Deny: iso.secrets, Allow: []string{mc.Dir, mc.TempDir}, Network: &network}
	if cred != nil {
		o.User = &confine.User{UID: cred.UID, GID: cred.GID}
	}
	mc.Launcher = confine.Command(iso.self, o)
	h.confined = true
	return h, nil
}

// tempDir makes a confined module's own TMPDIR (where go-plugin makes the
// process's socket), its user's alone (0700): Landlock grants it to the
// module even where the system's TMPDIR is on the way to a closed path.
// Modules of one user (meshd unprivileged) can reach each other's.
func (iso *isolation) tempDir(name string, c *runtime.Credential) (string, error) {
	if iso.tmp == "" {
		tmp, err := os.MkdirTemp("", "meshd-")
		if err != nil {
			return "", err
		}
		if err := os.Chmod(tmp, 0o711); err != nil {
			return "", err
		}
		iso.tmp = tmp
	}
	dir := filepath.Join(iso.tmp, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if c != nil {
		if err := os.Chown(dir, int(c.UID), int(c.GID)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// userSetting is the entry's user: as meshd reads it.
func userSetting(m nodeconfig.Module) string {
	if m.User == "" {
		return "auto, by default as meshd can change users"
	}
	return m.User
}

// reachable checks that c (its uid and gid, no other group) may pass
// through every directory on the way to path and, with perm (0o1 for
// execute), use path itself so.
func reachable(path string, c runtime.Credential, perm fs.FileMode) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	var dirs []string
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		dirs = append([]string{d}, dirs...)
		if d == "/" || d == "." {
			break
		}
	}
	for _, d := range dirs {
		if err := permits(d, c, 0o1); err != nil {
			return err
		}
	}
	if perm != 0 {
		return permits(abs, c, perm)
	}
	return nil
}

// permits checks that path's mode gives c perm (as the owner, the group or
// others, whichever c is to it).
func permits(path string, c runtime.Credential, perm fs.FileMode) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	mode := fi.Mode().Perm()
	shift := 0
	switch {
	case st.Uid == c.UID:
		shift = 6
	case st.Gid == c.GID:
		shift = 3
	}
	if (mode>>shift)&perm == perm {
		return nil
	}
	what := "pass through"
	if !fi.IsDir() {
		what = "execute"
	}
	return fmt.Errorf("%s (mode %04o, owner uid %d, group %d) does not let uid %d %s it", path, mode, st.Uid, st.Gid, c.UID, what)
}

// logProtections says at start which protections of the trust boundary
// are in force, and warns of what leaves a module more than its grants
// (docs/security.md).
func logProtections(log *slog.Logger, iso *isolation, configPath string, running map[string]*loaded) {
	root := os.Geteuid() == 0
	modules := map[string]string{}
	var asMeshd, unconfined []string // as meshd's user (root, as root); of those or any, without Landlock
	otherUsers := false
	for name, l := range running {
		modules[name] = l.how.String()
		if l.how.user != "" {
			otherUsers = true
		} else {
			asMeshd = append(asMeshd, name)
		}
		if !l.how.confined {
			unconfined = append(unconfined, name)
		}
	}
	log.Info("module isolation", "meshd_undumpable", undumpable, "module_connections", "mutual TLS", "module_env", "allow-list",
		"landlock", iso.landlock, "modules", modules)
	for name, l := range running {
		for _, w := range l.how.warnings {
			log.Warn(w, "module", name)
		}
	}
	switch {
	case root && len(asMeshd) > 0:
		log.Warn("modules run as root (user: root): they can do anything on this host", "modules", asMeshd)
	case !changesUsers() && iso.landlock < 1 && len(asMeshd) > 0:
		log.Warn("modules run as meshd's user without Landlock: they can read the state dir, the config and each other's files; run meshd as root, or with the packaged unit's capabilities, to give each a user of its own (docs/security.md)",
			"modules", asMeshd)
	}
	if fi, err := os.Stat(configPath); err == nil && otherUsers && len(unconfined) > 0 && readableByModules(fi) {
		log.Warn("the config is readable by other users, modules' users among them: chmod 0600 it (or 0640 with meshd's own group, as the package installs it)", "config", configPath, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
}

// loadWith starts the module of entry i as iso says and checks that the
// binary is what the entry says.
func loadWith(ctx context.Context, node *runtime.Node, iso *isolation, i int, m nodeconfig.Module) (*loaded, error) {
	mc := m.ModuleConfig()
	h, err := iso.apply(node.Name(), i, m, &mc)
	if err != nil {
		return nil, err
	}
	pm, err := node.LoadPlugin(ctx, m.Path, m.Args, mc)
	if err != nil {
		return nil, err
	}
	if pm.Name() != m.Name || (m.Kind != "" && string(pm.Kind()) != m.Kind) {
		err = fmt.Errorf("modules[%d]: the config says %s (kind %q), the binary %s says %s (kind %q)",
			i, m.Name, m.Kind, m.Path, pm.Name(), pm.Kind())
		return nil, errors.Join(err, stopNow(pm))
	}
	return &loaded{entry: m, pm: pm, how: h}, nil
}

// readableByModules reports whether a file's mode lets users other than
// meshd's read it: others may, or its group may and that group is not
// meshd's own (a module runs with a group of its own and no other, so the
// package's 0640 root:mesh config is not theirs to read).
func readableByModules(fi os.FileInfo) bool {
	perm := fi.Mode().Perm()
	if perm&0o004 != 0 {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return perm&0o040 != 0 && (!ok || int(st.Gid) != os.Getegid())
}
