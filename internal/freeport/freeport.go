// Package freeport picks a loopback TCP port for a process a test starts
// (a meshd's http_addr, a private PostgreSQL). A port the kernel picks for
// listen(":0") comes from the ephemeral range, which it also gives to
// outgoing connections: once the test closes its listener, any process's
// next connection (a client of the shared broker, say) may take the port
// before the started process binds it ("address already in use", seen in
// test/upgrade). These ports come from below that range, where no
// connection is given one, picked at random and found free.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// lowest is the lowest port picked: above the well-known and the usual
// registered services'.
const lowest = 20000

// Port is a free TCP port of 127.0.0.1 below the ephemeral range.
func Port(t testing.TB) int {
	t.Helper()
	high := ephemeralLow()
	for range 200 {
		port := lowest + rand.IntN(high-lowest)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		_ = ln.Close()
		return port
	}
	t.Fatalf("no free port of 127.0.0.1 found between %d and %d", lowest, high)
	return 0
}

// Addr is Port's address, 127.0.0.1:PORT.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(t))
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux's
// default 32768 when it cannot be read, or when it leaves no room below).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low > lowest+1000 {
				return low
			}
		}
	}
	return 32768
}
