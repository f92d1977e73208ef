package meshtest

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/meshkit/mesh/internal/causation"
)

// A test that waits for a handling that never came needs to know what
// became of the event: nobody subscribed, a filter rejected it, its
// handler failed and it was dead-lettered, or the handler's own emit or
// call was refused. The mesh notes each step of each event (note), and
// Explain tells them.

// maxNotes bounds what the mesh keeps of one event.
const maxNotes = 64

// note records a step of event id's way. m.mu is held.
func (m *Mesh) note(id, format string, args ...any) {
	if id == "" {
		return
	}
	if m.fates == nil {
		m.fates = map[string][]string{}
	}
	if n := m.fates[id]; len(n) < maxNotes {
		m.fates[id] = append(n, fmt.Sprintf(format, args...))
	}
}

// noteRefused records that module's emit or call, made while it handled
// the event of ctx, failed with err. m.mu is not held.
func (m *Mesh) noteRefused(ctx context.Context, module, what string, err error) {
	id := causation.From(ctx)
	if id == "" || err == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.note(id, "while handling it, module %s's %s failed: %v", module, what, err)
}

// Explain says what became of the event with that id, step by step: who
// emitted it, which modules it was routed to (or that none subscribes,
// with the patterns there are), and for each, whether a filter rejected
// it, each attempt's outcome, a retry's time, a dead letter's reason and
// error, and any emit or call the handler made that failed. Use it in a
// test's failure message:
//
//	if len(receipts) == 0 {
//		t.Errorf("no receipt; the order:\n%s", mt.Explain(orderID))
//	}
func (m *Mesh) Explain(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	notes, ok := m.fates[id]
	if !ok {
		return fmt.Sprintf("the test mesh knows no event %q (Emitted lists the events there are)", id)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "event %s:\n", id)
	for _, n := range notes {
		b.WriteString("  - " + n + "\n")
	}
	if len(notes) == maxNotes {
		b.WriteString("  - (more not kept)\n")
	}
	return b.String()
}

// subscriptions lists each loaded module's patterns, for an event no
// module took. m.mu is held.
func (m *Mesh) subscriptions() string {
	var parts []string
	for _, mod := range m.modules {
		var ps []string
		for _, s := range mod.subs {
			ps = append(ps, s.pattern)
		}
		if len(ps) > 0 {
			parts = append(parts, fmt.Sprintf("%s on %s", mod.def.Name, strings.Join(ps, ", ")))
		}
	}
	if len(parts) == 0 {
		return "no module subscribes to anything"
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// routedNote is the note of ev's routing to names. m.mu is held.
func (m *Mesh) routedNote(eventType string, names []string) string {
	if len(names) == 0 {
		return fmt.Sprintf("routed to no module: no pattern matches %s (%s)", eventType, m.subscriptions())
	}
	return "routed to " + strings.Join(names, ", ")
}
