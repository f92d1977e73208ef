package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/wire"
)

// Isolation: a module process that exits with several events in flight
// cannot say which one killed it, so none of them is charged an attempt;
// each is a suspect, handed to the restarted process alone until the
// process survives it. Only an event in whose handling the process exited
// alone is charged (and at its max_attempts dead-lettered, the crash named
// as the cause). docs/adr/0038-module-process-lost-while-loading.md,
// "Amendment: a crash charges only the event it was alone with". The
// invariants:
//
//   - An event handling in a module process (forward: its own queue, its
//     consumed queues, its dead letters) is counted in its process from
//     before it is handed over until it returns; when the process exits,
//     the count at that moment says whether each handling then in flight
//     was alone in it. Tool calls and history batches are not counted nor
//     held back (a handler may call its own module's tools).
//   - A suspect (x-mesh-suspect on the node's own copy) enters the
//     module's isolation gate alone: it waits until no other event is in
//     the process and none enters while it is; an ordinary event waits
//     while a suspect is handled or waits its turn. The gate holds no
//     event of its own: what waits is the workers' deliveries (bounded by
//     prefetch), and the mark travels with the message, not in memory.
//   - A handling that never reached the process (it exited first), or a
//     crash with others in flight, is settled by an uncharged copy: the
//     attempts charged so far in x-mesh-attempt, marked suspect; the
//     broker's own count (x-delivery-count) is not raised, since the copy
//     is a new message. A crash alone is charged: a copy with one attempt
//     more, still a suspect, after the usual back-off, or a dead letter
//     at the limit.

// isolation is a module process's gate: ordinary events share it; a
// suspect holds it alone. A waiting suspect keeps new ordinary events
// out, so it waits at most for those already in the process.
type isolation struct {
	mu      sync.Mutex
	shared  int  // ordinary events in the process
	alone   bool // a suspect is in it
	waiting int  // suspects waiting their turn
	changed chan struct{}
}

