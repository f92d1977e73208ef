package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sys/unix"
)

// network tries the network: the broker as a client of its own (with the
// URL it was given, guest's on a dev node), each of cfg.Connect over
// TCP, the broker's port over Multipath TCP and SCTP (which go around
// Landlock's TCP rules where not filtered), a UDP datagram, a listener,
// and the host's shared directories (/dev/shm, /var/tmp).
func network() {
	if cfg.AMQP != "" {
		c, err := amqp.DialConfig(cfg.AMQP, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			c.Close()
		}
		report("amqp", "", err)
		if u, perr := amqp.ParseURI(cfg.AMQP); perr == nil {
			addr := fmt.Sprintf("%s:%d", u.Host, u.Port)
			report("mptcp "+addr, "", dialProto(addr, 262)) // IPPROTO_MPTCP
			report("sctp "+addr, "", dialProto(addr, unix.IPPROTO_SCTP))
		}
	}
	for _, addr := range cfg.Connect {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
		}
		report("connect "+addr, "", err)
	}
	c, err := net.Dial("udp", "127.0.0.1:53")
	if err == nil {
		_, err = c.Write([]byte("evil"))
		c.Close()
	}
	report("udp", "", err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		l.Close()
	}
	report("listen", "", err)
	for _, dir := range []string{"/dev/shm", "/var/tmp"} {
		_, err := os.ReadDir(dir)
		report("list "+dir, "", err)
		f := filepath.Join(dir, fmt.Sprintf("evil-%d", os.Getpid()))
		err = os.WriteFile(f, []byte("x"), 0o600)
		if err == nil {
			os.Remove(f)
		}
		report("write "+dir, "", err)
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
