//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package dedup

import "os"

// lockFile does nothing here: this platform has no flock, so nothing stops
// two Sets from opening the same log.
func lockFile(*os.File) error { return nil }

// syncDir does nothing here: directories cannot be synced portably.
func syncDir(string) error { return nil }
