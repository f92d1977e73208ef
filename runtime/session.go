package runtime

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// ErrNodeTaken is returned by New, and given by Err, when another node of
// the same name holds the node lock on the mesh.
var ErrNodeTaken = errors.New("a node of this name is already running on the mesh")

// session is one pair of broker connections and what lives on them for as
// long as they do: the publisher and the node lock. Everything bound to a
// connection (module consumers, the caller's reply queue) is made on a
// session and made again on the next one; nothing survives a reconnect by
// itself (docs/adr/0009-connection-supervision.md).
type session struct {
	broker  string           // the address both connections go to, without its password
	pubConn *amqp.Connection // publishes only: broker flow control on it never stalls acks
	subConn *amqp.Connection // consumes: one channel per module
	pub     *publisher
	lock    *amqp.Channel // holds the node lock queue; nil on an ephemeral node

	lost     chan struct{} // closed when either connection is gone
	lostOnce sync.Once
	lostErr  error

	// The broker blocks the publishing connection during a memory or
	// disk alarm (connection.blocked): nothing published on it is read
	// until the alarm clears. Every publish reads these, so they are
	// atomics; setBlocked, their one writer, runs on watchBlocked.
	blocked    atomic.Bool
	blockedNow atomic.Pointer[chan struct{}] // closed while blocked; a new open one when not
}

// isBlocked reports whether the broker blocks the publishing connection.
func (s *session) isBlocked() bool { return s.blocked.Load() }

// whenBlocked returns a channel closed once the publishing connection is
// blocked (at once if it is now).
func (s *session) whenBlocked() <-chan struct{} { return *s.blockedNow.Load() }

func (s *session) setBlocked(b bool) {
	if b == s.blocked.Load() {
		return
	}
	if b {
		s.blocked.Store(true)
		close(*s.blockedNow.Load())
		return
	}
	next := make(chan struct{})
	s.blockedNow.Store(&next)
	s.blocked.Store(false)
}

// watchBlocked follows the broker's flow control on the publishing
// connection, logging each change once: while blocked, emits go to the
// spool (or fail with ErrBackPressure on a node without one) and the
// spool waits; consuming, acks and dead-letter decisions go on.
func (n *Node) watchBlocked(s *session, notes <-chan amqp.Blocking) {
	for b := range notes {
		s.setBlocked(b.Active)
		if b.Active {
			n.stats.blocks.Add(1)
			n.log.Warn("the broker blocks publishing (a memory or disk alarm): emits are spooled, consuming goes on", "reason", b.Reason)
			continue
		}
		n.log.Info("the broker publishes again (the alarm cleared)")
		n.kickDrain()
	}
}

// markLost records why the session ended and closes lost, once.
func (s *session) markLost(err error) {
	s.lostOnce.Do(func() {
		s.lostErr = err
		close(s.lost)
	})
}

func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// close closes both connections; the broker returns whatever was delivered
// on them and not acknowledged. byNode says the node is closing: publishes
// still waiting then fail with sdk.ErrClosed, not wire.ErrConnectionLost
// (which would spool them).
func (s *session) close(byNode bool) {
	s.markLost(sdk.ErrClosed)
	if s.pub != nil {
		if byNode {
			_ = s.pub.close()
		} else {
			s.pub.abandon()
		}
	}
	_ = s.pubConn.Close()
	_ = s.subConn.Close()
}

