//go:build unix

package console

import (
	"os"

	"golang.org/x/sys/unix"
)

// lockFile takes an exclusive lock on the file at path (made, mode 0600,
// if missing), waiting for another process that holds it, and returns
// what releases it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
