package runtime

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
)

// wireChannel is a channel as the broker sees it: the deliveries
// outstanding, and what the module decided for each. It fails the test on
// any settlement the broker would take wrongly: an ack (single or
// multiple) of a delivery the module did not ack, or of one already
// settled.
type wireChannel struct {
	t           *testing.T
	outstanding map[uint64]bool // tag -> the module acked it
	frames      []string
}

func (w *wireChannel) Ack(tag uint64, multiple bool) error {
	w.frames = append(w.frames, fmt.Sprintf("ack %d %v", tag, multiple))
	if !multiple {
		acked, ok := w.outstanding[tag]
		if !ok || !acked {
			w.t.Fatalf("ack %d: outstanding %v, acked by the module %v", tag, ok, acked)
		}
		delete(w.outstanding, tag)
		return nil
	}
	for o, acked := range w.outstanding {
		if o <= tag {
			if !acked {
				w.t.Fatalf("ack %d multiple covers %d, which the module did not ack (frames %v)", tag, o, w.frames)
			}
			delete(w.outstanding, o)
		}
	}
	return nil
}

func (w *wireChannel) Nack(tag uint64, multiple, requeue bool) error {
	w.t.Fatal("nack")
	return nil
}

func (w *wireChannel) Reject(tag uint64, requeue bool) error {
	if _, ok := w.outstanding[tag]; !ok {
		w.t.Fatalf("reject %d: not outstanding", tag)
	}
	delete(w.outstanding, tag)
	return nil
}

// TestAckerCoalesces: acks of a run go as one ack with multiple; a gap
// (a delivery still handled) sends the acks past it one by one; a reject
// sent before lets a later multiple ack run past it.
func TestAckerCoalesces(t *testing.T) {
	w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
	a := newAcker(w, 32) // flush at 8 held
	for tag := uint64(1); tag <= 12; tag++ {
		w.outstanding[tag] = false
	}
	ack := func(tag uint64) {
		w.outstanding[tag] = true
		if err := a.ack(tag); err != nil {
			t.Fatal(err)
		}
	}
	for tag := uint64(1); tag <= 8; tag++ {
		ack(tag)
	}
	if !slices.Equal(w.frames, []string{"ack 8 true"}) {
		t.Errorf("8 in order: %v", w.frames)
	}
	// 9 is still handled; 10 rejected for a retry; 11 and 12 acked.
	if err := w.Reject(10, true); err != nil {
		t.Fatal(err)
	}
	a.settled(10)
	ack(11)
	ack(12)
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.frames[1:], []string{"ack 11 false", "ack 12 false"}) && !slices.Equal(w.frames[1:], []string{"ack 12 false", "ack 11 false"}) {
		t.Errorf("past the gap at 9: %v", w.frames[1:])
	}
	ack(9)
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if got := w.frames[len(w.frames)-1]; got != "ack 9 true" || len(w.outstanding) != 0 {
		t.Errorf("the gap filled: %v, outstanding %v", w.frames, w.outstanding)
	}
	if a.base != 12 || len(a.done) != 0 || len(a.held) != 0 {
		t.Errorf("acker left base %d, done %v, held %v", a.base, a.done, a.held)
	}
}

