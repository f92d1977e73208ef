package runtime

import (
	"fmt"
	"sync"
	"time"

	"github.com/meshkit/mesh/internal/schedbook"
	"github.com/meshkit/mesh/internal/wire"
)

// Bounds on what a module schedules (ModuleConfig.MaxDelay, MaxScheduled,
// MaxScheduledBytes). A schedule waits on the broker, in a level of the
// cascade, until it is due: the levels cannot be browsed, so neither a
// cancel nor the module's removal takes it away earlier. What bounds the
// space a module holds there is what it may schedule: how far ahead, and
// how much at once. The node counts, per source, the schedules its book
// holds (cancelled ones too: they wait all the same) and refuses an emit
// past its module's bounds; the mover gives the room back when it
// delivers or drops one.

// schedUsage is what one source has waiting.
type schedUsage struct {
	count int
	bytes int64
}

// schedLedger counts the schedules waiting, by source; safe for
// concurrent use.
type schedLedger struct {
	mu sync.Mutex
	by map[string]schedUsage
}

// fill counts the book's delayed events (not the runtime's retries).
func (l *schedLedger) fill(entries []schedbook.Entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.by = map[string]schedUsage{}
	for _, e := range entries {
		if e.Queue == "" {
			u := l.by[e.Source]
			u.count++
			u.bytes += int64(e.Bytes)
			l.by[e.Source] = u
		}
	}
}

// reserve takes room for a schedule of bytes by module m, within its
// bounds, or says why there is none.
func (l *schedLedger) reserve(m string, bytes int64, maxCount int, maxBytes int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string]schedUsage{}
	}
	u := l.by[m]
	switch {
	case maxCount > 0 && u.count+1 > maxCount:
		return fmt.Errorf("%w: module %s has %d schedules waiting, the most its entry in mesh.yaml grants (max_scheduled: %d): wait for some to come due, cancel some, or raise max_scheduled",
			wire.ErrForbidden, m, u.count, maxCount)
	case maxBytes > 0 && u.bytes+bytes > maxBytes:
		return fmt.Errorf("%w: module %s has %d bytes of schedules waiting; %d more would pass what its entry in mesh.yaml grants (max_scheduled_bytes: %d): raise max_scheduled_bytes, or schedule less",
			wire.ErrForbidden, m, u.bytes, bytes, maxBytes)
	}
	u.count++
	u.bytes += bytes
	l.by[m] = u
	return nil
}

// release gives back the room of a schedule of source that was delivered,
// dropped, or never made.
func (l *schedLedger) release(source string, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u, ok := l.by[source]
	if !ok {
		return
	}
	u.count = max(u.count-1, 0)
	u.bytes = max(u.bytes-bytes, 0)
	if u.count == 0 {
		delete(l.by, source)
	} else {
		l.by[source] = u
	}
}

// waiting is what source has waiting.
func (l *schedLedger) waiting(source string) (int, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.by[source]
	return u.count, u.bytes
}

// checkDelay refuses a delay longer than the module's entry grants.
func (m *Module) checkDelay(eventType string, o wire.EmitOptions, now time.Time) error {
	if !o.Delayed() || m.cfg.MaxDelay <= 0 {
		return nil
	}
	if d := o.Due(now).Sub(now); d > m.cfg.MaxDelay {
		return fmt.Errorf("emit %s: %w: a delay of %v is longer than module %s's entry in mesh.yaml grants (max_delay: %v): raise max_delay, or schedule nearer",
			eventType, wire.ErrForbidden, d.Round(time.Second), m.def.Name, m.cfg.MaxDelay)
	}
	return nil
}

// module is the module of that name loaded on the node, or nil.
func (n *Node) module(name string) *Module {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.modules[name]
}

// releaseSchedule gives back the room of a schedule the book held (a
// delayed event, not a retry) once it is delivered or dropped.
func (n *Node) releaseSchedule(e schedbook.Entry) {
	if e.ID != "" && e.Queue == "" {
		n.sched.release(e.Source, int64(e.Bytes))
	}
}

// OperatorSource is the source (x-source) of what the operator's meshctl
// emits and calls: no module may be named so (nodeconfig.OperatorCaller
// is the same name), so a schedule of this source is the operator's, not
// a module's.
const OperatorSource = "meshctl"

// SetModules tells the node which modules its configuration names now
// (meshd calls it at start and at each reload). A schedule that comes due
// from a module of the node no longer among them, or no longer granted
// its event type, is not delivered: it is set aside in the dead letters
// with reason revoked (counted, and recorded on the mesh as
// node.NODE.delay.dropped), where the operator can replay it. Until it is
// called, no schedule is set aside for its source.
func (n *Node) SetModules(names []string) {
	set := make(map[string]bool, len(names))
	for _, name := range names {
		set[name] = true
	}
	n.mu.Lock()
	n.configured = set
	n.mu.Unlock()
}

// whyNotDue says why the due event of eventType from source, scheduled
// by the node's own user, must not be delivered: its module is no longer
// in the node's configuration, or no longer may emit the type; "" if it
// may be (the node's own schedules, the operator's through meshctl, or
// one the node cannot judge: a module of the configuration not loaded
// now, a node that was never told its modules).
func (n *Node) whyNotDue(source, eventType string) string {
	if source == n.cfg.Node || source == OperatorSource {
		return ""
	}
	n.mu.Lock()
	configured, m := n.configured, n.modules[source]
	n.mu.Unlock()
	if configured != nil && !configured[source] {
		return fmt.Sprintf("module %s is no longer in node %s's configuration", source, n.cfg.Node)
	}
	if m == nil {
		return ""
	}
	if _, err := wire.EmitType(source, eventType, true, m.cfg.EmitGrants); err != nil {
		return fmt.Sprintf("module %s may no longer emit %s: %v", source, eventType, err)
	}
	if !m.cfg.AllowUndeclaredEmits {
		if err := wire.CheckDeclared(source, eventType, m.def.Emits); err != nil {
			return fmt.Sprintf("module %s no longer declares %s: %v", source, eventType, err)
		}
	}
	return ""
}
