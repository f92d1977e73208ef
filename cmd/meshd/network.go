package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// resolveTimeout bounds the look-up of one granted host at a module's
// start.
const resolveTimeout = 2 * time.Second

// servicePorts are the ports of the node's own services: the broker's
// (AMQP, and its management API's default), and meshd's HTTP.
func servicePorts(f nodeconfig.File) map[uint16]string {
	ports := map[uint16]string{15672: "the broker's management API"}
	if u, err := url.Parse(f.AMQPURL); err == nil {
		p := u.Port()
		if p == "" {
			p = "5672"
			if u.Scheme == "amqps" {
				p = "5671"
			}
		}
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			ports[uint16(n)] = "the broker's AMQP port"
		}
	}
	if _, p, err := net.SplitHostPort(f.HTTPAddr); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			ports[uint16(n)] = "meshd's HTTP (metrics, health)"
		}
	}
	return ports
}

// describeNetwork says what network module m has, as the start log and
// config check say it: "none", or its grants with what each host
// resolved to, and whether the kernel enforces them.
func (iso *isolation) describeNetwork(m nodeconfig.Module) string {
	connect, bind, err := m.Network.Parse()
	if err != nil {
		return "refused (" + err.Error() + ")"
	}
	if len(connect)+len(bind) == 0 {
		if iso.landlock < confine.NetworkABI && !confine.FiltersSystemCalls() {
			return fmt.Sprintf("open (Landlock %d governs no network: want %d, Linux 6.7 or later)", iso.landlock, confine.NetworkABI)
		}
		return "none"
	}
	var parts []string
	for _, g := range connect {
		parts = append(parts, "connect "+iso.resolved(g))
	}
	for _, g := range bind {
		parts = append(parts, "bind "+g.String())
	}
	d := strings.Join(parts, ", ")
	if iso.landlock < confine.NetworkABI {
		return fmt.Sprintf("open: %s granted, but Landlock %d governs no network (want %d, Linux 6.7 or later)", d, iso.landlock, confine.NetworkABI)
	}
	return d + " (by port, on any host)"
}

// resolved is a connect grant with the addresses its host has now.
func (iso *isolation) resolved(g nodeconfig.NetworkGrant) string {
	if g.Host == "*" || net.ParseIP(g.Host) != nil {
		return g.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	addrs, err := iso.resolve(ctx, g.Host)
	if err != nil || len(addrs) == 0 {
		return g.String() + " (not resolved)"
	}
	slices.Sort(addrs)
	return g.String() + " (" + strings.Join(addrs, " ") + ")"
}

// networkWarnings are the grants of m that open a service of the node's
// own to it: the broker's ports (where it could publish or consume as any
// user whose password it knows, past the host's grants) or meshd's.
func (iso *isolation) networkWarnings(m nodeconfig.Module) []string {
	connect, _, err := m.Network.Parse()
	if err != nil {
		return nil
	}
	var out []string
	for _, g := range connect {
		for port, what := range iso.services {
			if g.Ports.Lo <= port && port <= g.Ports.Hi {
				out = append(out, fmt.Sprintf("network.connect %s opens port %d to the module, %s here, on every host: the module could reach it directly, past meshd", g, port, what))
			}
		}
	}
	slices.Sort(out)
	return out
}
