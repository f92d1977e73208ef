package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

func app() *cli.App {
	return &cli.App{
		Name:    "meshd",
		Usage:   "run a mesh node",
		Version: runtime.Build().Line(),
		Commands: []*cli.Command{versionCommand(), {
			Name:  "run",
			Usage: "start a node and its modules, and run until SIGTERM or SIGINT",
			Description: "Settings come from the --config file, then the MESH_* environment variables, then the flags;\n" +
				"each overrides the one before.",
			Flags:  runFlags(),
			Action: run,
		}, {
			Name:  "config",
			Usage: "check a configuration, or print the configuration reference",
			Subcommands: []*cli.Command{{
				Name:   "check",
				Usage:  "validate the configuration run would use (file, environment and flags), then start each module's binary far enough to describe itself (as run starts it, without joining the mesh) and hold it to its entry (module protocol, name, grants); exit 0, or name every problem with its fix and exit 1",
				Flags:  append(runFlags(), &cli.BoolFlag{Name: "skip-binaries", Usage: "validate the configuration only, without starting the module binaries"}),
				Action: configCheck,
			}, {
				Name:  "reference",
				Usage: "print every setting with its environment variable, flag, default and bounds, in Markdown (docs/config.md)",
				Action: func(c *cli.Context) error {
					return nodeconfig.WriteReference(c.App.Writer)
				},
			}},
		}},
	}
}

// runFlags are run's flags, which config check takes too. Each is a
// setting of nodeconfig.Settings, with its environment variable.
func runFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: []string{"MESH_CONFIG"}, Usage: "the node's configuration `FILE` (mesh.yaml)"},
		&cli.StringFlag{Name: "node", EnvVars: []string{"MESH_NODE"}, Usage: "this node's `NAME`, unique on the mesh"},
		&cli.StringFlag{Name: "amqp-url", EnvVars: []string{"MESH_AMQP_URL"}, Usage: "the broker's `URL` (default " + runtime.DefaultAMQPURL + ")"},
		&cli.StringFlag{Name: "amqp-password-file", EnvVars: []string{"MESH_AMQP_PASSWORD_FILE"}, Usage: "a `FILE` holding the broker user's password, set into every broker URL (keeps it out of argv and the environment)"},
		&cli.StringSliceFlag{Name: "amqp-urls", EnvVars: []string{"MESH_AMQP_URLS"}, Usage: "more of the broker's `URLS` (the nodes of a cluster; comma-separated or repeated)"},
		&cli.StringFlag{Name: "state-dir", EnvVars: []string{"MESH_STATE_DIR"}, Usage: "node-local state `DIR` (default ~/.local/state/mesh/NODE)"},
		&cli.StringFlag{Name: "http-addr", EnvVars: []string{"MESH_HTTP_ADDR"}, Usage: "serve /healthz, /readyz and /metrics on `HOST:PORT` (default off; :PORT is 127.0.0.1:PORT)"},
		&cli.StringFlag{Name: "log-level", EnvVars: []string{"MESH_LOG_LEVEL"}, Value: "info", Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "tls-ca-file", EnvVars: []string{"MESH_TLS_CA_FILE"}, Usage: "the PEM `FILE` of the CA that signed the broker's certificate (amqps://)"},
		&cli.StringFlag{Name: "tls-cert-file", EnvVars: []string{"MESH_TLS_CERT_FILE"}, Usage: "the node's client certificate, a PEM `FILE`"},
		&cli.StringFlag{Name: "tls-key-file", EnvVars: []string{"MESH_TLS_KEY_FILE"}, Usage: "the client certificate's key, a PEM `FILE`"},
		&cli.StringFlag{Name: "tls-server-name", EnvVars: []string{"MESH_TLS_SERVER_NAME"}, Usage: "the `NAME` checked in the broker's certificate (default the URL's host)"},
		&cli.DurationFlag{Name: "grace", EnvVars: []string{"MESH_GRACE"}, Usage: "how long in-flight handlers may finish on stop (default " + nodeconfig.DefaultGrace.String() + ")"},
	}
}

