package runtime

import (
	"syscall"

	"github.com/meshkit/mesh/internal/caps"
)

// launcherCaps starts a module's launcher with the capabilities it needs to
// take the module's user on (caps.ToLaunch, raised into its ambient set),
// where meshd is not root but holds them (the packaged unit): meshd keeps
// no ambient capability of its own (caps.ClearAmbient at its start), and
// the launcher drops them all before it executes the module's binary.
func launcherCaps(attr *syscall.SysProcAttr) {
	for _, c := range caps.ToLaunch {
		attr.AmbientCaps = append(attr.AmbientCaps, uintptr(c))
	}
}
