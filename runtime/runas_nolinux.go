//go:build unix && !linux

package runtime

import "syscall"

// launcherCaps does nothing: only Linux has capabilities.
func launcherCaps(*syscall.SysProcAttr) {}