// config layers the file, the environment and the flags, and validates the
// result.
func config(c *cli.Context) (nodeconfig.File, error) {
	var f nodeconfig.File
	if path := c.String("config"); path != "" {
		var err error
		if f, err = nodeconfig.Load(path); err != nil {
			return f, err
		}
	}
	// IsSet is true for a flag given on the command line or through its
	// environment variable, which urfave/cli already ranks above each other.
	if c.IsSet("node") {
		f.Node = c.String("node")
	}
	if c.IsSet("amqp-url") {
		f.AMQPURL = c.String("amqp-url")
	}
	if c.IsSet("amqp-urls") {
		f.AMQPURLs = c.StringSlice("amqp-urls")
	}
	if c.IsSet("amqp-password-file") {
		f.AMQPPasswordFile = c.String("amqp-password-file")
	}
	if err := f.ApplyPasswordFile(); err != nil {
		return f, fmt.Errorf("config: %w", err)
	}
	if c.IsSet("state-dir") {
		f.StateDir = c.String("state-dir")
	}
	if c.IsSet("http-addr") {
		f.HTTPAddr = c.String("http-addr")
	}
	for flag, field := range map[string]*string{"tls-ca-file": &f.TLS.CAFile, "tls-cert-file": &f.TLS.CertFile, "tls-key-file": &f.TLS.KeyFile, "tls-server-name": &f.TLS.ServerName} {
		if c.IsSet(flag) {
			*field = c.String(flag)
		}
	}
	if c.IsSet("grace") {
		f.Grace = c.Duration("grace")
	}
	if f.Grace == 0 {
		f.Grace = nodeconfig.DefaultGrace
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("config: %w", err)
	}
	return f, nil
}

// readableDuration is the log handler's ReplaceAttr: a duration is logged
// as Go writes it ("1.5s", "100ms"), as the config takes it, where the
// JSON handler writes nanoseconds (1500000000).
func readableDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

func run(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: readableDuration}))
	f, err := config(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg := f.Runtime()
	cfg.Logger = log
	meters, metricsHandler, err := metricsProvider(f.Node)
	if err != nil {
		return err
	}
	defer meters.Shutdown(context.Background())
	cfg.MeterProvider = meters
	tracers, err := tracerProvider(ctx, f.Node)
	if err != nil {
		return err
	}
	if tracers != nil {
		defer func() {
			// The last spans go out, within a few seconds at most.
			flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tracers.Shutdown(flush)
		}()
		cfg.TracerProvider = tracers
		log.Info("exporting traces with OTLP")
	}
	cfg.StartWithoutBroker = true // no ordering after the broker: it connects when the broker answers
	node, err := runtime.New(ctx, cfg)
	if err != nil {
		return err
	}
	// shutdown is bounded by the grace period: the announcement gets at
	// most a few seconds of it (a broker refusing it must not eat the
	// handlers' time), the modules the rest, at once; a handler that
	// ignores its cancelled context is left behind (runtime.Node.Close).
	shutdown := func() error {
		start := time.Now()
		annCtx, cancelAnn := context.WithTimeout(context.Background(), min(5*time.Second, f.Grace/4))
		if _, err := node.Emit(annCtx, node.Name(), "node."+node.Name()+".left", map[string]any{}); err != nil {
			log.Warn("could not announce the node leaving", "err", err)
		}
		cancelAnn()
		graceCtx, cancelGrace := context.WithTimeout(context.Background(), max(f.Grace-time.Since(start), time.Second))
		defer cancelGrace()
		return node.Close(graceCtx)
	}
	ready := &readiness{node: node}
	ready.loading.Store(true)
	if f.HTTPAddr != "" {
		srv, err := serveHealth(f.HTTPAddr, ready, metricsHandler, log)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		defer srv.Close()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	iso, err := newIsolation(f, node.StateDir(), c.String("config"))
	if err != nil {
		return errors.Join(err, shutdown())
	}
	defer iso.close()
	start, err := newStarter(node, iso, ready, log, meters)
	if err != nil {
		return errors.Join(err, shutdown())
	}
	running := map[string]*loaded{}
	node.SetModules(moduleNames(f)) // a due schedule of a module gone from the config is dropped
	for i, m := range f.Modules {
		l, err := start.start(ctx, i, m)
		if err != nil {
			return errors.Join(err, shutdown())
		}
		if l != nil {
			running[m.Name] = l
		}
	}
	ready.loading.Store(false)
	logProtections(log, iso, c.String("config"), running)
	warnModuleUsersAtStart(log, f)
	warnGuest(ctx, log, f)
	if _, err := node.Emit(ctx, node.Name(), "node."+node.Name()+".joined", map[string]any{"modules": len(f.Modules)}); err != nil {
		log.Warn("could not announce the node", "err", err)
	}
	log.Info("node running; SIGTERM or SIGINT stops it, SIGHUP reloads the modules' config", "modules", len(f.Modules))
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-hup:
			if err := reload(ctx, c, f, start, running, log); err != nil {
				_ = shutdown()
				return err
			}
		case <-start.due():
			if err := start.retry(ctx, running); err != nil && ctx.Err() == nil {
				_ = shutdown()
				return err
			}
		case <-node.Done():
			// The node cannot go on (another node took its name while it was
			// reconnecting): exit non-zero; unacked deliveries return to their
			// queues and the spool keeps what was not confirmed.
			_ = node.Close(context.Background())
			return node.Err()
		}
	}
	if err := shutdown(); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	log.Info("node stopped")
	return nil
}

