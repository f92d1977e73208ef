package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/confine"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestNetworkIsSaidPerModule: the isolation line says what network each
// module has (none by default; each grant with what its host resolved
// to), and warns of a grant of the broker's or meshd's own ports.
func TestNetworkIsSaidPerModule(t *testing.T) {
	f := nodeconfig.File{AMQPURL: "amqp://mesh@broker.internal:5673/", HTTPAddr: "127.0.0.1:9090"}
	iso := &isolation{landlock: confine.NetworkABI, services: servicePorts(f), resolve: func(_ context.Context, host string) ([]string, error) {
		if host == "db.internal" {
			return []string{"10.0.0.7", "10.0.0.5"}, nil
		}
		return nil, errors.New("no such host")
	}}
	if got := iso.describeNetwork(nodeconfig.Module{}); got != "none" {
		t.Errorf("no grant: %q, want none", got)
	}
	m := nodeconfig.Module{Network: nodeconfig.Network{Connect: []string{"db.internal:5432", "gone.internal:443", "*:5600-5700"}, Bind: []string{":8080"}}}
	want := "connect db.internal:5432 (10.0.0.5 10.0.0.7), connect gone.internal:443 (not resolved), connect *:5600-5700, bind :8080 (by port, on any host)"
	if got := iso.describeNetwork(m); got != want {
		t.Errorf("grants:\n got %q\nwant %q", got, want)
	}
	w := iso.networkWarnings(m)
	if len(w) != 1 || !strings.Contains(w[0], "network.connect *:5600-5700 opens port 5673 to the module, the broker's AMQP port here") {
		t.Errorf("warnings: %q", w)
	}
	for _, grant := range []string{"x:15672", "x:9090"} {
		if w := iso.networkWarnings(nodeconfig.Module{Network: nodeconfig.Network{Connect: []string{grant}}}); len(w) != 1 {
			t.Errorf("%s: warnings %q, want one", grant, w)
		}
	}
	old := &isolation{landlock: 3, services: iso.services, resolve: iso.resolve}
	if got := old.describeNetwork(m); !strings.HasPrefix(got, "open: ") || !strings.Contains(got, "Landlock 3 governs no network") {
		t.Errorf("Landlock 3 with grants: %q", got)
	}
	if h := (how{confined: true, network: "none"}); h.String() != "meshd's user, confined by Landlock, network: none" {
		t.Errorf("the isolation line: %q", h)
	}
}