// connect connects to the broker at the first of its addresses that
// answers, starting at the node's current one (n.brokerAt): after a
// session is lost, the supervisor moves it on first. An address that does
// not answer (brokerAway) moves it on too; one that answers and refuses
// (credentials, node lock, topology) ends the try with its error, as the
// others, the same cluster, would say the same.
func (n *Node) connect(ctx context.Context) (*session, error) {
	var errs []error
	for range n.brokers {
		at := int(n.brokerAt.Load())
		s, err := n.connectTo(ctx, n.brokers[at])
		if err == nil {
			return s, nil
		}
		if !brokerAway(err) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
		n.nextBroker(at)
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("none of the broker's %d addresses answers: %w", len(n.brokers), errors.Join(errs...))
}

// nextBroker moves the node on from the address at index at to the next,
// unless another move came first.
func (n *Node) nextBroker(at int) {
	n.brokerAt.CompareAndSwap(int32(at), int32((at+1)%len(n.brokers)))
}

// brokerOrder is the order a node tries the broker's addresses in: the
// configured ones, rotated to start at a random place, so that the nodes
// of a mesh spread their connections over a cluster and each fails over
// to the address after its own.
func brokerOrder(urls []string, intN func(int) int) []string {
	k := intN(len(urls))
	return append(slices.Clone(urls[k:]), urls[:k]...)
}

// connectTo dials both connections to url, declares the topology, takes
// the node lock and opens the publisher.
func (n *Node) connectTo(ctx context.Context, url string) (*session, error) {
	s := &session{broker: redactURL(url), lost: make(chan struct{})}
	open := make(chan struct{})
	s.blockedNow.Store(&open)
	var err error
	if s.pubConn, err = dial(ctx, n.cfg, url, "publish"); err != nil {
		return nil, err
	}
	if s.subConn, err = dial(ctx, n.cfg, url, "consume"); err != nil {
		s.pubConn.Close()
		return nil, err
	}
	fail := func(err error) (*session, error) {
		s.pubConn.Close()
		s.subConn.Close()
		return nil, err
	}
	ch, err := s.pubConn.Channel()
	if err == nil {
		err = declareTopology(ch)
		if err == nil && n.delaysOn() {
			if err = declareDelays(ch, n.declaredDueQueue()); isAMQPCode(err, amqp.AccessRefused) {
				// A feature the node's broker user has no permission for
				// is off, with a warning, rather than the node down (ADR 40).
				n.featureRefused(FeatureDelays, err)
				ch.Close() // the broker closed it
				ch, err = s.pubConn.Channel()
			}
		}
		if err == nil && n.cfg.History.Stream != "" && !n.cfg.Ephemeral {
			err = declareHistory(ch, n.cfg.History)
		}
		ch.Close()
	}
	if err != nil {
		return fail(fmt.Errorf("node %s: %w", n.cfg.Node, err))
	}
	if !n.cfg.Ephemeral {
		if s.lock, err = n.takeLock(s.pubConn); err != nil {
			return fail(err)
		}
	}
	if s.pub, err = newPublisher(s.pubConn); err != nil {
		return fail(fmt.Errorf("node %s: %w", n.cfg.Node, err))
	}
	go n.watchBlocked(s, s.pubConn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	go n.watchSession(s)
	return s, nil
}

// takeLock declares the node's exclusive lock queue on conn and keeps the
// channel open: the broker deletes the queue when conn closes.
func (n *Node) takeLock(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("node %s: open lock channel: %w", n.cfg.Node, err)
	}
	queue := wire.NodeLockQueue(n.cfg.Node)
	_, err = ch.QueueDeclare(queue, false, true, true, false, amqp.Table{"x-queue-type": QueueClassic})
	if isAMQPCode(err, amqp.ResourceLocked) {
		return nil, fmt.Errorf("node %s: %w: another process holds its lock queue %s on this broker; give this node another name or stop the other one", n.cfg.Node, ErrNodeTaken, queue)
	}
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("node %s: declare lock queue %s: %w", n.cfg.Node, queue, err)
	}
	return ch, nil
}

// watchSession marks s lost when either of its connections closes, or its
// publisher's or lock's channel does (the broker closed it with an error:
// the session cannot go on without them).
func (n *Node) watchSession(s *session) {
	pubClosed := s.pubConn.NotifyClose(make(chan *amqp.Error, 1))
	subClosed := s.subConn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := s.pub.ch.NotifyClose(make(chan *amqp.Error, 1))
	var lockClosed chan *amqp.Error
	if s.lock != nil {
		lockClosed = s.lock.NotifyClose(make(chan *amqp.Error, 1))
	}
	var (
		err  *amqp.Error
		what string
	)
	select {
	case err = <-pubClosed:
		what = "publish connection"
	case err = <-subClosed:
		what = "consume connection"
	case err = <-chClosed:
		what = "publish channel"
	case err = <-lockClosed:
		what = "node lock channel"
	}
	if err == nil {
		s.markLost(sdk.ErrClosed) // closed by us
		return
	}
	s.markLost(fmt.Errorf("broker %s lost: %w", what, err))
}

// Session state of the node.

// session returns the current session, or nil while the node is
// disconnected.
func (n *Node) session() *session {
	s := n.current.Load() // lock-free: every emit asks
	if s != nil && s.isLost() {
		return nil
	}
	return s
}

