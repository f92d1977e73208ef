package plugin

import "time"

// Linger is how long a batch waits to fill before it crosses the process
// boundary, and MaxBatch how big it may grow
// (shared/reference/plugin-boundary-cost.md: batches that wait about 1 ms
// cut the CPU per message from about 105 µs to 36 µs).
const (
	Linger   = time.Millisecond
	MaxBatch = 64
)

// Batches groups what arrives on in: a batch starts with the first item and
// waits up to Linger for more, up to MaxBatch, or until flushNow (if not nil)
// says nothing more is coming soon. The returned channel closes when done
// does.
func Batches[T any](in <-chan T, done <-chan struct{}, flushNow func() bool) <-chan []T {
	out := make(chan []T)
	go func() {
		defer close(out)
		for {
			var first T
			select {
			case first = <-in:
			case <-done:
				return
			}
			batch := []T{first}
			timer := time.NewTimer(Linger)
		fill:
			for len(batch) < MaxBatch && (flushNow == nil || !flushNow()) {
				select {
				case v := <-in:
					batch = append(batch, v)
				case <-timer.C:
					break fill
				case <-done:
					timer.Stop()
					return
				}
			}
			timer.Stop()
			select {
			case out <- batch:
			case <-done:
				return
			}
		}
	}()
	return out
}
