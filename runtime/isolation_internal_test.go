package runtime

import (
	"context"
	"testing"
)

// TestIsolationGate: a suspect enters only once no other event is in the
// process, keeps new events out while it waits and while it is in, and
// gives up when its context ends, letting the others in again.
func TestIsolationGate(t *testing.T) {
	var g isolation
	ctx := context.Background()
	leaveA, err := g.enter(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	leaveB, _ := g.enter(ctx, false)
	suspectIn := make(chan func(), 1)
	go func() {
		leave, err := g.enter(ctx, true)
		if err != nil {
			t.Error(err)
		}
		suspectIn <- leave
	}()
	waitFor(t, &g, func() bool { return g.waiting == 1 })
	ordinaryIn := make(chan func(), 1)
	go func() {
		leave, _ := g.enter(ctx, false)
		ordinaryIn <- leave
	}()
	leaveA()
	select {
	case <-suspectIn:
		t.Fatal("the suspect entered beside another event")
	default:
	}
	leaveB()
	leaveS := <-suspectIn
	g.mu.Lock()
	if g.shared != 0 || !g.alone {
		t.Errorf("suspect in with %d others", g.shared)
	}
	g.mu.Unlock()
	select {
	case <-ordinaryIn:
		t.Fatal("an event entered beside the suspect")
	default:
	}
	leaveS()
	(<-ordinaryIn)()

	// A suspect whose context ends stops keeping the others out.
	leaveA, _ = g.enter(ctx, false)
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := g.enter(cctx, true)
		gaveUp <- err
	}()
	waitFor(t, &g, func() bool { return g.waiting == 1 })
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("the suspect entered with its context ended")
	}
	leaveC, err := g.enter(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	leaveC()
	leaveA()
}

// waitFor waits until cond holds under g's lock, woken by each change.
func waitFor(t *testing.T, g *isolation, cond func() bool) {
	t.Helper()
	for {
		g.mu.Lock()
		if cond() {
			g.mu.Unlock()
			return
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		<-ch
	}
}
