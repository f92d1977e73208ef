package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/cmd/meshctl/console"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
)

// consoleCommand is `meshctl console`: the web console, and its
// operators' tokens (meshctl console token).
func consoleCommand() *cli.Command {
	return &cli.Command{
		Name: "console",
		Usage: "serve the web console: overview, graph, audit log, dead letters and unrouted events, dispatcher, live events " +
			"(a token always: the one-time login URL it prints, an operator's token from meshctl console token add, or --token-file)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8080", EnvVars: []string{"MESH_CONSOLE_ADDR"},
				Usage: "listen on `HOST:PORT`; off loopback give --tls-cert and --tls-key, or put TLS in front"},
			consoleTokensFlag(),
			&cli.StringFlag{Name: "token-file", EnvVars: []string{"MESH_CONSOLE_TOKEN_FILE"},
				Usage: "accept the token in `FILE` (its first line, at least 16 characters), logged as token-file"},
			&cli.BoolFlag{Name: "read-only", Usage: "refuse every action (replay, purge, pause, resume), whatever the token: the pages only show"},
			&cli.StringFlag{Name: "tls-cert", EnvVars: []string{"MESH_CONSOLE_TLS_CERT"},
				Usage: "serve HTTPS with this certificate, a PEM `FILE` (with --tls-key; not --tls-cert-file, the broker's client certificate)"},
			&cli.StringFlag{Name: "tls-key", EnvVars: []string{"MESH_CONSOLE_TLS_KEY"},
				Usage: "the key of --tls-cert, a PEM `FILE`"},
			&cli.StringFlag{Name: "public-url", EnvVars: []string{"MESH_CONSOLE_PUBLIC_URL"},
				Usage: "the console's `URL` as browsers reach it through a proxy (https://console.example): it answers to that host, and takes actions from that origin"},
			&cli.StringFlag{Name: "management-url", EnvVars: []string{"MESH_MANAGEMENT_URL"},
				Usage: "the broker's management API, http(s)://HOST:PORT, for queues, rates and alarms (default: the AMQP host, port 15672; the AMQP URL's user)"},
		},
		Action:      serveConsole,
		Subcommands: []*cli.Command{consoleTokenCommand()},
	}
}

func serveConsole(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("console takes no arguments (or the subcommand token), got %q", c.Args().Slice())
	}
	addr := c.String("addr")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("--addr %q: want HOST:PORT", addr)
	}
	token, tokenName := "", ""
	if f := c.String("token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token, _, _ = strings.Cut(string(b), "\n")
		if token = strings.TrimSpace(token); len(token) < 16 {
			return usagef("--token-file %s: the token must be at least 16 characters", f)
		}
		tokenName = "token-file"
	}
	// The operators' tokens: read now, to refuse a bad file at once, then
	// at each request that carries a token (a stat, and a read when the
	// file changed), so that a token added or revoked counts without a
	// restart.
	var tokens func() ([]console.Token, error)
	tf, err := consoleTokenFile(c)
	if err != nil && c.String("tokens") != "" {
		return err
	}
	operators := 0
	if tf != nil {
		ts, err := tf.Tokens()
		if err != nil {
			return fmt.Errorf("--tokens: %w", err)
		}
		operators, tokens = len(ts), tf.Tokens
	}
	// Without a token of the operator's choosing, the console prints a
	// one-time login URL; off loopback, as before, a token too, for
	// scripts (meshctl console token add makes one of their own).
	login := token == "" && operators == 0
	printed := false
	if login && !console.IsLoopback(addr) {
		token, tokenName, printed = console.NewToken(), "printed-token", true
	}
	var tlsConfig *tls.Config
	switch cert, key := c.String("tls-cert"), c.String("tls-key"); {
	case (cert == "") != (key == ""):
		return usagef("--tls-cert and --tls-key go together")
	case cert != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	m, err := openConsoleMesh(ctx, c)
	if err != nil {
		return err
	}
	defer m.close()
	logger := slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	// The console answers to the address bound (the port of :0 too).
	var names []string // the address asked for, when it is a name (console.example:8080)
	if h, _, _ := net.SplitHostPort(addr); h != "" && net.ParseIP(h) == nil {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		names = append(names, net.JoinHostPort(h, port))
	}
	srv, err := console.New(console.Config{Mesh: m, Addr: ln.Addr().String(), Names: names, PublicURL: c.String("public-url"),
		Token: token, TokenName: tokenName, Tokens: tokens, ReadOnly: c.Bool("read-only"), Who: m.who, Logger: logger})
	if err != nil {
		ln.Close()
		return err
	}
	// Requests end with the console: the live pages' streams too.
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	defer srv.Close()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return base },
		TLSConfig: tlsConfig, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	mode := ""
	if c.Bool("read-only") {
		mode = " (read-only)"
	}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	fmt.Fprintf(c.App.Writer, "meshctl console on %s://%s/%s\n", scheme, ln.Addr(), mode)
	if printed {
		fmt.Fprintf(c.App.Writer, "token (shown once; give --token-file to choose one): %s\n", token)
	}
	if login {
		at := scheme + "://" + ln.Addr().String()
		if u := c.String("public-url"); u != "" {
			at = u
		}
		fmt.Fprintf(c.App.Writer, "log in (this URL works once, for %d minutes): %s\n", int(console.LoginCodeTTL.Minutes()), srv.LoginURL(at))
	}
	if tf != nil {
		logger.Info("console: the operators' tokens", "file", tf.Path(), "tokens", operators)
	}
	errc := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			errc <- hs.ServeTLS(ln, "", "")
			return
		}
		errc <- hs.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	cancelBase()
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(shut)
	return nil
}

