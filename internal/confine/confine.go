// Package confine keeps a process out of parts of the filesystem with
// Landlock, the Linux security module an unprivileged process can use on
// itself: meshd starts a module process that runs as meshd's own user
// through itself (Command), and the confined launcher (Main) closes the
// state dir, the config and the node's secrets to it before it executes
// the module's binary. Landlock grants, it does not deny, so the denied
// paths become a set of grants: every entry of the filesystem outside
// them, with the directories on the way to them walked entry by entry
// (Plan). docs/adr/0029-trust-boundary.md says what that leaves open.
package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Arg is the first argument that makes meshd's binary the confined
// launcher: `meshd Arg [--deny PATH]... [--allow PATH]... [--user UID:GID]
// -- BINARY ARGS...`.
const Arg = "mesh-confine"

// Options are what the launcher does before it executes the binary.
type Options struct {
	// Deny are the paths closed to the process; Allow are open to it
	// even inside a denied path.
	Deny, Allow []string
	// User, when not nil, is who the process runs as: the launcher is
	// started as meshd's user (root), opens the binary as that user, and
	// takes this one on just before it executes the binary, so the
	// binary needs only to be executable by the user, not reachable
	// along its path.
	User *User
	// Network, when not nil, confines the process's network to it
	// (nothing by default): TCP by Landlock's network rules where the
	// kernel has them (NetworkABI), and, for a process granted nothing,
	// no IPv4 or IPv6 socket at all by a system-call filter.
	Network *Network
}

// User is a uid and a gid, with no other group.
type User struct{ UID, GID uint32 }

// ErrUnsupported is returned where the kernel offers no Landlock (not
// Linux, too old, or Landlock not enabled at boot).
var ErrUnsupported = errors.New("confine: Landlock is not available")

// Command returns the start of the argv that runs a binary through
// launcher (meshd's own binary) as o says. The binary's path and its args
// follow it.
func Command(launcher string, o Options) []string {
	argv := []string{launcher, Arg}
	for _, d := range o.Deny {
		argv = append(argv, "--deny", d)
	}
	for _, a := range o.Allow {
		argv = append(argv, "--allow", a)
	}
	if o.User != nil {
		argv = append(argv, "--user", fmt.Sprintf("%d:%d", o.User.UID, o.User.GID))
	}
	if o.Network != nil {
		argv = append(argv, "--network", "confined")
		for _, p := range portsArg(o.Network.Connect) {
			argv = append(argv, "--connect", p)
		}
		for _, p := range portsArg(o.Network.Bind) {
			argv = append(argv, "--bind", p)
		}
	}
	return append(argv, "--")
}

// Main is the confined launcher: args are what follows Arg. It confines
// the process and executes the binary, or returns why it could not (it
// never starts the binary unconfined).
func Main(args []string) error {
	var deny, allow []string
	var user *User
	var network *Network
	ports := func(arg, v string, to func(*Network) *[]Ports) error {
		if network == nil {
			return fmt.Errorf("confine: %s before --network", arg)
		}
		p, err := ParsePorts(v)
		if err != nil {
			return fmt.Errorf("confine: %s: %w", arg, err)
		}
		list := to(network)
		*list = append(*list, p)
		return nil
	}
	for len(args) > 0 && args[0] != "--" {
		if len(args) < 2 {
			return fmt.Errorf("confine: %s needs a path", args[0])
		}
		switch args[0] {
		case "--deny":
			deny = append(deny, args[1])
		case "--allow":
			allow = append(allow, args[1])
		case "--user":
			uid, gid, ok := strings.Cut(args[1], ":")
			u, errU := strconv.ParseUint(uid, 10, 32)
			g, errG := strconv.ParseUint(gid, 10, 32)
			if !ok || errU != nil || errG != nil {
				return fmt.Errorf("confine: --user %q: want UID:GID", args[1])
			}
			user = &User{UID: uint32(u), GID: uint32(g)}
		case "--network":
			if args[1] != "confined" {
				return fmt.Errorf("confine: --network %q: want confined", args[1])
			}
			network = &Network{}
		case "--connect":
			if err := ports(args[0], args[1], func(n *Network) *[]Ports { return &n.Connect }); err != nil {
				return err
			}
		case "--bind":
			if err := ports(args[0], args[1], func(n *Network) *[]Ports { return &n.Bind }); err != nil {
				return err
			}
		default:
			return fmt.Errorf("confine: unknown argument %q", args[0])
		}
		args = args[2:]
	}
	if len(args) < 2 {
		return errors.New("confine: no binary after --")
	}
	binary, err := exec.LookPath(args[1])
	if err != nil {
		return fmt.Errorf("confine: %w", err)
	}
	rules, err := Plan(deny, allow)
	if err != nil {
		return err
	}
	return restrictAndExec(rules, user, network, binary, args[1:])
}

