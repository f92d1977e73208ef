package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"strconv"
)

// Hand-offs per event (issue 48): how often a goroutine was scheduled to
// run, and how often a thread of a process was switched off its CPU, over
// a round, divided by its events. A delivery handed from goroutine to
// goroutine, or a thread parked on a futex and woken, costs the scheduler
// and the kernel more than the event's own work; these counts say how
// many such hand-offs each path makes per event.

// goroutineRuns estimates how many times a goroutine of this process has
// been scheduled to run so far: the count of the scheduler's latency
// histogram (runtime/metrics) times gTrackingPeriod, since the runtime
// records one in every gTrackingPeriod of a goroutine's runs
// (runtime/proc.go, Go 1.26).
func goroutineRuns() uint64 {
	s := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return n * gTrackingPeriod
}

// gTrackingPeriod is the Go runtime's sampling of the scheduler's latency:
// one run in this many is recorded.
const gTrackingPeriod = 8

// threadSwitches is how many times the threads of process pid now running
// have been switched off their CPU, voluntarily (parked: a futex, a read
// that would block) or not (/proc/PID/task/*/status), or -1 when it cannot
// be read. Threads that ended are not counted: Go's threads live as long
// as their process.
func threadSwitches(pid int) int64 {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return -1
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended since the glob
		}
		for line := range bytes.Lines(b) {
			k, v, ok := bytes.Cut(line, []byte(":"))
			if !ok || !bytes.HasSuffix(k, []byte("ctxt_switches")) {
				continue
			}
			if x, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
				n += x
			}
		}
	}
	return n
}
