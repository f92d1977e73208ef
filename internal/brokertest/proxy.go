package brokertest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a local port to the broker until the
// test ends. Cut drops every connection open through it at once, as a
// network failure would, without touching the broker or other tests.
type Proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// NewProxy starts a proxy to the broker (Host) and returns it; Addr is where
// to connect instead.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", Host())
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
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

// Cut closes every connection made through the proxy so far.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
