// Package caps reads and drops the Linux capabilities of this process, for
// a meshd that runs as a user of its own with the few capabilities it
// needs to start each module as a user of its own (the packaged unit:
// docs/adr/0047-packages-and-the-hardened-unit.md), rather than as root.
package caps

import (
	"errors"
	"strconv"
)

// Cap is a capability's number (capabilities(7)).
type Cap uint

// The capabilities meshd uses to start modules as users of their own.
const (
	Chown       Cap = 0 // CAP_CHOWN: give a module its directory
	DACOverride Cap = 1 // CAP_DAC_OVERRIDE: reach a module's socket in its own directory
	Kill        Cap = 5 // CAP_KILL: stop a module's process
	SetGID      Cap = 6 // CAP_SETGID: the launcher takes the module's group on
	SetUID      Cap = 7 // CAP_SETUID: the launcher takes the module's user on
)

// ForModuleUsers are the capabilities a meshd not running as root needs to
// run its modules as users of their own.
var ForModuleUsers = []Cap{Chown, DACOverride, Kill, SetGID, SetUID}

// ToLaunch are the capabilities the module launcher (meshd mesh-confine)
// is started with, to take the module's user on; it drops them all
// before it executes the module's binary.
var ToLaunch = []Cap{SetGID, SetUID}

// names is the capabilities' names, as systemd and capabilities(7) write them.
var names = map[Cap]string{Chown: "CAP_CHOWN", DACOverride: "CAP_DAC_OVERRIDE", Kill: "CAP_KILL", SetGID: "CAP_SETGID", SetUID: "CAP_SETUID"}

// String is the capability's name, CAP_SETUID.
func (c Cap) String() string {
	if n, ok := names[c]; ok {
		return n
	}
	return "capability " + strconv.FormatUint(uint64(c), 10)
}

// Set is a set of capabilities, bit c for capability c.
type Set uint64

// Has reports whether s holds every one of cs.
func (s Set) Has(cs ...Cap) bool {
	for _, c := range cs {
		if s&(1<<c) == 0 {
			return false
		}
	}
	return true
}

// Missing is those of cs that s does not hold, in cs's order.
func (s Set) Missing(cs ...Cap) []Cap {
	var m []Cap
	for _, c := range cs {
		if !s.Has(c) {
			m = append(m, c)
		}
	}
	return m
}

// Sets are a thread's capability sets.
type Sets struct {
	Effective, Permitted, Inheritable, Ambient Set
}

// ErrUnsupported is returned where this system has no capabilities to
// read or drop (not Linux), or where the process cannot drop its ambient
// set on every thread (a build with cgo).
var ErrUnsupported = errors.New("caps: not supported here")
