package nodeconfig

import (
	"fmt"
	"net"
	"strings"

	"github.com/meshkit/mesh/internal/confine"
)

// Network is what a module process may reach over TCP. meshd enforces it
// with Landlock's network rules, which govern ports, not addresses: a
// grant of db.internal:5432 lets the module connect to port 5432 of any
// host. The host is there to say what the grant is for; meshd resolves it
// when it starts the module and logs what it found. A module granted
// nothing may make no IPv4 or IPv6 socket at all (UDP included).
type Network struct {
	// Connect are the HOST:PORT (or HOST:LOW-HIGH) the module may connect
	// to; HOST may be * for any.
	Connect []string `yaml:"connect"`
	// Bind are the [HOST]:PORT (or ranges) the module may listen on.
	Bind []string `yaml:"bind"`
}

// NetworkGrant is one entry of Network: a host ("" or "*" for any) and
// its ports.
type NetworkGrant struct {
	Host  string
	Ports confine.Ports
}

// String is the entry as written: HOST:PORTS.
func (g NetworkGrant) String() string { return net.JoinHostPort(g.Host, g.Ports.String()) }

// Parse reads the grants, naming the first entry it cannot read.
func (n Network) Parse() (connect, bind []NetworkGrant, err error) {
	read := func(field string, entries []string, needHost bool) ([]NetworkGrant, error) {
		out := make([]NetworkGrant, 0, len(entries))
		for i, e := range entries {
			host, ports, err := net.SplitHostPort(e)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %q: want HOST:PORT or HOST:LOW-HIGH (e.g. db.internal:5432): %v", field, i, e, err)
			}
			if needHost && host == "" {
				return nil, fmt.Errorf("%s[%d]: %q names no host: say which (e.g. db.internal:5432), or * for any", field, i, e)
			}
			if strings.ContainsAny(host, " /") {
				return nil, fmt.Errorf("%s[%d]: %q: %q is not a host name or address", field, i, e, host)
			}
			p, err := confine.ParsePorts(ports)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
			}
			if p.Lo == 0 && needHost {
				return nil, fmt.Errorf("%s[%d]: %q: port 0 is for bind (a port the kernel picks)", field, i, e)
			}
			out = append(out, NetworkGrant{Host: host, Ports: p})
		}
		return out, nil
	}
	if connect, err = read("connect", n.Connect, true); err != nil {
		return nil, nil, err
	}
	if bind, err = read("bind", n.Bind, false); err != nil {
		return nil, nil, err
	}
	return connect, bind, nil
}

// Confine is the grants as the launcher enforces them: their ports.
func (n Network) Confine() (confine.Network, error) {
	connect, bind, err := n.Parse()
	if err != nil {
		return confine.Network{}, err
	}
	var c confine.Network
	for _, g := range connect {
		c.Connect = append(c.Connect, g.Ports)
	}
	for _, g := range bind {
		c.Bind = append(c.Bind, g.Ports)
	}
	return c, nil
}
