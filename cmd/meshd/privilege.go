package main

import (
	"fmt"
	"os"

	"github.com/meshkit/mesh/internal/caps"
)

// changesUsers reports whether meshd can run its modules as users of their
// own: it runs as root, or as a user of its own holding the capabilities
// that takes (caps.ForModuleUsers: the packaged unit, docs/adr/0047-packages-and-the-hardened-unit.md).
func changesUsers() bool {
	if os.Geteuid() == 0 {
		return true
	}
	s, err := caps.Current()
	return err == nil && s.Effective.Has(caps.ForModuleUsers...)
}

// dropAmbientCaps empties the ambient and inheritable capability sets of
// a meshd that is not root (systemd's AmbientCapabilities put them there),
// so that no program meshd starts inherits one: a module running as meshd's user or
// as another, unconfined, would otherwise keep CAP_SETUID and could become
// root. meshd keeps them effective, for itself; a module's launcher gets
// the two it needs, and drops them (runtime, internal/confine). It fails
// where meshd cannot drop them (a build with cgo): meshd then refuses to
// start rather than hand them on.
func dropAmbientCaps() error {
	if os.Geteuid() == 0 {
		return nil
	}
	s, err := caps.Current()
	if err != nil || s.Ambient == 0 {
		return nil
	}
	if err := caps.ClearAmbient(); err != nil {
		return fmt.Errorf("meshd holds ambient capabilities (%#x) that every program it starts would inherit, and cannot drop them: %w; build meshd with CGO_ENABLED=0, as make release does, or start it without ambient capabilities", uint64(s.Ambient), err)
	}
	return nil
}