// consoleMesh is the console's mesh: a node of meshctl's own, the broker
// for the keeper queues, the management API, and the heartbeats heard.
type consoleMesh struct {
	c      *cli.Context
	node   *runtime.Node
	api    *managementAPI // nil when its URL cannot be made
	apiErr error
	urls   []string
	who    string

	mu    sync.Mutex
	heard map[string]console.Node

	stop func()
	wg   sync.WaitGroup
}

var _ console.Mesh = (*consoleMesh)(nil)

func openConsoleMesh(ctx context.Context, c *cli.Context) (*consoleMesh, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	node, err := connect(cctx, c)
	if err != nil {
		return nil, err
	}
	m := &consoleMesh{c: c, node: node, urls: brokerURLs(c), heard: map[string]console.Node{}}
	m.api, m.apiErr = newManagementAPI(m.urls[0], c.String("management-url"))
	osUser := "unknown"
	if u, err := user.Current(); err == nil {
		osUser = u.Username
	}
	brokerUser := "?"
	if uri, err := amqp.ParseURI(m.urls[0]); err == nil {
		brokerUser = uri.Username
	}
	m.who = osUser + " as broker user " + brokerUser
	listen, stop := context.WithCancel(context.Background())
	m.stop = stop
	m.wg.Add(1)
	go m.listen(listen)
	return m, nil
}

