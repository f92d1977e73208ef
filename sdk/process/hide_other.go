//go:build !linux

package process

// hideFromOtherProcesses does nothing where the kernel offers no
// PR_SET_DUMPABLE.
func hideFromOtherProcesses() {}
