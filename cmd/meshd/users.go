package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// undumpable is set when meshd made itself undumpable at start
// (hideFromModules).
var undumpable bool

// The range meshd picks a module's own user from (user: auto): systemd's
// DynamicUser range, which /etc/passwd leaves free by convention.
const (
	dynamicFirst = 61184
	dynamicLast  = 65519
)

// moduleUser resolves the entry's user: (nodeconfig.Module.User) into the
// credential its process runs as: nil for meshd's own. Left out, it is
// auto where meshd runs as root or holds the capabilities to change users
// (changesUsers; a module runs as root only if its entry says user: root)
// and meshd's own user elsewhere. Any user but meshd's needs them.
func moduleUser(node string, m nodeconfig.Module) (*runtime.Credential, error) {
	var c runtime.Credential
	u := m.User
	if u == "" && changesUsers() {
		u = "auto"
	}
	switch {
	case u == "":
		return nil, nil
	case u == "auto":
		uid, err := dynamicUID(node, m.Name)
		if err != nil {
			return nil, err
		}
		c = runtime.Credential{UID: uid, GID: uid, Name: "mesh-" + m.Name}
	default:
		var err error
		if c, err = lookupUser(u); err != nil {
			return nil, err
		}
	}
	if c.UID == uint32(os.Geteuid()) && c.GID == uint32(os.Getegid()) {
		return nil, nil
	}
	if missing := missingForModuleUsers(); len(missing) > 0 {
		return nil, fmt.Errorf("user: %q: meshd runs as uid %d without %s and cannot run a module as another user; %s; or leave user: out", m.User, os.Geteuid(), capNames(missing), capsFix(missing))
	}
	return &c, nil
}

// lookupUser resolves "root", a user name, or "UID[:GID]".
func lookupUser(s string) (runtime.Credential, error) {
	uidText, gidText, hasGID := strings.Cut(s, ":")
	if uid, err := strconv.ParseUint(uidText, 10, 32); err == nil {
		gid := uid
		if hasGID {
			if gid, err = strconv.ParseUint(gidText, 10, 32); err != nil {
				return runtime.Credential{}, fmt.Errorf("user: %q: the gid is not a number", s)
			}
		}
		return runtime.Credential{UID: uint32(uid), GID: uint32(gid)}, nil
	}
	u, err := user.Lookup(uidText)
	if err != nil {
		return runtime.Credential{}, fmt.Errorf("user: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if hasGID {
		g, err := user.LookupGroup(gidText)
		if err != nil {
			return runtime.Credential{}, fmt.Errorf("user: %w", err)
		}
		gid, _ = strconv.ParseUint(g.Gid, 10, 32)
	}
	return runtime.Credential{UID: uint32(uid), GID: uint32(gid), Name: u.Username}, nil
}

// dynamicUID picks the module's own uid: from a hash of node and module,
// the first in the dynamic range that no user or group of the system has,
// so the same module on the same node gets the same uid at every start
// (its directory stays its own).
func dynamicUID(node, module string) (uint32, error) {
	h := fnv.New32a()
	h.Write([]byte(node + "/" + module))
	size := uint32(dynamicLast - dynamicFirst + 1)
	start := h.Sum32() % size
	for i := range size {
		uid := dynamicFirst + (start+i)%size
		id := strconv.FormatUint(uint64(uid), 10)
		if _, err := user.LookupId(id); err == nil {
			continue
		}
		if _, err := user.LookupGroupId(id); err == nil {
			continue
		}
		return uid, nil
	}
	return 0, errors.New("user: auto: every uid of 61184-65519 is taken")
}

// prepareModuleDir makes the directory of a module that runs as c (nil:
// meshd's user): STATE_DIR/modules/NAME, its own (0700). The state dir is
// closed to modules at the same time: others may only pass through it
// (0711) to their own directories, and meshd's entries in it are its own
// alone.
func prepareModuleDir(stateDir, name string, c *runtime.Credential) (string, error) {
	if err := closeStateDir(stateDir); err != nil {
		return "", err
	}
	dir := filepath.Join(stateDir, "modules", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("the module's directory: %w", err)
	}
	if err := os.Chmod(filepath.Join(stateDir, "modules"), 0o711); err != nil {
		return "", fmt.Errorf("the modules' directory: %w", err)
	}
	if err := ownAll(dir, c); err != nil {
		return "", fmt.Errorf("the module's directory: %w", err)
	}
	// Only where it is not 0700 already: the directory is the module's
	// now, and a meshd that is not root has no CAP_FOWNER to change the
	// mode of another user's file.
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", fmt.Errorf("the module's directory: %w (its mode was changed; chmod 0700 it)", err)
		}
	}
	return dir, nil
}

// closeStateDir leaves the state dir passable (0711) and every entry in
// it but modules/ readable by meshd alone (directories 0700, files 0600).
func closeStateDir(stateDir string) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("the state dir: %w", err)
	}
	if err := os.Chmod(stateDir, 0o711); err != nil {
		return fmt.Errorf("the state dir: %w", err)
	}
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return fmt.Errorf("the state dir: %w", err)
	}
	for _, e := range entries {
		if e.Name() == "modules" {
			continue
		}
		mode := fs.FileMode(0o600)
		if e.IsDir() {
			mode = 0o700
		}
		if err := os.Chmod(filepath.Join(stateDir, e.Name()), mode); err != nil {
			return fmt.Errorf("the state dir: %w", err)
		}
	}
	return nil
}

// ownAll makes dir, and all in it when dir was another user's (the
// module's user changed, or it ran as meshd's before), the user c's (nil:
// meshd's).
func ownAll(dir string, c *runtime.Credential) error {
	uid, gid := os.Geteuid(), os.Getegid()
	if c != nil {
		uid, gid = int(c.UID), int(c.GID)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
