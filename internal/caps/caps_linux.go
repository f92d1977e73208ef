//go:build linux

package caps

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Current is this thread's capability sets (the process's: Go's threads
// share them unless one changes its own).
func Current() (Sets, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return Sets{}, fmt.Errorf("caps: capget: %w", err)
	}
	join := func(lo, hi uint32) Set { return Set(lo) | Set(hi)<<32 }
	s := Sets{
		Effective:   join(data[0].Effective, data[1].Effective),
		Permitted:   join(data[0].Permitted, data[1].Permitted),
		Inheritable: join(data[0].Inheritable, data[1].Inheritable),
	}
	amb, err := ambient()
	if err != nil {
		return Sets{}, err
	}
	s.Ambient = amb
	return s, nil
}

// ambient reads the ambient set from /proc/self/status (CapAmb), which
// capget does not report.
func ambient() (Set, error) {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return 0, fmt.Errorf("caps: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapAmb:"); ok {
			x, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("caps: CapAmb: %w", err)
			}
			return Set(x), nil
		}
	}
	return 0, fmt.Errorf("caps: no CapAmb in /proc/thread-self/status")
}

// ClearAmbient empties the ambient and inheritable sets of every thread of
// this process, so that no program it executes inherits a capability (a
// module process above all, even one whose binary carries inheritable file
// capabilities); the effective and permitted sets stay. It fails with
// ErrUnsupported in a build with cgo, where Go cannot change every thread.
func ClearAmbient() error {
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0)
	if errno == syscall.ENOTSUP {
		return ErrUnsupported
	}
	if errno != 0 {
		return fmt.Errorf("caps: clear the ambient set: %w", errno)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	_, _, errno = syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if errno != 0 {
		return fmt.Errorf("caps: clear the inheritable set: %w", errno)
	}
	return nil
}

// DropAllForExec empties every capability set of this thread (ambient,
// inheritable, permitted, effective), so that the program it executes
// next gets no capability unless it runs as root: the launcher calls it,
// its thread locked and the module's user taken on, just before it
// executes the module's binary.
func DropAllForExec() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("caps: clear the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData // this thread's alone (capset(2) on the calling thread)
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("caps: capset: %w", err)
	}
	return nil
}