// loaded is a module meshd runs, with the config entry it was loaded
// from and how it is isolated.
type loaded struct {
	entry nodeconfig.Module
	pm    *runtime.PluginModule
	how   how
}

// stopNow stops a module meshd will not run after all.
func stopNow(pm *runtime.PluginModule) error {
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pm.Stop(stopCtx)
}

// reload reads the config again (SIGHUP) and applies what changed in its
// modules: a module removed is stopped, one added is started, and one
// whose entry changed (its settings, say the dispatcher's triggers) is
// stopped and started again; a module that had not started is tried
// again at once (its binary may have been replaced). A stop lets the
// handlers in flight finish within the grace period and returns what was
// not finished to the queues, so no work is lost. A config that does not
// validate changes nothing. Node settings (name, broker, state dir...)
// need a restart. Its error is a required module that did not start:
// meshd then exits.
func reload(ctx context.Context, c *cli.Context, was nodeconfig.File, start *starter, running map[string]*loaded, log *slog.Logger) error {
	f, err := config(c)
	if err != nil {
		log.Error("reload: the config does not validate; nothing changed", "err", err)
		return nil
	}
	if !reflect.DeepEqual(f.Runtime(), was.Runtime()) {
		log.Warn("reload: the node's own settings changed; they apply when meshd restarts")
	}
	start.node.SetModules(moduleNames(f))
	stop := func(name string) {
		stopCtx, cancel := context.WithTimeout(context.Background(), was.Grace+5*time.Second)
		defer cancel()
		if err := running[name].pm.Stop(stopCtx); err != nil {
			log.Warn("reload: stopping a module", "module", name, "err", err)
		}
		delete(running, name)
	}
	want := map[string]bool{}
	var stopped, started int
	for i, m := range f.Modules {
		want[m.Name] = true
		var previous *nodeconfig.Module
		if l, ok := running[m.Name]; ok {
			if reflect.DeepEqual(l.entry, m) && l.pm.Refused() == nil {
				continue // unchanged, and running (a refused one starts again: its binary changed)
			}
			previous = &l.entry
			stop(m.Name)
			stopped++
		}
		l, err := loadWith(ctx, start.node, start.iso, i, m)
		if err != nil && previous != nil {
			// The new entry is refused (say, a queue argument the broker
			// cannot change): the module runs as it did, rather than not at
			// all; the next reload tries the new entry again.
			log.Error("reload: a module did not start with its new entry; starting it with the one it ran with", "module", m.Name, "err", err)
			m = *previous
			l, err = loadWith(ctx, start.node, start.iso, i, m)
		}
		switch {
		case err == nil:
			start.started(m.Name)
			running[m.Name] = l
			started++
		case ctx.Err() != nil:
			return nil // meshd is stopping
		case m.Required:
			return fmt.Errorf("reload: module %s (required: true) did not start: %w", m.Name, err)
		default:
			// The config's entry is what the back-off tries, not the one
			// it fell back to: the operator fixes the entry they wrote.
			start.failed(ctx, i, f.Modules[i], err)
		}
	}
	for name := range running {
		if !want[name] {
			stop(name)
			stopped++
		}
	}
	start.forgetAllBut(want)
	log.Info("config reloaded", "stopped", stopped, "started", started, "running", len(running), "not_running", len(start.pending))
	return nil
}

