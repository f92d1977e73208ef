package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// runningMarker is the file in the state dir that says a run of the node
// is under way: written by New, removed by Close. Found by New, it says the
// run before ended without Close (SIGKILL, a crash, a power cut).
const runningMarker = "running"

// markRunning writes the running marker and reports whether one was
// there already.
func (n *Node) markRunning() (crashed bool) {
	path := filepath.Join(n.cfg.StateDir, runningMarker)
	_, err := os.Stat(path)
	crashed = err == nil
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		n.log.Warn("could not write the running marker in the state dir", "err", err)
	}
	return crashed
}

// unmarkRunning removes the running marker.
func (n *Node) unmarkRunning() {
	if err := os.Remove(filepath.Join(n.cfg.StateDir, runningMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Warn("could not remove the running marker from the state dir", "err", err)
	}
}

// awaitOwnLock connects again, with back-off, while the broker still holds
// the node lock of a run that ended without closing (its connection looks
// alive to the broker until the TCP connection is seen closed or its
// heartbeats are missed), for LockWait at most: then another node of this
// name runs, and New fails with ErrNodeTaken as it does at once when the
// run before closed cleanly.
func (n *Node) awaitOwnLock(ctx context.Context, taken error) (*session, error) {
	n.log.Warn("the node lock is taken, and the last run of this node did not close (killed?): waiting for the broker to release it",
		"lock_wait", n.cfg.LockWait, "err", taken)
	deadline := time.Now().Add(n.cfg.LockWait)
	for attempt := 1; time.Now().Before(deadline); attempt++ {
		select {
		case <-time.After(jitter(expBackoff(n.cfg.ReconnectMin, n.cfg.ReconnectMax, attempt))):
		case <-ctx.Done():
			return nil, taken
		}
		s, err := n.connect(ctx)
		if !errors.Is(err, ErrNodeTaken) {
			if err == nil {
				n.log.Info("the broker released the node lock of the last run", "waited_attempts", attempt)
			}
			return s, err
		}
		taken = err
	}
	return nil, taken
}
