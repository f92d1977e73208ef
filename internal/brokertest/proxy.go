package brokertest

import (
	"crypto/tls"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a local port to the broker until the
// test ends. Cut drops every connection open through it at once, as a
// network failure would, without touching the broker or other tests.
type Proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	down  atomic.Bool
}

// NewProxy starts a proxy to the broker (Host) and returns it; Addr is where
// to connect instead.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	return NewProxyTo(t, Host())
}

// NewProxyTo starts a proxy to the broker at target (host:port), such as
// one node of a cluster.
func NewProxyTo(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	return serveProxy(t, ln, target)
}

// NewTLSProxy is a proxy that speaks TLS with cert to its clients and plain
// AMQP to the broker: a local amqps:// listener without reconfiguring
// RabbitMQ.
func NewTLSProxy(t testing.TB, cert tls.Certificate) *Proxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	return serveProxy(t, ln, Host())
}

func serveProxy(t testing.TB, ln net.Listener, target string) *Proxy {
	p := &Proxy{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.down.Load() {
				c.Close() // the broker is "unreachable"
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.down.Load() {
				// Down ran while this connection was being dialled: its
				// Cut did not see it, so refuse it here.
				p.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close(); p.forget(c, up) }()
			go func() { _, _ = io.Copy(c, up); c.Close(); p.forget(c, up) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.Cut()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// forget drops a closed pair of connections from the list.
func (p *Proxy) forget(c, up net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = slices.DeleteFunc(p.conns, func(x net.Conn) bool { return x == c || x == up })
}

// Conns is how many client connections are open through the proxy: made
// and not yet closed by either side or cut.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// Cut closes every connection made through the proxy so far.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Down cuts every connection and refuses new ones until Up, as a network
// partition between the node and the broker would.
func (p *Proxy) Down() {
	p.mu.Lock()
	p.down.Store(true)
	p.mu.Unlock()
	p.Cut()
}

// Up lets connections through again after Down.
func (p *Proxy) Up() { p.down.Store(false) }
