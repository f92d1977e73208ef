package guest_test

import (
	"context"
	"net"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/guest"
)

// TestProbe: against the test broker, which accepts guest/guest from
// loopback (RabbitMQ's default), a node of its own user is told guest is
// accepted; a node logging in as guest is told that too; a broker that
// does not answer says nothing; the node's own password is never used.
func TestProbe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := brokertest.VHost(t)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	name, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", strings.TrimPrefix(u.Path, "/"), name, ".*", ".*", ".*")
	own := *u
	own.User = neturl.UserPassword(name, password)
	addr := brokertest.Host()

	c := guest.Probe(ctx, own.String(), nil)
	if !c.Accepted || c.Node || c.Addr != addr {
		t.Errorf("a node of its own user: %+v, want guest accepted at %s", c, addr)
	}
	w := c.Warnings()
	if len(w) != 1 || w[0] != "the broker at "+addr+" accepts guest/guest from this host: any local process can publish as any node and module; "+
		"delete guest or keep it to loopback and give each node a user of its own (docs/security.md)" {
		t.Errorf("warnings: %q", w)
	}
	if strings.Contains(strings.Join(w, " "), password) {
		t.Errorf("the warnings show the node's password: %q", w)
	}

	c = guest.Probe(ctx, url, nil)
	if !c.Accepted || !c.Node || len(c.Warnings()) != 2 || !strings.Contains(c.Warnings()[1], "this node logs in to the broker at "+addr+" as guest") {
		t.Errorf("a node as guest: %+v %q", c, c.Warnings())
	}

	// Nothing listens there: no warning, and no wait past the timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if c := guest.Probe(ctx, "amqp://"+name+":"+password+"@"+closed+"/", nil); c.Accepted || c.Node || len(c.Warnings()) != 0 {
		t.Errorf("no broker: %+v", c)
	}
	if c := guest.Probe(ctx, "http://not-amqp/", nil); c.Accepted || len(c.Warnings()) != 0 {
		t.Errorf("not a broker URL: %+v", c)
	}
}