// FuzzAcker: in any order of outcomes (ack, reject) and flushes (all, or
// grouped: acks past a gap may stay held), the
// acker never acks on the wire what the module did not ack, and after a
// last flush every delivery is settled.
func FuzzAcker(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 200, 100})
	f.Add([]byte{1, 130, 3, 129, 255, 2, 0})
	f.Add([]byte{1, 3, 4, 254, 0, 254, 5, 6, 255})
	f.Fuzz(func(t *testing.T, script []byte) {
		const n = 40
		w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
		a := newAcker(w, 16)
		for tag := uint64(1); tag <= n; tag++ {
			w.outstanding[tag] = false
		}
		open := make([]uint64, 0, n)
		for tag := uint64(1); tag <= n; tag++ {
			open = append(open, tag)
		}
		for i := 0; len(open) > 0; i++ {
			var b byte
			if i < len(script) {
				b = script[i]
			}
			if b == 255 || b == 254 {
				if err := a.flushOf(b == 255); err != nil {
					t.Fatal(err)
				}
				continue
			}
			k := int(b&0x7f) % len(open)
			tag := open[k]
			open = slices.Delete(open, k, k+1)
			if b&0x80 != 0 {
				if err := w.Reject(tag, true); err != nil {
					t.Fatal(err)
				}
				a.settled(tag)
				continue
			}
			w.outstanding[tag] = true
			if err := a.ack(tag); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.flush(); err != nil {
			t.Fatal(err)
		}
		if len(w.outstanding) != 0 {
			t.Errorf("left outstanding: %v (frames %v)", w.outstanding, w.frames)
		}
	})
}

// TestAckerLingers: with acks held, a worker may wait for more deliveries
// only while less than half the prefetch is unsettled on the wire; with
// more, the broker may be waiting for acks, so they go at once.
func TestAckerLingers(t *testing.T) {
	w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
	a := newAcker(w, 32)
	if h, l := a.lingers(); h || l {
		t.Errorf("nothing held: held %v, lingers %v", h, l)
	}
	for tag := uint64(1); tag <= 20; tag++ {
		w.outstanding[tag] = false
	}
	a.delivered(3)
	w.outstanding[1] = true
	if err := a.ack(1); err != nil {
		t.Fatal(err)
	}
	if h, l := a.lingers(); !h || !l {
		t.Errorf("one held, 3 unsettled of a prefetch of 32: held %v, lingers %v; want both", h, l)
	}
	a.delivered(20)
	if h, l := a.lingers(); !h || l {
		t.Errorf("one held, 20 unsettled of a prefetch of 32: held %v, lingers %v; want held, not lingering", h, l)
	}
}

// TestAckerWritesRecordsBeforeAcks: a flush writes the handled events'
// records before it sends an ack; while the write fails, no ack goes and
// every ack stays held; the next flush that can write sends them all.
func TestAckerWritesRecordsBeforeAcks(t *testing.T) {
	w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
	a := newAcker(w, 32) // flush at 8 held
	var fail error
	writes := 0
	a.records = func() error {
		writes++
		w.frames = append(w.frames, "records")
		return fail
	}
	fail = fmt.Errorf("no space left on device (forced)")
	for tag := uint64(1); tag <= 9; tag++ {
		w.outstanding[tag] = true
		if err := a.ack(tag); err != nil {
			t.Fatalf("ack %d: %v (held, not an error, while the records wait)", tag, err)
		}
	}
	if err := a.flush(); !errors.Is(err, errRecordsUnwritten) {
		t.Fatalf("flush while the records cannot be written = %v, want errRecordsUnwritten", err)
	}
	if len(w.outstanding) != 9 || slices.Contains(w.frames, "ack 9 true") {
		t.Fatalf("acks sent while the records could not be written: %v", w.frames)
	}
	fail = nil
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if got := w.frames[len(w.frames)-2:]; !slices.Equal(got, []string{"records", "ack 9 true"}) {
		t.Fatalf("frames end %v, want the records written, then one ack of all nine", got)
	}
	if len(w.outstanding) != 0 {
		t.Fatalf("left unsettled: %v", w.outstanding)
	}
	if err := a.flush(); err != nil || w.frames[len(w.frames)-1] != "ack 9 true" {
		t.Fatalf("a flush with nothing held wrote or sent: %v, %v", err, w.frames)
	}
}