// Rule grants every access Landlock governs beneath Path (a directory)
// or to Path (any other file). Dev and Ino are the file Plan found there:
// a rule whose path is something else by the time it is granted (swapped
// for a link, say) is not granted.
type Rule struct {
	Path     string
	Dir      bool
	Dev, Ino uint64
}

// Plan turns "everything but deny, and allow" into Landlock's grants:
// each allow path, and every entry of the filesystem that is neither in a
// denied path nor on the way to one. A directory on the way to a denied
// path gets no grant of its own (only its entries do): its entries are
// those it holds now, and a process cannot list it nor make new entries
// directly in it. A symbolic link is granted as what it points to, and
// not at all if that is in or on the way to a denied path; so is any
// entry that is the very file of one in a denied path or of a directory
// on the way to one (a bind mount of it, or a hard link), for Landlock's
// rules are on files, not names. Paths that do not exist are skipped. With
// nothing to deny, the whole filesystem is granted.
func Plan(deny, allow []string) ([]Rule, error) {
	denied, err := realPaths(deny)
	if err != nil {
		return nil, err
	}
	allowed, err := realPaths(allow)
	if err != nil {
		return nil, err
	}
	// The files that must get no rule: every file in a denied path, and
	// each directory on the way to one.
	closed := map[fileID]bool{}
	for _, d := range denied {
		for p := filepath.Dir(d); ; p = filepath.Dir(p) {
			if id, ok := idOf(p); ok {
				closed[id] = true
			}
			if p == "/" {
				break
			}
		}
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.Type()&fs.ModeSymlink != 0 {
				return nil // unreadable, or a link (granted as what it points to, if at all)
			}
			if id, ok := idOf(p); ok {
				closed[id] = true
			}
			return nil
		})
	}
	var rules []Rule
	seen := map[string]bool{}
	add := func(p string, explicit bool) {
		if seen[p] {
			return
		}
		fi, err := os.Stat(p)
		if err != nil {
			return
		}
		id, _ := idOf(p)
		if closed[id] && !explicit {
			return
		}
		seen[p] = true
		rules = append(rules, Rule{Path: p, Dir: fi.IsDir(), Dev: id.dev, Ino: id.ino})
	}
	if len(denied) == 0 {
		add("/", true)
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("confine: %w", err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				continue // a dangling link, or gone since
			}
			switch {
			case within(real, denied):
			case onTheWay(real, denied):
				if real == p {
					if err := walk(p); err != nil {
						return err
					}
				} // a link to a directory on the way: walked where it is
			default:
				add(real, false)
			}
		}
		return nil
	}
	if len(denied) > 0 {
		if err := walk("/"); err != nil {
			return nil, err
		}
	}
	for _, a := range allowed {
		add(a, true)
	}
	return rules, nil
}

// realPaths makes each path absolute, without links, where it exists
// (as given, cleaned and absolute, where it does not).
func realPaths(paths []string) ([]string, error) {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("confine: %w", err)
		}
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		out = append(out, abs)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// within reports whether p is one of roots or beneath one.
func within(p string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return beneath(p, r) })
}

// onTheWay reports whether p is a directory above one of roots.
func onTheWay(p string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return r != p && beneath(r, p) })
}

// beneath reports whether p is dir or inside it.
func beneath(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// fileID is a file as the kernel knows it: its device and inode.
type fileID struct{ dev, ino uint64 }
