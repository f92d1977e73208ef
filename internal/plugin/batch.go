package plugin

import "time"

// A batch crosses the process boundary once nothing more arrived for Gap,
// after Linger at the most, or when it holds MaxBatch.
// shared/reference/plugin-boundary-cost.md: batches that wait about 1 ms
// cut the CPU per message from about 105 µs to 36 µs. Deliveries come from
// the broker in bursts (a burst for each ack it receives), so a batch that
// waits for the burst to end gets most of that saving; waiting the whole
// Linger each time added about half a millisecond to every delivery under
// load, and a whole one to a lone event (docs/adr/0025-plugin-batches.md).
const (
	Linger   = time.Millisecond
	Gap      = 100 * time.Microsecond
	MaxBatch = 64
)

// Batches groups what arrives on in: a batch starts with the first item and
// takes more until none arrived for Gap, Linger passed, it holds MaxBatch,
// or flushNow (if not nil) says nothing more is coming soon. The returned
// channel closes when done does.
func Batches[T any](in <-chan T, done <-chan struct{}, flushNow func() bool) <-chan []T {
	out := make(chan []T)
	go func() {
		defer close(out)
		timer := time.NewTimer(Gap)
		timer.Stop()
		for {
			var first T
			select {
			case first = <-in:
			case <-done:
				return
			}
			batch := fill([]T{first}, in, done, flushNow, timer)
			if batch == nil {
				return
			}
			select {
			case out <- batch:
			case <-done:
				return
			}
		}
	}()
	return out
}

// fill adds to batch what arrives on in until the batch is due, and
// returns it; nil if done closed first. timer is stopped on return (Go
// 1.23 timers: no stale tick is received after Stop or Reset).
func fill[T any](batch []T, in <-chan T, done <-chan struct{}, flushNow func() bool, timer *time.Timer) []T {
	start := time.Now()
	last := start
	timer.Reset(Gap)
	defer timer.Stop()
	for len(batch) < MaxBatch && (flushNow == nil || !flushNow()) {
		select {
		case v := <-in:
			batch = append(batch, v)
			last = time.Now()
		case now := <-timer.C:
			quiet, waited := now.Sub(last), now.Sub(start)
			if quiet >= Gap || waited >= Linger {
				return batch
			}
			timer.Reset(min(Gap-quiet, Linger-waited))
		case <-done:
			return nil
		}
	}
	return batch
}