// enter waits for the event's turn (alone, for a suspect) and returns the
// function that lets it go; it gives up when ctx ends.
func (g *isolation) enter(ctx context.Context, suspect bool) (leave func(), err error) {
	g.mu.Lock()
	if suspect {
		g.waiting++
		g.wake()
	}
	for {
		switch {
		case suspect && !g.alone && g.shared == 0:
			g.waiting--
			g.alone = true
			g.mu.Unlock()
			return sync.OnceFunc(func() { g.leave(true) }), nil
		case !suspect && !g.alone && g.waiting == 0:
			g.shared++
			g.mu.Unlock()
			return sync.OnceFunc(func() { g.leave(false) }), nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
			g.mu.Lock()
		case <-ctx.Done():
			g.mu.Lock()
			if suspect {
				g.waiting--
				g.wake()
			}
			g.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

func (g *isolation) leave(suspect bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if suspect {
		g.alone = false
	} else {
		g.shared--
	}
	g.wake()
}

// wake tells every waiter the gate changed; g.mu is held.
func (g *isolation) wake() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// processCrash is a handling's error when its module process went away
// before the outcome came back.
type processCrash struct {
	// handed is false when the event never reached the process: it
	// exited first (or the module stopped while the event waited its
	// turn).
	handed bool
	// others is how many other events were in flight in the process when
	// it exited: with any, the process did not exit alone with this one.
	others int
	// exit is how the process ended: "signal: killed", "exit status 3",
	// or what its delivery stream said.
	exit string
}

func (e *processCrash) Error() string {
	switch {
	case !e.handed:
		return fmt.Sprintf("module process exited (%s) before the event reached it", e.exit)
	case e.others > 0:
		return fmt.Sprintf("module process exited (%s) while handling the event with %d others in flight", e.exit, e.others)
	}
	return fmt.Sprintf("module process exited (%s) while handling the event alone", e.exit)
}

// charged reports whether the crash counts as an attempt on the event:
// the process exited while handling it alone.
func (e *processCrash) charged() bool { return e.handed && e.others == 0 }

// suspectOf is how many times a module process exited handling d alone,
// if d is a suspect (the node's own copy marked x-mesh-suspect); -1 if it
// is not one.
func (m *Module) suspectOf(d amqp.Delivery) int {
	v, ok := d.Headers[wire.HeaderSuspect]
	if !ok {
		return -1
	}
	if o, _ := m.node.originOf(d); !o.own {
		return -1
	}
	switch n := v.(type) {
	case int64:
		return int(max(n, 0))
	case int32:
		return int(max(n, 0))
	}
	return -1
}

// isolate waits for d's turn in the module process's isolation gate, alone
// if d is a suspect; nil, nil for a module of the node's own process. It
// gives up only when the module's handlers are cancelled (a stop whose
// grace ran out).
func (m *Module) isolate(d amqp.Delivery) (leave func(), err error) {
	if m.cfg.isolation == nil {
		return func() {}, nil
	}
	leave, err = m.cfg.isolation.enter(m.handleCtx, m.suspectOf(d) >= 0)
	if err != nil {
		return nil, &processCrash{exit: "the module stopped: " + err.Error()}
	}
	return leave, nil
}

// crashed settles a handling whose module process went away. A crash the
// event was alone in is a failed attempt, as the policy decides (a copy
// one attempt on, still a suspect, after the back-off; a dead letter at
// the limit, naming the crash and how many times it happened); any other
// is no attempt: the event goes back at once as a suspect, its attempts
// unchanged, to be handed to the restarted process alone.
func (m *Module) crashed(src source, d amqp.Delivery, eventType string, attempt int, c *processCrash) {
	crashes := max(m.suspectOf(d), 0)
	if !c.charged() {
		m.log.Warn("module process went away with the event in flight; it goes back as a suspect, to be handled alone, with no attempt counted",
			"event_type", eventType, "event_id", d.MessageId, "attempt", attempt, "err", c)
		m.copyBack(src, d, eventType, attempt-1, crashes)
		return
	}
	crashes++
	cause := fmt.Errorf("module process exited while handling the event alone (%s) %d time(s)", c.exit, crashes)
	m.node.stats.failed.Add(1)
	m.from(d).failed.Add(1)
	v := m.retryPolicy(src.quorum).decide(execute.Failed, attempt)
	if v.settle == settleDead {
		m.deadLetter(src, d, eventType, attempt, v.reason, cause)
		return
	}
	// A copy, on either queue type, so that the mark goes with it: it is
	// handled alone from now on (through the delay cascade for a long
	// back-off, as any retry).
	if v.settle == settleSchedule {
		m.warnFailed("module process exited while handling the event alone; its retry, alone, is scheduled", eventType, d.MessageId, attempt, v.delay, cause)
		m.scheduleRetry(src, d, eventType, attempt, v.delay, crashes)
		return
	}
	m.warnFailed("module process exited while handling the event alone; will retry it alone", eventType, d.MessageId, attempt, v.delay, cause)
	m.later(v.delay, func() { m.copyBack(src, d, eventType, attempt, crashes) })
}

// exitStatus says how p's process ended once go-plugin has seen it end
// (within a second: a process whose stream ended may live on until its
// supervisor kills it); otherwise what its delivery stream said.
func (p *moduleProcess) exitStatus() string {
	p.exitOnce.Do(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		give := time.After(time.Second)
		for !p.client.Exited() {
			select {
			case <-t.C:
			case <-give:
				p.exitDesc = "its delivery stream ended"
				if err := p.exitErr(); err != nil {
					p.exitDesc += ": " + truncateText(err.Error(), 300)
				}
				return
			}
		}
		// go-plugin sets Exited under its lock after the command's Wait
		// wrote ProcessState: read after Exited, it is there.
		p.exitDesc = "it ended"
		if p.cmd != nil && p.cmd.ProcessState != nil {
			p.exitDesc = p.cmd.ProcessState.String()
		}
	})
	return p.exitDesc
}

// isCrash is the processCrash err wraps, if any.
func isCrash(err error) (*processCrash, bool) {
	var c *processCrash
	ok := errors.As(err, &c)
	return c, ok
}