// serveHealth answers /healthz (the process runs), /readyz (readiness.check:
// every module of the config started, connected, not blocked, every module
// consuming) and /metrics (its OpenTelemetry metrics, for
// Prometheus) on addr, read by listenAddr: an address without a host
// (":9464") is loopback's.
func serveHealth(addr string, ready *readiness, metrics http.Handler, log *slog.Logger) (*http.Server, error) {
	addr, err := listenAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("http_addr: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http_addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready.check(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server stopped", "err", err)
		}
	}()
	log.Info("serving /healthz and /readyz", "addr", ln.Addr().String())
	return srv, nil
}

// listenAddr is the address to listen on for http_addr addr: addr itself,
// except that an empty host means 127.0.0.1 rather than every interface,
// as net.Listen would read it. /metrics and /readyz tell whoever reaches
// them about the node's modules and queues, so listening beyond the host
// must be asked for by name: 0.0.0.0:PORT, [::]:PORT or an interface's
// address.
func listenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// readiness is what /readyz answers: meshd's own state (the modules of its
// config still loading, or modules that did not start) before the node's
// (runtime.Node.Ready).
type readiness struct {
	node    *runtime.Node
	loading atomic.Bool
	mu      sync.Mutex
	failed  map[string]error // modules of the config that did not start, by name, with why
}

// notStarted records that module name did not start (err), or that it
// runs (nil).
func (r *readiness) notStarted(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.failed, name)
		return
	}
	if r.failed == nil {
		r.failed = map[string]error{}
	}
	r.failed[name] = err
}

// failedCount is how many modules of the config did not start.
func (r *readiness) failedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failed)
}

// forgetAllBut forgets the failures of modules the config no longer has.
func (r *readiness) forgetAllBut(want map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.failed {
		if !want[name] {
			delete(r.failed, name)
		}
	}
}

// check is nil when the node is ready, or says what it is missing: a
// module that did not start is named with why.
func (r *readiness) check() error {
	if r.loading.Load() {
		return errors.New("loading the modules")
	}
	r.mu.Lock()
	names := make([]string, 0, len(r.failed))
	for name := range r.failed {
		names = append(names, name)
	}
	slices.Sort(names)
	whys := make([]string, 0, len(names))
	for _, name := range names {
		whys = append(whys, name+": "+r.failed[name].Error())
	}
	r.mu.Unlock()
	if len(names) > 0 {
		return fmt.Errorf("modules not running: %s (tried again with back-off; see the log and node.*.module.failed): %s",
			strings.Join(names, ", "), strings.Join(whys, "; "))
	}
	if r.node == nil {
		return nil
	}
	return r.node.Ready()
}

// moduleNames are the names of f's modules.
func moduleNames(f nodeconfig.File) []string {
	names := make([]string, 0, len(f.Modules))
	for _, m := range f.Modules {
		names = append(names, m.Name)
	}
	return names
}
