// Package heaptest measures how far a function raises the Go heap, for
// tests that bound the memory of what they run.
package heaptest

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// Use is what Around measured: the heap in use before f (after a
// collection), how far above it the heap in use rose at most while f
// ran, and how far above the live heap before f the live heap (what the
// collector found live) rose at most.
type Use struct {
	Base, Grew, Live uint64
}

// Around runs f, sampling the heap every millisecond while it runs.
func Around(f func()) Use {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	baseLive, peakLive := live[0].Value.Uint64(), live[0].Value.Uint64()
	stop, done := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			metrics.Read(live)
			mu.Lock()
			peak = max(peak, ms.HeapAlloc)
			peakLive = max(peakLive, live[0].Value.Uint64())
			mu.Unlock()
		}
	}()
	f()
	close(stop)
	<-done
	runtime.ReadMemStats(&ms) // the last sample, should f end between two
	return Use{Base: base, Grew: max(peak, ms.HeapAlloc) - base, Live: peakLive - baseLive}
}
