package confine_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshkit/mesh/internal/confine"
)

// netProbeArg makes the test binary a probe of the network it has:
// `netProbeArg connect HOST:PORT | bind HOST:PORT | udp HOST:PORT ...`,
// one line "STEP: ok" or "STEP: ERROR" per step.
const netProbeArg = "net-probe"

func netProbe(args []string) {
	for i := 0; i+1 < len(args); i += 2 {
		what, addr := args[i], args[i+1]
		var err error
		switch what {
		case "connect":
			var c net.Conn
			if c, err = net.Dial("tcp", addr); err == nil {
				c.Close()
			}
		case "bind":
			var l net.Listener
			if l, err = net.Listen("tcp", addr); err == nil {
				l.Close()
			}
		case "mptcp": // a way around Landlock's TCP rules, where not filtered
			err = dialProto(addr, 262)
		case "udp":
			var c net.Conn
			if c, err = net.Dial("udp", addr); err == nil {
				_, err = c.Write([]byte("x"))
				c.Close()
			}
		}
		if err != nil {
			fmt.Printf("%s %s: %v\n", what, addr, err)
		} else {
			fmt.Printf("%s %s: ok\n", what, addr)
		}
	}
}

// dialProto connects a stream socket of protocol proto to addr (IPv4).
func dialProto(addr string, proto int) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, proto)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	return nil
}

// probe runs the probe confined with network n (and every path open) and
// returns its lines by step.
func probe(t *testing.T, n *confine.Network, steps ...string) map[string]string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(confine.Command(self, confine.Options{Network: n}), append([]string{self, netProbeArg}, steps...)...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("the probe: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		step, res, _ := strings.Cut(l, ": ")
		got[step] = res
	}
	return got
}

// listen is a TCP listener on 127.0.0.1 for the probe to reach.
func listen(t *testing.T) (string, uint16) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String(), uint16(l.Addr().(*net.TCPAddr).Port)
}

// freePort is a TCP port of 127.0.0.1 nothing listens on now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestNetworkClosedByDefault(t *testing.T) {
	if confine.ABI() < confine.NetworkABI {
		t.Skipf("this kernel's Landlock (%d) does not govern the network", confine.ABI())
	}
	granted, grantedPort := listen(t)
	other, _ := listen(t)
	bindPort := freePort(t)
	bind := "127.0.0.1:" + strconv.Itoa(int(bindPort))
	steps := []string{"connect", granted, "connect", other, "bind", bind, "udp", "127.0.0.1:9", "mptcp", other}

	// Unconfined, every step succeeds: the probe can tell.
	open := probe(t, nil, steps...)
	for _, s := range []string{"connect " + granted, "connect " + other, "bind " + bind, "udp 127.0.0.1:9", "mptcp " + other} {
		if open[s] != "ok" && (s != "mptcp "+other || !strings.Contains(open[s], "socket:")) { // MPTCP may be off
			t.Fatalf("unconfined, %s: %q", s, open[s])
		}
	}

	closed := probe(t, &confine.Network{}, steps...)
	for _, s := range []string{"connect " + granted, "connect " + other, "bind " + bind} {
		if !strings.Contains(closed[s], "permission denied") {
			t.Errorf("granted no network, %s: %q, want permission denied", s, closed[s])
		}
	}
	if confine.FiltersSystemCalls() && !strings.Contains(closed["udp 127.0.0.1:9"], "permission denied") {
		t.Errorf("granted no network, a UDP socket: %q, want permission denied", closed["udp 127.0.0.1:9"])
	}

	otherBind := freePort(t)
	for otherBind == bindPort {
		otherBind = freePort(t)
	}
	some := probe(t, &confine.Network{Connect: []confine.Ports{{Lo: grantedPort, Hi: grantedPort}}, Bind: []confine.Ports{{Lo: bindPort, Hi: bindPort}}},
		append(steps, "bind", "127.0.0.1:"+strconv.Itoa(int(otherBind)))...)
	if some["connect "+granted] != "ok" || some["bind "+bind] != "ok" {
		t.Errorf("the granted connect and bind: %v", some)
	}
	if !strings.Contains(some["connect "+other], "permission denied") {
		t.Errorf("a connect to a port not granted: %q, want permission denied", some["connect "+other])
	}
	if some["mptcp "+other] == "ok" {
		t.Errorf("a Multipath TCP connect to a port not granted went around Landlock's rules")
	}
	for s, res := range some {
		if strings.HasPrefix(s, "bind ") && s != "bind "+bind && !strings.Contains(res, "permission denied") {
			t.Errorf("a bind to a port not granted: %s: %q (granted %d; all: %v)", s, res, bindPort, some)
		}
	}
}

func TestParsePorts(t *testing.T) {
	for in, want := range map[string]confine.Ports{"5432": {5432, 5432}, "8000-8010": {8000, 8010}, "0": {0, 0}, "65535": {65535, 65535}} {
		if got, err := confine.ParsePorts(in); err != nil || got != want {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "65536", "10-5", "0-10", "1-", "5432 "} {
		if _, err := confine.ParsePorts(in); err == nil {
			t.Errorf("ParsePorts(%q): want an error", in)
		}
	}
}

func TestMainRefusesBadNetworkArguments(t *testing.T) {
	for _, args := range [][]string{{"--connect", "80", "--", "sh"}, {"--network", "open", "--", "sh"}, {"--network", "confined", "--bind", "x", "--", "sh"}} {
		if err := confine.Main(args); err == nil {
			t.Errorf("Main(%q): want an error", args)
		}
	}
}
