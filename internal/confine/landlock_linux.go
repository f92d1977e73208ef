//go:build linux

package confine

import (
	"fmt"
	"os"
	goruntime "runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/caps"
)

// ABI is the version of Landlock the kernel offers: 0 for none.
func ABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// rulesetAttr is struct landlock_ruleset_attr as far as this package uses
// it (the access rights on files, on the network, and the scopes).
type rulesetAttr struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

// pathBeneathAttr is struct landlock_path_beneath_attr (packed: the kernel
// reads its first 12 bytes).
type pathBeneathAttr struct {
	allowed  uint64
	parentFD int32
}

// The rights Landlock governs on files and directories, by the version
// that brought them in.
const (
	fsV1 = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	// fileRights are those that apply to a file that is not a directory.
	fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
)

// handled is every right on files the kernel's Landlock (version v)
// governs.
func handled(v int) uint64 {
	fs := uint64(fsV1)
	if v >= 2 {
		fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if v >= 3 {
		fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if v >= 5 {
		fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return fs
}

// netPortAttr is struct landlock_net_port_attr.
type netPortAttr struct {
	allowed uint64
	port    uint64
}

// ruleNetPort is LANDLOCK_RULE_NET_PORT.
const ruleNetPort = 2

// restrictAndExec confines the process to rules (and to network, if not
// nil), takes user on (if not nil) and executes binary. The restriction and the user are this
// thread's, which then executes the binary, so the new program (and all
// it starts) is confined; from Landlock version 6 on, it can neither
// signal nor reach the abstract unix sockets of processes outside its
// domain (meshd, other modules) either. The binary is opened before the
// user changes and executed through its descriptor.
func restrictAndExec(rules []Rule, user *User, network *Network, binary string, argv []string) error {
	goruntime.LockOSThread()
	v := ABI()
	if v < 1 {
		return ErrUnsupported
	}
	// Not close-on-exec: a script's interpreter opens it by its /proc
	// link after the exec.
	bin, err := unix.Open(binary, unix.O_PATH, 0)
	if err != nil {
		return fmt.Errorf("confine: open %s: %w", binary, err)
	}
	attr := rulesetAttr{handledFS: handled(v)}
	size := unsafe.Sizeof(attr.handledFS)
	if network != nil && v >= NetworkABI {
		attr.handledNet = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
		size = unsafe.Offsetof(attr.scoped)
	}
	if v >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
		size = unsafe.Sizeof(attr)
	}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("confine: create the ruleset: %w", errno)
	}
	for _, r := range rules {
		pfd, err := unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // gone since it was planned (or now a link): nothing to grant
		}
		if !sameFile(pfd, r) {
			unix.Close(pfd) // swapped since it was planned: not granted
			continue
		}
		pb := pathBeneathAttr{allowed: attr.handledFS, parentFD: int32(pfd)}
		if !r.Dir {
			pb.allowed &= fileRights
		}
		_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&pb)), 0, 0, 0)
		unix.Close(pfd)
		if errno != 0 {
			return fmt.Errorf("confine: grant %s: %w", r.Path, errno)
		}
	}
	if attr.handledNet != 0 {
		for _, g := range []struct {
			ports []Ports
			right uint64
		}{{network.Connect, unix.LANDLOCK_ACCESS_NET_CONNECT_TCP}, {network.Bind, unix.LANDLOCK_ACCESS_NET_BIND_TCP}} {
			for _, r := range g.ports {
				for p := int(r.Lo); p <= int(r.Hi); p++ {
					np := netPortAttr{allowed: g.right, port: uint64(p)}
					if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, ruleNetPort, uintptr(unsafe.Pointer(&np)), 0, 0, 0); errno != 0 {
						return fmt.Errorf("confine: grant TCP port %d: %w", p, errno)
					}
				}
			}
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: no new privileges: %w", err)
	}
	if network != nil {
		if err := filterNetwork(network.Closed()); err != nil {
			return err
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("confine: restrict: %w", errno)
	}
	unix.Close(int(fd))
	if user != nil {
		// On this thread only (the raw calls, not syscall.Setuid, which
		// changes every thread and cannot where cgo is in): the one that
		// executes the binary.
		if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
			return fmt.Errorf("confine: drop the groups: %w", errno)
		}
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(user.GID), uintptr(user.GID), uintptr(user.GID)); errno != 0 {
			return fmt.Errorf("confine: set gid %d: %w", user.GID, errno)
		}
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(user.UID), uintptr(user.UID), uintptr(user.UID)); errno != 0 {
			return fmt.Errorf("confine: set uid %d: %w", user.UID, errno)
		}
	}
	// The module gets no capability: a meshd running as a user of its own
	// started this launcher with CAP_SETUID and CAP_SETGID (ambient), which
	// a change between two users other than root keeps.
	if err := caps.DropAllForExec(); err != nil {
		return fmt.Errorf("confine: %w", err)
	}
	// The descriptor's /proc link reaches the binary whatever the
	// directories on its path allow the user.
	if err := syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", bin), argv, os.Environ()); err != nil {
		return fmt.Errorf("confine: execute %s: %w", binary, err)
	}
	return nil
}

// idOf is the file at p (following links).
func idOf(p string) (fileID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, true
}

// sameFile reports whether fd is the file r was planned for.
func sameFile(fd int, r Rule) bool {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false
	}
	return uint64(st.Dev) == r.Dev && st.Ino == r.Ino
}