// setSession makes s (nil: none) the current session and wakes whoever
// waits for one.
func (n *Node) setSession(s *session) {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	n.sess = s
	n.current.Store(s)
	if s != nil {
		close(n.sessReady)
	} else {
		select {
		case <-n.sessReady:
			n.sessReady = make(chan struct{})
		default:
		}
	}
}

// awaitSession returns the current session, waiting for the node to
// reconnect until ctx is done.
func (n *Node) awaitSession(ctx context.Context) (*session, error) {
	for {
		n.sessMu.Lock()
		s, ready := n.sess, n.sessReady
		n.sessMu.Unlock()
		if s != nil && !s.isLost() {
			return s, nil
		}
		if n.cfg.Ephemeral {
			return nil, wire.ErrConnectionLost
		}
		select {
		case <-ready:
		case <-n.closing:
			return nil, sdk.ErrClosed
		case <-n.done:
			return nil, fmt.Errorf("%w: %w", wire.ErrConnectionLost, n.doneErr)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: not reconnected yet: %w", wire.ErrConnectionLost, ctx.Err())
		case <-s.lostChan():
			// s was lost under us; the supervisor clears it shortly.
			select {
			case <-ready:
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// lostChan is s.lost, or nil (never ready) for no session.
func (s *session) lostChan() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.lost
}

// Connected reports whether the node has its broker connections now.
func (n *Node) Connected() bool { return n.session() != nil }

// supervise waits for the session to be lost, then reconnects with
// exponential back-off and jitter and brings everything back on the new
// session: module consumers and tool servers, the caller, and the resend
// of the spool. s is nil for a node that started without its broker: it
// connects first. It returns when the node closes or fails for good.
func (n *Node) supervise(s *session) {
	defer close(n.supervised)
	first := s == nil
	down := time.Now()
	for {
		if s != nil {
			select {
			case <-s.lost:
			case <-n.closing:
				return
			}
			// Counted before the session is taken away: whoever sees the
			// node not connected (/readyz) sees the disconnect counted.
			if !n.isClosing() {
				n.stats.disconnects.Add(1)
			}
			n.setSession(nil)
			s.close(false)
			if n.isClosing() {
				return
			}
			if n.cfg.Ephemeral {
				n.fail(s.lostErr)
				return
			}
			down = time.Now()
			n.nextBroker(int(n.brokerAt.Load()))
			n.log.Warn("broker connection lost; reconnecting", "broker", s.broker, "next", redactURL(n.brokers[n.brokerAt.Load()]), "err", s.lostErr)
		}
		recycled := s != nil && errors.Is(s.lostErr, errRefusingChannel)
		next, ok := n.reconnect(down)
		if !ok {
			return
		}
		if !first && !recycled {
			n.watchRefusals(next)
		}
		s = next
		n.setSession(s)
		if first {
			first = false
			n.log.Info("node connected: the broker answers", "broker", s.broker, "waited", time.Since(down).Round(time.Millisecond))
		} else {
			n.stats.reconnects.Add(1)
			n.log.Info("reconnected to the broker", "broker", s.broker, "down_for", time.Since(down).Round(time.Millisecond))
		}
		n.resume(s)
		n.followPeers(s)
		n.startMover(s)
		if h := n.hook().resumed; h != nil {
			h()
		}
		n.kickDrain()
	}
}

// errRefusingChannel ends a session whose publish channel the broker
// refuses everything on (publisher.watchRefusals).
var errRefusingChannel = errors.New("the broker refused every publish on the channel opened during the failover")

// refusingFor and refusingWithin bound the watch for a refusing channel: a
// session made by a failover that, within its first refusingWithin, has
// every publish refused for refusingFor checks whether a fresh channel is
// refused too, and if not, is made again (once per outage).
const (
	refusingFor    = 3 * time.Second
	refusingWithin = time.Minute
)

// watchRefusals makes the failover session s start again if the broker
// refuses every publish on its channel early in its life but accepts the
// same message on a fresh channel. (A queue at its length limit with
// reject-publish refuses it on any channel: that is no reason to
// reconnect.)
func (n *Node) watchRefusals(s *session) {
	began := time.Now()
	s.pub.watchRefusals(refusingFor, func(exchange, key string, msg amqp.Publishing) {
		if time.Since(began) > refusingWithin {
			return
		}
		if !acceptedOnAFreshChannel(s, exchange, key, msg) {
			return
		}
		n.log.Warn("the broker refuses every publish on this connection's channel since the failover, and accepts them on a new one; connecting again",
			"broker", s.broker, "for", refusingFor)
		n.stats.refusingChannels.Add(1)
		s.markLost(errRefusingChannel) // the supervisor closes it and connects again
	})
}

// acceptedOnAFreshChannel publishes msg again, on a channel of its own on
// s, and reports whether the broker confirmed it. The message then exists
// twice at most: its consumers' de-duplication absorbs the second copy.
func acceptedOnAFreshChannel(s *session, exchange, key string, msg amqp.Publishing) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return publishAlone(ctx, s, exchange, key, msg) == nil
}

// reconnect tries to connect until it succeeds, the node closes, or the
// node lock stays taken longer than LockWait (another node of this name
// runs: the node fails).
func (n *Node) reconnect(down time.Time) (*session, bool) {
	var lockedSince time.Time
	for attempt := 1; ; attempt++ {
		delay := jitter(expBackoff(n.cfg.ReconnectMin, n.cfg.ReconnectMax, attempt))
		select {
		case <-time.After(delay):
		case <-n.closing:
			return nil, false
		}
		ctx, cancel := context.WithTimeout(n.life, 30*time.Second)
		s, err := n.connect(ctx)
		cancel()
		if err == nil {
			if n.isClosing() {
				s.close(true)
				return nil, false
			}
			return s, true
		}
		if errors.Is(err, ErrNodeTaken) {
			if lockedSince.IsZero() {
				lockedSince = time.Now()
			}
			if time.Since(lockedSince) > n.cfg.LockWait {
				n.log.Error("giving up: the node lock stays taken", "err", err)
				n.fail(err)
				return nil, false
			}
		}
		n.log.Warn("reconnect failed; trying again", "attempt", attempt, "down_for", time.Since(down).Round(time.Millisecond), "err", err)
	}
}

// resume brings every module's consumers and tool servers back on s.
func (n *Node) resume(s *session) {
	mods, _ := n.loaded()
	for _, m := range mods {
		m.resume(s, false)
	}
}

// fail ends the node's work for good: Done closes and Err says why.
func (n *Node) fail(err error) {
	n.doneOnce.Do(func() {
		n.doneErr = err
		close(n.done)
	})
}

func (n *Node) isClosing() bool {
	select {
	case <-n.closing:
		return true
	default:
		return false
	}
}

// expBackoff is min·2^(attempt-1), capped at max.
func expBackoff(minD, maxD time.Duration, attempt int) time.Duration {
	d := minD
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	return min(d, maxD)
}

// jitter takes up to 20% off d, so that many clients reconnecting or
// retrying at once spread out.
func jitter(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// dial opens one connection to the broker at amqpURL, over TLS for
// amqps:// URLs.
func dial(ctx context.Context, cfg Config, amqpURL, role string) (*amqp.Connection, error) {
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("mesh " + cfg.Node + " " + role)
	ac := amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: props,
		Dial:       amqp.DefaultDial(timeout),
	}
	if u, err := url.Parse(amqpURL); err == nil && u.Scheme == "amqps" {
		tc, err := cfg.TLS.ClientConfig()
		if err != nil {
			return nil, err
		}
		ac.TLSClientConfig = tc
	}
	conn, err := amqp.DialConfig(amqpURL, ac)
	if err != nil {
		// amqp091-go errors do not carry the URL, so err is safe to show.
		return nil, fmt.Errorf("connect to broker %s (%s): %w%s", redactURL(amqpURL), role, err, TLSHint(err))
	}
	return conn, nil
}

// ClientConfig is the TLS configuration of an amqps:// connection: TLS
// 1.2 at least, the CA file's roots (or the system's), the client
// certificate if any. Errors name the setting (tls.ca_file).
func (t TLSConfig) ClientConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file: %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.cert_file/tls.key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// TLSHint explains a connection error caused by a broker certificate the
// client does not trust, naming the setting that fixes it; it is "" for
// any other error.
func TLSHint(err error) string {
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &hostname):
		return " (the broker's certificate is not for this host name: connect by a name it holds, or set tls.server_name: MESH_TLS_SERVER_NAME, --tls-server-name)"
	case errors.As(err, &unknown), errors.As(err, &verify):
		return " (the broker's certificate is not signed by a CA the node trusts: set tls.ca_file to the CA that signed it: MESH_TLS_CA_FILE, --tls-ca-file)"
	}
	return ""
}
