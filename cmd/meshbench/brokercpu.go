package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The broker's CPU per event (issue 30): the user and system time of the
// broker's Erlang VM (beam.smp, /proc/PID/stat) over a round, divided by
// its events, beside the client's. It counts everything the broker does
// meanwhile, on every virtual host: on a shared machine, other work shows
// in it as it does in the client's figure.

// brokerPID is the broker's operating-system process, asked of the broker
// once (rabbitmqctl eval), or 0 when it cannot be told: the broker's CPU
// is then not reported.
var brokerPID = findBrokerPID()

func findBrokerPID() int {
	out, err := exec.Command("rabbitmqctl", "eval", "list_to_integer(os:getpid()).").Output()
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(out)))
	if err != nil || processCPU(pid) < 0 {
		return 0
	}
	return pid
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// processCPU is the user+system CPU time of process pid so far, or -1
// when it cannot be read.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command may hold spaces: the fields start after its ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // fields 3.. of stat(5): utime and stime are 14 and 15
		return -1
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * clockTick
}

// brokerCPU is the broker's CPU time so far (0 when it is not known).
func brokerCPU() time.Duration {
	if brokerPID == 0 {
		return 0
	}
	return max(processCPU(brokerPID), 0)
}
