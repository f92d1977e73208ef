//go:build !linux

package main

// hideFromModules does nothing where the kernel has no PR_SET_DUMPABLE.
func hideFromModules() {}