// listen hears the nodes' heartbeats until ctx ends, tailing again after
// a lost connection.
func (m *consoleMesh) listen(ctx context.Context) {
	defer m.wg.Done()
	backoff := time.Second
	for ctx.Err() == nil {
		err := m.node.Tail(ctx, "node.*.heartbeat", func() { backoff = time.Second }, func(ev runtime.TailedEvent) error {
			hb, ok := heartbeatOf(ev)
			if !ok {
				return nil
			}
			m.mu.Lock()
			m.heard[hb.Node] = console.Node{Heartbeat: hb, LastSeen: time.Now()}
			m.mu.Unlock()
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			slog.Default().Debug("console: heartbeats", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (m *consoleMesh) close() {
	m.stop()
	m.wg.Wait()
	_ = m.node.Close(context.Background())
}

// Nodes are the nodes heard since the console started, by name; one
// whose heartbeats stopped stays, and the overview shows it silent.
func (m *consoleMesh) Nodes() []console.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]console.Node, 0, len(m.heard))
	for _, n := range m.heard {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b console.Node) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Graph draws the heartbeats as meshctl graph does.
func (m *consoleMesh) Graph() console.Graph {
	var beats []runtime.Heartbeat
	for _, n := range m.Nodes() {
		beats = append(beats, n.Heartbeat)
	}
	d := meshGraph(beats)
	modules := map[string]string{} // vertex id -> module name, for its link
	stale := map[string]bool{}     // module vertex labels of nodes not heard for three heartbeats
	for _, n := range m.Nodes() {
		silent := n.Interval > 0 && time.Since(n.LastSeen) > 3*n.Interval
		for _, mod := range n.Modules {
			modules[moduleLabel(n.Node, mod)] = mod.Name
			stale[moduleLabel(n.Node, mod)] = silent
		}
	}
	var g console.Graph
	for _, v := range d.vertices {
		cv := console.Vertex{ID: v.id, Kind: v.kind, Label: v.label}
		switch v.kind {
		case vModule:
			cv.Link = "/audit?source=" + neturl.QueryEscape(modules[v.label])
			cv.Stale = stale[v.label]
		case vEvent:
			cv.Link = "/audit?type=" + neturl.QueryEscape(v.name)
		case vQueue:
			if v.label == wire.QueueDead {
				cv.Link = "/dlq"
			}
		}
		g.Vertices = append(g.Vertices, cv)
	}
	for _, e := range d.edges {
		g.Edges = append(g.Edges, console.Edge{From: e.from, To: e.to, Label: e.label, Dashed: e.dashed})
	}
	return g
}

// Broker reads the broker's state from the node and the management API.
func (m *consoleMesh) Broker(ctx context.Context) console.Broker {
	b := console.Broker{Connected: m.node.Connected(), URL: redactURL(m.urls[0])}
	if m.api == nil {
		b.Management = m.apiErr.Error()
		return b
	}
	alarms, version, err := m.api.alarms(ctx)
	if err != nil {
		b.Management = err.Error() + "; enable it (rabbitmq-plugins enable rabbitmq_management) or give --management-url"
		return b
	}
	b.Alarms, b.Version = alarms, version
	qs, err := m.api.queues(ctx)
	if err != nil {
		b.Management = err.Error()
		return b
	}
	now := time.Now()
	for _, q := range qs {
		cq := console.Queue{Name: q.Name, Type: q.Type, Ready: q.Ready, Unacked: q.Unacked, Consumers: q.Consumers,
			In: q.MessageStats.Publish.Rate, Out: q.MessageStats.DeliverGet.Rate, Redelivered: q.MessageStats.Redeliver.Rate}
		if ts := q.HeadMessageTimestamp; ts != nil && *ts > 0 && q.Ready > 0 {
			cq.Oldest = max(now.Sub(time.Unix(*ts, 0)), time.Second)
		}
		b.Queues = append(b.Queues, cq)
		if strings.HasSuffix(q.Name, ".events") {
			b.Rates.Handled += q.MessageStats.Ack.Rate
			b.Rates.Failed += q.MessageStats.Redeliver.Rate
		}
	}
	b.Rates.Emitted, _ = m.api.exchangeIn(ctx, wire.ExchangeEvents)
	b.Rates.DeadLettered, _ = m.api.exchangeIn(ctx, wire.ExchangeDead)
	return b
}

func (m *consoleMesh) AuditQuery(ctx context.Context, req auditlogger.QueryRequest) (auditlogger.QueryResponse, error) {
	var resp auditlogger.QueryResponse
	if err := m.node.Call(ctx, "meshctl", auditlogger.ToolQuery, req, &resp); err != nil {
		return resp, auditErr(err)
	}
	return resp, nil
}

func (m *consoleMesh) AuditGet(ctx context.Context, id string) (store.Event, error) {
	var ev store.Event
	err := m.node.Call(ctx, "meshctl", auditlogger.ToolGet, id, &ev)
	return ev, err
}

func (m *consoleMesh) AuditTrace(ctx context.Context, id string, depth int) (store.Trace, error) {
	var tr store.Trace
	err := m.node.Call(ctx, "meshctl", auditlogger.ToolTrace, auditlogger.TraceRequest{ID: id, MaxDepth: depth}, &tr)
	return tr, err
}

// withBroker runs f on a connection of its own to the first broker that
// answers: a browse or a replay holds a channel for its length, and a
// connection lost in one does not touch the others.
func (m *consoleMesh) withBroker(ctx context.Context, f func(*amqp.Connection) error) error {
	conn, _, err := dialBroker(m.c, "meshctl console")
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(conn)
}

// Kept lists a keeper queue's messages, keeping of each what q says
// (summaries for a page of groups, a bounded part of a body for one
// message's page), so that a page holds no body it does not show.
func (m *consoleMesh) Kept(ctx context.Context, queue string, q console.KeptQuery) (out []deadletters.Message, err error) {
	err = m.withBroker(ctx, func(conn *amqp.Connection) error {
		out, err = deadletters.List(ctx, conn, queue, q.Filter, q.Options()...)
		return err
	})
	return out, err
}

func (m *consoleMesh) Replay(ctx context.Context, queue string, f deadletters.Filter, progress func(done, total int)) (res deadletters.Result, err error) {
	err = m.withBroker(ctx, func(conn *amqp.Connection) error {
		res, err = deadletters.Replay(ctx, conn, queue, f, deadletters.WithProgress(progress))
		return err
	})
	if len(res.Sent) > 0 {
		// What was sent is told even when the replay was stopped.
		tell, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, rerr := recordReplayed(tell, m.node, res.Sent)
		err = errors.Join(err, rerr)
	}
	return res, err
}

func (m *consoleMesh) Purge(ctx context.Context, queue string, f deadletters.Filter, progress func(done, total int)) (res deadletters.Result, err error) {
	err = m.withBroker(ctx, func(conn *amqp.Connection) error {
		res, err = deadletters.Purge(ctx, conn, queue, f, deadletters.WithProgress(progress))
		return err
	})
	return res, err
}

func (m *consoleMesh) Triggers(ctx context.Context) ([]dispatcher.TriggerState, error) {
	var r dispatcher.TriggersResponse
	if err := m.node.Call(ctx, "meshctl", dispatcher.ToolTriggers, nil, &r); err != nil {
		return nil, dispatcherErr(err)
	}
	return r.Triggers, nil
}

func (m *consoleMesh) Fires(ctx context.Context, req dispatcher.FiresRequest) (dispatcher.FiresResponse, error) {
	var r dispatcher.FiresResponse
	if err := m.node.Call(ctx, "meshctl", dispatcher.ToolFires, req, &r); err != nil {
		return r, dispatcherErr(err)
	}
	return r, nil
}

func (m *consoleMesh) Pause(ctx context.Context, trigger string, pause bool) (dispatcher.PauseResponse, error) {
	tool := dispatcher.ToolResume
	if pause {
		tool = dispatcher.ToolPause
	}
	var r dispatcher.PauseResponse
	if err := m.node.Call(ctx, "meshctl", tool, dispatcher.PauseRequest{Trigger: trigger}, &r); err != nil {
		return r, dispatcherErr(err)
	}
	return r, nil
}

func (m *consoleMesh) Tail(ctx context.Context, pattern string, ready func(), fn func(runtime.TailedEvent) error) error {
	return m.node.Tail(ctx, pattern, ready, fn)
}

// consoleActionType is the event an action taken from the console is
// recorded as, for the audit log.
const consoleActionType = "mesh.console.action"

func (m *consoleMesh) Record(ctx context.Context, a console.Action) error {
	if _, err := m.node.Emit(ctx, "meshctl", consoleActionType, a); err != nil {
		return fmt.Errorf("record the action as %s: %w", consoleActionType, err)
	}
	return nil
}
