//go:build !unix

package outboxstore

import "os"

// flock has no relay lock to take here: the relays go by the lease alone.
func flock(string) (*os.File, bool, error) { return nil, false, ErrNoRelayLock }
