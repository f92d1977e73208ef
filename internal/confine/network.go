package confine

import (
	"fmt"
	"strconv"
	"strings"
)

// Ports is a range of TCP ports, Lo to Hi inclusive (Lo == Hi for one).
type Ports struct{ Lo, Hi uint16 }

// String is "PORT" or "LO-HI".
func (p Ports) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

// Count is how many ports the range holds.
func (p Ports) Count() int { return int(p.Hi) - int(p.Lo) + 1 }

// ParsePorts reads "PORT" or "LO-HI" (1 to 65535, LO ≤ HI; port 0 only
// alone, for a port the kernel picks when the process binds).
func ParsePorts(s string) (Ports, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, errL := strconv.ParseUint(lo, 10, 16)
	h, errH := strconv.ParseUint(hi, 10, 16)
	switch {
	case errL != nil || errH != nil:
		return Ports{}, fmt.Errorf("port %q: want PORT or LOW-HIGH, numbers from 1 to 65535", s)
	case l > h:
		return Ports{}, fmt.Errorf("port range %q: %d is above %d", s, l, h)
	case l == 0 && isRange:
		return Ports{}, fmt.Errorf("port range %q: ranges start at 1", s)
	}
	return Ports{Lo: uint16(l), Hi: uint16(h)}, nil
}

// Network is what a confined process may do over TCP: connect to the
// ports of Connect (on any host: Landlock governs ports, not addresses)
// and bind to those of Bind. A process with neither may not make an IPv4
// or IPv6 socket of any kind (UDP included), where the launcher can
// filter system calls (linux on amd64 and arm64).
type Network struct {
	Connect, Bind []Ports
}

// Closed says whether the process may use neither TCP nor UDP at all.
func (n Network) Closed() bool { return len(n.Connect) == 0 && len(n.Bind) == 0 }

// portsArg joins ranges for the launcher's arguments.
func portsArg(ps []Ports) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// NetworkABI is the first Landlock version that governs TCP by port.
const NetworkABI = 4
