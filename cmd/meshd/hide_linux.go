package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// hideFromModules makes meshd undumpable (PR_SET_DUMPABLE 0): its /proc
// entries (environ, cmdline's neighbours mem and fd, maps) become root's,
// so a module process running as meshd's user cannot read the broker's
// credentials from meshd's environment or memory. Core dumps are off with
// it. docs/security.md says what it does not cover.
func hideFromModules() {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "meshd: cannot make itself undumpable (PR_SET_DUMPABLE):", err)
		return
	}
	undumpable = true
}
