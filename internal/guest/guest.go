// Package guest tells whether a RabbitMQ broker accepts its default user,
// guest with the password guest, from this host. Where it does, any
// process of the host can log in as guest and publish on the mesh as that
// user, and with guest's rights as any node and module: the broker checks
// only that a message's user-id is guest's (docs/security.md). meshd says
// so when it starts, and meshctl topology check reports it.
//
//	c := guest.Probe(ctx, "amqp://mesh-berlin:secret@rabbit:5672/mesh", nil)
//	for _, w := range c.Warnings() {
//		log.Warn(w)
//	}
package guest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Name is RabbitMQ's default user, and its default password.
const Name = "guest"

// Timeout bounds Probe's attempt to log in.
const Timeout = 3 * time.Second

// Check is what Probe found of one broker.
type Check struct {
	// Addr is the broker's HOST:PORT.
	Addr string
	// Accepted is true when guest/guest opened a connection to the broker
	// URL's virtual host from this host.
	Accepted bool
	// Node is true when the broker URL itself logs in as guest.
	Node bool
}

// Probe tries to log in to the broker of brokerURL (and its virtual
// host) as guest/guest, with tc for an amqps:// URL, within Timeout or
// ctx's deadline, and closes the connection at once. It is best effort: a
// broker that does not answer, or refuses guest, is a Check with Accepted
// false. brokerURL's own credentials are never used nor returned.
func Probe(ctx context.Context, brokerURL string, tc *tls.Config) Check {
	uri, err := amqp.ParseURI(brokerURL)
	if err != nil {
		return Check{}
	}
	c := Check{Addr: net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)), Node: uri.Username == Name}
	uri.Username, uri.Password = Name, Name
	timeout := Timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if timeout <= 0 || ctx.Err() != nil {
		return c
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("mesh guest check")
	cfg := amqp.Config{Dial: amqp.DefaultDial(timeout), Properties: props, Locale: "en_US"}
	if tc != nil {
		cfg.TLSClientConfig = tc.Clone() // amqp091-go sets its ServerName from the URL
	}
	conn, err := amqp.DialConfig(uri.String(), cfg)
	if err != nil {
		return c
	}
	_ = conn.Close()
	c.Accepted = true
	return c
}

// Warnings are what an operator should read of c, one sentence each; none
// when the broker refuses guest and the node logs in as a user of its own.
func (c Check) Warnings() []string {
	var w []string
	if c.Accepted {
		w = append(w, fmt.Sprintf("the broker at %s accepts guest/guest from this host: any local process can publish as any node and module; "+
			"delete guest or keep it to loopback and give each node a user of its own (docs/security.md)", c.Addr))
	}
	if c.Node {
		w = append(w, fmt.Sprintf("this node logs in to the broker at %s as guest: every process that can log in as guest publishes as this node, "+
			"and no identity rule can tell them apart; give the node a broker user of its own (docs/security.md)", c.Addr))
	}
	return w
}
