package runtime

import (
	"testing"
	"time"
)

// TestFailureBudget: a module logs failureBurst failure warnings per
// window; the first after the window says how many it left out.
func TestFailureBudget(t *testing.T) {
	var b failureBudget
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range failureBurst {
		if ok, _ := b.take(t0.Add(time.Duration(i) * time.Millisecond)); !ok {
			t.Fatalf("line %d refused within the burst", i+1)
		}
	}
	for range 3 {
		if ok, _ := b.take(t0.Add(time.Second)); ok {
			t.Fatal("a line past the burst was allowed")
		}
	}
	ok, suppressed := b.take(t0.Add(failureWindow))
	if !ok || suppressed != 3 {
		t.Errorf("after the window: ok %v, %d left out; want true, 3", ok, suppressed)
	}
	if ok, suppressed := b.take(t0.Add(failureWindow + time.Millisecond)); !ok || suppressed != 0 {
		t.Errorf("next: ok %v, %d left out; want true, 0", ok, suppressed)
	}
}
