package hostile

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/confine"
)

// TestModuleReachesOnlyTheNetworkItIsGranted runs meshd with a hostile
// module that dials the broker as a client of its own (with the node's
// very URL, guest's here, as on every dev node), over TCP, Multipath TCP
// and SCTP, the broker's management port, a destination its entry
// grants and one it does not, sends a UDP datagram, listens, and writes
// into /dev/shm and /var/tmp. As root, the module runs as a user of its
// own and is granted one destination; under an unprivileged meshd it is
// granted none. Only the granted destination answers.
func TestModuleReachesOnlyTheNetworkItIsGranted(t *testing.T) {
	if confine.ABI() < confine.NetworkABI {
		t.Skipf("this kernel's Landlock (%d) governs no network; meshd says so in its start log", confine.ABI())
	}
	meshd := filepath.Join(filepath.Dir(evilBin), "meshd")
	if out, err := exec.Command("go", "build", "-o", meshd, "../../cmd/meshd").CombinedOutput(); err != nil {
		t.Fatalf("build meshd: %v\n%s", err, out)
	}
	granted, ungranted := listenTCP(t), listenTCP(t)
	run := func(t *testing.T, argv []string, grant string) []reportLine {
		dir, err := os.MkdirTemp("", "hostile-network-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		url := brokertest.VHost(t)
		report := newReports(t, dir, "report")
		cfg := filepath.Join(dir, "mesh.yaml")
		settings := fmt.Sprintf(`{"attack": "network", "report": %q, "name": "evil", "amqp": %q, "connect": [%q, %q, "127.0.0.1:15672"]}`,
			report.path, url, granted, ungranted)
		writeOwned(t, cfg, fmt.Sprintf(`node: anchor
amqp_url: %s
state_dir: %s
modules:
  - name: evil
    path: %s
%s    config: %s
`, url, filepath.Join(dir, "state"), evilBin, grant, settings))
		return runMeshdUntilReported(t, append(argv, meshd, "run", "--config", cfg), nil, report)
	}
	denied := func(t *testing.T, lines []reportLine, steps ...string) {
		t.Helper()
		for _, s := range steps {
			l := step(lines, s)
			if l.Step == "" {
				t.Errorf("no report of %q: %+v", s, lines)
			} else if l.Err == "" {
				t.Errorf("the hostile module's %s succeeded", s)
			}
		}
	}
	common := []string{"amqp", "mptcp 127.0.0.1:5672", "sctp 127.0.0.1:5672", "connect " + ungranted, "connect 127.0.0.1:15672", "listen",
		"list /dev/shm", "write /dev/shm", "list /var/tmp", "write /var/tmp"}

	t.Run("granted one destination", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("meshd gives modules users of their own only as root")
		}
		lines := run(t, nil, fmt.Sprintf("    network: {connect: [%q]}\n", granted))
		if l := step(lines, "connect "+granted); l.Step == "" || l.Err != "" {
			t.Errorf("the granted destination: %+v", l)
		}
		denied(t, lines, common...)
		if l := step(lines, "amqp"); !strings.Contains(l.Err, "permission denied") {
			t.Errorf("the broker as guest: %+v, want permission denied", l)
		}
	})
	t.Run("granted nothing, meshd unprivileged", func(t *testing.T) {
		var argv []string
		if os.Geteuid() == 0 {
			argv = []string{"setpriv", fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups"}
		}
		lines := run(t, argv, "")
		denied(t, lines, append(common, "connect "+granted)...)
		if confine.FiltersSystemCalls() {
			denied(t, lines, "udp")
		}
	})
}

// listenTCP accepts (and closes) connections on 127.0.0.1 until the test
// ends; it returns its address.
func listenTCP(t *testing.T) string {
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
	return l.Addr().String()
}