// TestAckPlanWaitsForTheOutcomesDue: a worker of a module process whose
// acks would go at once (the broker may be waiting: half the prefetch
// unsettled) lingers instead while outcomes handed to other workers are
// still to be taken, so that the last of them sends the batch's acks in
// one flush; once none is due, they go at once again. Nothing held:
// nothing to send, due or not. An in-process module (no counter) is as
// before.
func TestAckPlanWaitsForTheOutcomesDue(t *testing.T) {
	w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
	a := newAcker(w, 32)
	var due atomic.Int64
	plugin := &Module{cfg: ModuleConfig{outcomesDue: &due}}
	inProcess := &Module{}
	if got := plugin.ackPlan(a); got != ackNothingHeld {
		t.Errorf("nothing held: plan %d, want ackNothingHeld", got)
	}
	for tag := uint64(1); tag <= 20; tag++ {
		w.outstanding[tag] = false
	}
	a.delivered(20)
	w.outstanding[1] = true
	if err := a.ack(1); err != nil {
		t.Fatal(err)
	}
	if got := plugin.ackPlan(a); got != ackNow {
		t.Errorf("held, broker waiting, no outcome due: plan %d, want ackNow", got)
	}
	due.Add(3)
	if got := plugin.ackPlan(a); got != ackAfterLinger {
		t.Errorf("held, broker waiting, 3 outcomes due: plan %d, want ackAfterLinger", got)
	}
	if got := inProcess.ackPlan(a); got != ackNow {
		t.Errorf("in-process, held, broker waiting: plan %d, want ackNow", got)
	}
	due.Add(-3)
	if got := plugin.ackPlan(a); got != ackNow {
		t.Errorf("the last outcome taken: plan %d, want ackNow", got)
	}
}

// TestGroupedFlushHoldsWhatIsPastAGap: a worker's flush sends the run
// before a gap as one multiple ack and keeps the few acks past the gap
// held; once the gap closes, the next flush sends them all in one
// multiple ack. A flush whose run is empty (the gap is the lowest
// delivery) sends them one by one, so none waits behind a slow handler;
// and flush sends everything.
func TestGroupedFlushHoldsWhatIsPastAGap(t *testing.T) {
	w := &wireChannel{t: t, outstanding: map[uint64]bool{}}
	a := newAcker(w, 32) // max 8
	for tag := uint64(1); tag <= 6; tag++ {
		w.outstanding[tag] = false
	}
	a.delivered(6)
	for _, tag := range []uint64{1, 2, 4, 5} { // 3 still being handled
		w.outstanding[tag] = true
		if err := a.ack(tag); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flushOf(false); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ack 2 true"}; !slices.Equal(w.frames, want) {
		t.Fatalf("grouped flush: frames %v, want %v (4 and 5 held past the gap)", w.frames, want)
	}
	w.outstanding[3] = true
	if err := a.ack(3); err != nil {
		t.Fatal(err)
	}
	if err := a.flushOf(false); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ack 2 true", "ack 5 true"}; !slices.Equal(w.frames, want) {
		t.Fatalf("after the gap closed: frames %v, want %v", w.frames, want)
	}
	// 6 is slow: 7 and 8 past it go one by one, the run being empty.
	for tag := uint64(7); tag <= 8; tag++ {
		w.outstanding[tag] = true
		if err := a.ack(tag); err != nil {
			t.Fatal(err)
		}
	}
	a.delivered(8)
	if err := a.flushOf(false); err != nil {
		t.Fatal(err)
	}
	if got := w.frames[2:]; len(got) != 2 || !slices.Contains(got, "ack 7 false") || !slices.Contains(got, "ack 8 false") {
		t.Fatalf("past a gap with an empty run: frames %v, want 7 and 8 one by one", got)
	}
	// flush sends what a grouped flush would keep.
	w.outstanding[9], w.outstanding[11] = true, true
	w.outstanding[6], w.outstanding[10] = true, false
	a.delivered(11)
	for _, tag := range []uint64{6, 9, 11} {
		if err := a.ack(tag); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if got := w.frames[4:]; !slices.Equal(got, []string{"ack 9 true", "ack 11 false"}) {
		t.Fatalf("flush: frames %v, want the run to 9 and 11 past the gap at 10", got)
	}
}
