package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/cmd/meshctl/console"
	"github.com/meshkit/mesh/examples/notifier"
	"github.com/meshkit/mesh/examples/umami"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// The console's browser tests: meshctl console (the built binary) against
// a node running the example modules, an audit logger and a dispatcher on
// a real broker, driven in Debian's headless Chromium.

// consoleMesh is the mesh a console test looks at.
type consoleWorld struct {
	url     string
	node    *runtime.Node
	log     *auditlogger.Logger
	conn    *amqp.Connection
	ledger  chan string  // ids the ledger module handled
	broken  *atomic.Bool // the ledger refuses every event while set
	archive chan string  // ids of the archive's record.archived events
}

// newConsoleWorld starts a node with umami, notifier, an archive module
// (a third level of causes: site.created → notification.sent →
// record.archived), a ledger that dead-letters while broken, an audit
// logger taking dead letters, and a dispatcher with a queue trigger.
func newConsoleWorld(t *testing.T, ctx context.Context) *consoleWorld {
	t.Helper()
	w := &consoleWorld{url: brokertest.VHost(t), ledger: make(chan string, 100), broken: &atomic.Bool{}, archive: make(chan string, 100)}
	w.broken.Store(true)
	var err error
	w.node, err = runtime.New(ctx, runtime.Config{Node: "anchor", AMQPURL: w.url, StateDir: t.TempDir(), HeartbeatInterval: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.node.Close(context.Background()) })
	if w.conn, err = amqp.Dial(w.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.conn.Close() })
	ch, err := w.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare("legacy.orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if w.log, err = auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.log.Close() })
	d, err := dispatcher.Open(dispatcher.Config{Store: filepath.Join(t.TempDir(), "fires.db"),
		Triggers: []dispatcher.Trigger{{Name: "orders", Queue: "legacy.orders", Tool: "invoice.issue"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	load := func(def sdk.Module, mc runtime.ModuleConfig) {
		t.Helper()
		m, err := w.node.Load(ctx, def, mc)
		if err != nil {
			t.Fatalf("load %s: %v", def.Name, err)
		}
		t.Cleanup(func() { m.Stop(context.Background()) })
	}
	load(w.log.Module(), runtime.ModuleConfig{Concurrency: 16, Prefetch: 16})
	load(sdk.Module{Name: "invoicer", Setup: func(m sdk.Mesh) error {
		return m.Serve("invoice.issue", sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return "issued", nil }))
	}}, runtime.ModuleConfig{})
	load(d.Module(), runtime.ModuleConfig{})
	load(notifier.Module(nil), runtime.ModuleConfig{})
	load(sdk.Module{Name: "archive", Emits: []string{"record.archived"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.notifier.notification.sent", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			id, err := m.Emit(ctx, "record.archived", map[string]string{"of": ev.ID})
			if err == nil {
				w.archive <- id
			}
			return err
		}))
	}}, runtime.ModuleConfig{})
	load(sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.ledger.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if w.broken.Load() {
				return sdk.Permanent(errors.New("the ledger is closed"))
			}
			w.ledger <- ev.ID
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 1})
	load(umami.Module(time.Hour), runtime.ModuleConfig{}) // declared; the test emits its first site itself
	return w
}

// waitFor polls cond (on the broker or the audit log) until it holds.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-tick.C:
		}
	}
}

// queue reads a queue's depth and consumers with a passive declare.
func (w *consoleWorld) queue(t *testing.T, name string) amqp.Queue {
	t.Helper()
	ch, err := w.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", name, err)
	}
	return q
}

// audited waits until the audit logger holds n events of f.
func (w *consoleWorld) audited(t *testing.T, ctx context.Context, f store.Filter, n int64) {
	t.Helper()
	waitFor(t, ctx, fmt.Sprintf("%d audited events of %+v", n, f), func() bool {
		got, _ := w.log.Store().Count(ctx, f)
		return got >= n
	})
}

// runningConsole is a meshctl console process.
type runningConsole struct {
	base     string // http://127.0.0.1:PORT (https:// with --tls-cert)
	token    string // printed at start off loopback, when given none
	loginURL string // printed at start, when given no token
	tokens   string // its operators' tokens file (--tokens, or MESH_CONSOLE_TOKENS)
	stderr   *syncBuffer
	client   *http.Client // follows no redirect; trusts --tls-cert's CA when given one
}

// do sends a request to the console with the headers h (bearer: a token
// for Authorization: Bearer, or "" for none).
func (rc *runningConsole) do(t *testing.T, method, path, bearer, body string, h map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, rc.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := rc.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startConsole runs `meshctl console` with args, and waits for the lines
// that say where it listens, and the token and login URL it prints. Its
// operators' tokens file is --tokens when args give it, else a file of
// the test's own (MESH_CONSOLE_TOKENS, empty): never the user's.
func startConsole(t *testing.T, ctx context.Context, bin, amqpURL string, args ...string) *runningConsole {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--amqp-url", amqpURL, "console"}, args...)...)
	rc := &runningConsole{stderr: &syncBuffer{}, tokens: argValue(args, "--tokens"),
		client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if rc.tokens == "" {
		rc.tokens = filepath.Join(t.TempDir(), "console-tokens")
	}
	cmd.Env = append(os.Environ(), "MESH_CONSOLE_TOKENS="+rc.tokens)
	operators, err := console.OpenTokenFile(rc.tokens).Tokens()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = rc.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("meshctl console %v said:\n%s", args, rc.stderr)
		}
	})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("meshctl console ended: %s", rc.stderr)
			}
			return l
		case <-ctx.Done():
			t.Fatalf("meshctl console never said where it listens: %s", rc.stderr)
		}
		return ""
	}
	scheme := "http"
	if hasArg(args, "--tls-cert") {
		scheme = "https"
	}
	first := next()
	addr, ok := strings.CutPrefix(first, "meshctl console on "+scheme+"://")
	if !ok {
		t.Fatalf("first line %q", first)
	}
	addr, _, _ = strings.Cut(addr, "/")
	_, port, _ := strings.Cut(addr[strings.LastIndex(addr, ":"):], ":")
	rc.base = scheme + "://127.0.0.1:" + port
	chosen := hasArg(args, "--token-file") || len(operators) > 0 // a token of the operator's choosing: none printed
	if !consoleIsLoopback(addr) && !chosen {
		tok, ok := strings.CutPrefix(next(), "token (shown once; give --token-file to choose one): ")
		if !ok {
			t.Fatal("no token printed off loopback")
		}
		rc.token = tok
	}
	if !chosen {
		l := next()
		_, u, ok := strings.Cut(l, "): ")
		if !ok || !strings.HasPrefix(l, "log in (this URL works once, for 10 minutes): ") {
			t.Fatalf("no login URL printed: %q", l)
		}
		rc.loginURL = u
	}
	return rc
}

// argValue is the value of the flag a in args, or "".
func argValue(args []string, a string) string {
	for i, x := range args {
		if x == a && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func consoleIsLoopback(addr string) bool {
	return strings.HasPrefix(addr, "127.") || strings.HasPrefix(addr, "[::1]")
}

func hasArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

// browser is a headless Chromium tab that collects every error the page
// reports: exceptions, console.error, and the browser's own log errors
// (a resource that failed, a Content-Security-Policy violation).
type browser struct {
	ctx  context.Context
	base string // the console's address
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T, ctx context.Context) *browser {
	t.Helper()
	path := os.Getenv("MESH_CHROMIUM")
	if path == "" {
		for _, b := range []string{"chromium", "chromium-browser"} {
			if p, err := exec.LookPath(b); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Fatal("the console's browser tests need Chromium: scripts/ensure-chromium.sh installs Debian's (make test runs it)")
	}
	// Not t.TempDir: Chromium's last helper processes may still write to
	// its profile as the test's cleanup removes it.
	profile, err := os.MkdirTemp("", "mesh-console-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(profile), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1400, 1000))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA() // waits for the browser process to end
		for range 10 {
			if os.RemoveAll(profile) == nil {
				break
			}
		}
	})
	b := &browser{ctx: bctx}
	chromedp.ListenTarget(bctx, func(ev any) {
		var msg string
		switch e := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			msg = "exception: " + e.ExceptionDetails.Error()
		case *cdpruntime.EventConsoleAPICalled:
			if e.Type == cdpruntime.APITypeError {
				msg = "console.error"
				for _, a := range e.Args {
					msg += " " + string(a.Value)
				}
			}
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.LevelError {
				msg = "log: " + e.Entry.Text + " " + e.Entry.URL
			}
		}
		if msg != "" {
			b.mu.Lock()
			b.errs = append(b.errs, msg)
			b.mu.Unlock()
		}
	})
	if err := chromedp.Run(bctx, cdplog.Enable(), cdpruntime.Enable()); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// run runs actions in the tab, failing the test on an error.
func (b *browser) run(t *testing.T, actions ...chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		var loc, html string
		dump, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		_ = chromedp.Run(dump, chromedp.Location(&loc), chromedp.OuterHTML("html", &html, chromedp.ByQuery))
		if len(html) > 4000 {
			html = html[:4000] + "…"
		}
		t.Fatalf("browser: %v\nat %s:\n%s\nerrors: %v", err, loc, html, b.takeErrors())
	}
}

// navigatedBy runs action, which makes the tab load a page, and waits
// for that page's response.
func (b *browser) navigatedBy(t *testing.T, action chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, action)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("browser: %s answered %d", resp.URL, resp.Status)
	}
}

// takeErrors returns and forgets the errors reported so far.
func (b *browser) takeErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errs
	b.errs = nil
	return e
}

// text is the text of the first node sel matches.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	var s string
	b.run(t, chromedp.Text(sel, &s, chromedp.ByQuery))
	return s
}

// eval evaluates js into out.
func (b *browser) eval(t *testing.T, js string, out any) {
	t.Helper()
	b.run(t, chromedp.Evaluate(js, out))
}

// rowIDs are the data-id attributes of the rows of the table sel.
func (b *browser) rowIDs(t *testing.T, sel string) []string {
	t.Helper()
	var ids []string
	b.eval(t, `Array.from(document.querySelectorAll(`+jsString(sel+" tbody tr")+`)).map(r => r.dataset.id)`, &ids)
	return ids
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestConsole is the console in a browser: every page renders without an
// error; the audit search finds an event by each filter; the trace page
// shows a three-level chain in order; a dead-letter group replayed from
// the page is handled (checked on the broker); a trigger paused and
// resumed from the page (checked on the broker); the live page shows an
// event emitted after it opened; an action without the CSRF token is
// refused.
func TestConsole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := build(t)
	w := newConsoleWorld(t, ctx)

	// What the pages will show: a three-level chain, three dead letters,
	// an unrouted event, a malformed event, a dispatcher firing.
	site, err := w.node.Emit(ctx, "umami", "module.umami.site.created", map[string]any{"id": 1, "name": "one.example"}, sdk.WithSchema("1"))
	if err != nil {
		t.Fatal(err)
	}
	var archived string
	select {
	case archived = <-w.archive:
	case <-ctx.Done():
		t.Fatal("the chain never reached the archive")
	}
	var dead []string
	for i := range 3 {
		id, err := w.node.Emit(ctx, "books", "mesh.ledger.entry", map[string]int{"entry": i})
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, id)
	}
	waitFor(t, ctx, "three dead letters", func() bool { return w.queue(t, wire.QueueDead).Messages == 3 })
	if _, err := w.node.Emit(ctx, "books", "mesh.nobody.listens", map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	raw, err := w.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.PublishWithContext(ctx, wire.ExchangeEvents, "mesh.raw.thing", false, false, amqp.Publishing{Body: []byte("not json")}); err != nil {
		t.Fatal(err)
	}
	if err := raw.PublishWithContext(ctx, "", "legacy.orders", false, false, amqp.Publishing{MessageId: "order-1", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	w.audited(t, ctx, store.Filter{IDs: []string{archived}}, 1)
	w.audited(t, ctx, store.Filter{Types: []string{"mesh.raw.thing"}}, 1)
	w.audited(t, ctx, store.Filter{Types: []string{"mesh.ledger.entry"}, Dead: ptr(true)}, 3)
	w.audited(t, ctx, store.Filter{Types: []string{"module.dispatcher.fired"}}, 1)
	var notified string
	{
		evs, _, err := w.log.Store().Query(ctx, store.Filter{CausationIDs: []string{site}}, store.Page{Limit: 10})
		if err != nil || len(evs) != 1 {
			t.Fatalf("the notification of the site: %+v, %v", evs, err)
		}
		notified = evs[0].ID
	}

	// A group that keeps order by key, for the groups page.
	tally, err := w.node.Load(ctx, sdk.Module{Name: "tally", Setup: func(m sdk.Mesh) error {
		return m.On("mesh.tally.#", sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil }))
	}}, runtime.ModuleConfig{Group: "counts", Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer tally.Stop(context.Background())

	// The operator's token, made as an operator makes one; the browser
	// logs in with it, the test's requests send it as a bearer token.
	tokens := filepath.Join(t.TempDir(), "console-tokens")
	stdout, _ := want(t, bin, w.url, 0, []string{"console", "token", "add", "tester", "--tokens", tokens})
	token := strings.TrimSpace(stdout)
	c := startConsole(t, ctx, bin, w.url, "--addr", "127.0.0.1:0", "--tokens", tokens)
	b := newBrowser(t, ctx)
	b.base = c.base
	b.login(t, token)
	// The console hears the node's heartbeat (every second here).
	waitFor(t, ctx, "the console to hear the node", func() bool {
		_, body := c.do(t, http.MethodGet, "/graph?format=json", token, "", nil)
		return strings.Contains(body, "anchor/archive")
	})

	t.Run("every page renders without an error", func(t *testing.T) {
		var group string
		pages := []struct{ path, h1, has string }{
			{"/", "Overview", "#nodes"},
			{"/graph", "Graph", "#graph"},
			{"/audit", "Audit", "#audit-search"},
			{"/audit?type=module.%23", "Audit", "#events"},
			{"/audit/event/" + site, "Event " + site, "#event"},
			{"/audit/trace/" + notified, "Trace of " + notified, "#timeline"},
			{"/dlq", "Dead letters", "#groups"},
			{"/unrouted", "Unrouted events", "main p"}, // none: the audit logger's queue takes every event
			{"/dispatcher", "Dispatcher", "#triggers"},
			{"/groups", "Groups", "#groups-list"},
			{"/live?pattern=module.%23", "Live", "#live"},
			{"/login", "Log in", "form.login"},
		}
		for _, p := range pages {
			b.run(t, chromedp.Navigate(c.base+p.path), chromedp.WaitVisible(p.has, chromedp.ByQuery))
			if h := b.text(t, "h1"); h != p.h1 {
				t.Errorf("%s: h1 %q, want %q", p.path, h, p.h1)
			}
			if p.path == "/dlq" {
				group = ledgerGroup(t, b)
			}
			if errs := b.takeErrors(); len(errs) > 0 {
				t.Errorf("%s: %v", p.path, errs)
			}
		}
		for _, p := range []struct{ path, h1, has string }{
			{group, "Dead letters", "#messages"},
			{"/dlq/message/" + dead[0], "dead letter " + dead[0], "#message"},
		} {
			b.run(t, chromedp.Navigate(c.base+p.path), chromedp.WaitVisible(p.has, chromedp.ByQuery))
			if h := b.text(t, "h1"); h != p.h1 {
				t.Errorf("%s: h1 %q, want %q", p.path, h, p.h1)
			}
			if errs := b.takeErrors(); len(errs) > 0 {
				t.Errorf("%s: %v", p.path, errs)
			}
		}
		// The groups page names the ordered group, its member and its
		// partitions.
		b.run(t, chromedp.Navigate(c.base+"/groups"), chromedp.WaitVisible("#groups-list", chromedp.ByQuery))
		if s := b.text(t, "#groups-list"); !strings.Contains(s, "counts · tally") || !strings.Contains(s, "ordered by key over 2 partitions") ||
			!strings.Contains(s, "anchor") || !strings.Contains(s, "group.counts.tally.p001") || !strings.Contains(s, "group.counts.tally.intake") {
			t.Errorf("the groups page: %q", s)
		}
		// The overview names the node, its modules and the dead letters
		// first among what is unhealthy.
		b.run(t, chromedp.Navigate(c.base+"/"), chromedp.WaitVisible("#nodes", chromedp.ByQuery))
		if s := b.text(t, "#nodes"); !strings.Contains(s, "anchor") || !strings.Contains(s, "ledger") || !strings.Contains(s, "dispatcher") ||
			!strings.Contains(s, runtime.Build().Release) || !strings.Contains(s, runtime.Build().ModuleProtocols.String()) {
			t.Errorf("the overview's nodes (with the node's release and module protocols): %q", s)
		}
		// The management API's counts trail by its statistics interval
		// (5 s by default): reloaded until they show.
		waitFor(t, ctx, "the overview to list the dead letters as unhealthy", func() bool {
			b.run(t, chromedp.Reload(), chromedp.WaitVisible("#problems", chromedp.ByQuery))
			return strings.Contains(b.text(t, "#problems"), "dead letters wait in mesh.dead-letters")
		})
		var queues string // idle ones are folded away: textContent has them too
		b.eval(t, `document.querySelector("#queues").textContent`, &queues)
		if s := queues; !strings.Contains(s, "anchor.ledger.events") {
			t.Errorf("the overview's queues: %q", s)
		}
		// The graph draws the chain's modules and events, linked to the
		// audit log.
		b.run(t, chromedp.Navigate(c.base+"/graph"), chromedp.WaitVisible("#graph", chromedp.ByQuery))
		var links []string
		b.eval(t, `Array.from(document.querySelectorAll("#graph a")).map(a => a.getAttribute("href"))`, &links)
		for _, want := range []string{"/audit?source=archive", "/audit?type=module.archive.record.archived", "/dlq"} {
			if !contains(links, want) {
				t.Errorf("the graph has no link %s: %v", want, links)
			}
		}
		// No name is cut: each vertex's lines, joined, are its whole
		// label (its title says "KIND LABEL", perhaps with more); the layers: queues
		// left of modules, modules left of events and tools.
		var vertices []struct {
			Kind, Text, Title string
			X                 float64
		}
		b.eval(t, `Array.from(document.querySelectorAll("#graph g.vertex")).map(g => ({
			Kind: g.getAttribute("class").split(" ")[1],
			Text: Array.from(g.querySelectorAll("tspan")).map(s => s.textContent).join(""),
			Title: g.querySelector("title").textContent,
			X: g.querySelector("rect").x.baseVal.value}))`, &vertices)
		xs := map[string]float64{}
		for _, v := range vertices {
			nospace := func(s string) string { return strings.ReplaceAll(s, " ", "") } // a line breaks at a space
			if strings.Contains(v.Text, "…") || !strings.HasPrefix(nospace(v.Title), nospace(v.Kind+" "+v.Text)) {
				t.Errorf("vertex %q drawn as %q: cut", v.Title, v.Text)
			}
			xs[v.Kind] = v.X
		}
		if !(xs["queue"] < xs["module"] && xs["module"] < xs["event"] && xs["event"] == xs["tool"]) {
			t.Errorf("the layers' x: %v, want queues, then modules, then events and tools", xs)
		}
	})

	t.Run("the audit search finds an event by each filter", func(t *testing.T) {
		// By the form, as an operator would.
		b.run(t, chromedp.Navigate(c.base+"/audit"), chromedp.WaitVisible("#audit-search", chromedp.ByQuery),
			chromedp.SendKeys(`#audit-search input[name="type"]`, "module.archive.#", chromedp.ByQuery))
		b.navigatedBy(t, chromedp.Click("#search", chromedp.ByQuery))
		var search string
		b.eval(t, `location.search`, &search)
		if search != "?type=module.archive.%23" { // fields left empty are left out of the URL
			t.Errorf("the search's URL: %q", search)
		}
		if ids := b.rowIDs(t, "#events"); len(ids) != 1 || ids[0] != archived {
			t.Errorf("the form's type search: %v, want [%s]", ids, archived)
		}
		future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		for _, f := range []struct {
			query    url.Values
			want     string
			unwanted string
		}{
			{url.Values{"type": {"module.umami.site.created"}}, site, notified},
			{url.Values{"source": {"archive"}}, archived, site},
			{url.Values{"node": {"anchor"}, "type": {"module.notifier.#"}}, notified, site},
			{url.Values{"user": {"guest"}, "type": {"module.umami.#"}}, site, archived},
			{url.Values{"id": {notified}}, notified, site},
			{url.Values{"causation": {site}}, notified, archived},
			{url.Values{"header": {"x-schema=1"}, "type": {"module.umami.#"}}, site, ""},
			{url.Values{"body": {"name=\"one.example\""}}, site, notified},
			{url.Values{"from": {past}, "to": {future}, "id": {site}}, site, ""},
			{url.Values{"from": {"1h"}, "id": {site}}, site, ""},
			{url.Values{"malformed": {"1"}}, "", site},
			{url.Values{"dead": {"1"}}, dead[0], site},
		} {
			b.run(t, chromedp.Navigate(c.base+"/audit?"+f.query.Encode()), chromedp.WaitVisible("main", chromedp.ByQuery))
			ids := b.rowIDs(t, "#events")
			if f.want != "" && !contains(ids, f.want) {
				t.Errorf("%s: %v lacks %s", f.query.Encode(), ids, f.want)
			}
			if f.unwanted != "" && contains(ids, f.unwanted) {
				t.Errorf("%s: %v has %s", f.query.Encode(), ids, f.unwanted)
			}
			if f.query.Get("malformed") != "" {
				var types []string
				b.eval(t, `Array.from(document.querySelectorAll("#events tbody tr td:nth-child(3)")).map(td => td.textContent)`, &types)
				if len(types) != 1 || types[0] != "mesh.raw.thing" {
					t.Errorf("malformed: types %v, want [mesh.raw.thing]", types)
				}
			}
		}
		// A time window that excludes the event finds nothing.
		b.run(t, chromedp.Navigate(c.base+"/audit?"+url.Values{"to": {past}, "id": {site}}.Encode()), chromedp.WaitVisible("main", chromedp.ByQuery))
		if ids := b.rowIDs(t, "#events"); len(ids) != 0 {
			t.Errorf("to an hour ago: %v", ids)
		}
		// The audit page opens newest first, its link flips it to oldest
		// first: the sequence numbers go down, then up from the oldest.
		var seqs []int64
		seqsJS := `Array.from(document.querySelectorAll('#events tbody tr td.num')).map(td => Number(td.textContent))`
		st, err := w.log.Store().Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b.run(t, chromedp.Navigate(c.base+"/audit?limit=5"), chromedp.WaitVisible("#events", chromedp.ByQuery), chromedp.Evaluate(seqsJS, &seqs))
		if len(seqs) != 5 || !slices.IsSortedFunc(seqs, func(a, b int64) int { return cmp.Compare(b, a) }) || seqs[0] < st.LastSeq {
			t.Errorf("the audit page's first page: seqs %v, want the newest five, newest first", seqs)
		}
		b.navigatedBy(t, chromedp.Click("#order", chromedp.ByQuery))
		b.run(t, chromedp.Evaluate(seqsJS, &seqs))
		if len(seqs) != 5 || !slices.IsSorted(seqs) || seqs[0] != 1 {
			t.Errorf("oldest first: seqs %v, want 1 to 5", seqs)
		}
		// Paged: one event a page, the next page's link goes on.
		b.run(t, chromedp.Navigate(c.base+"/audit?type=module.%23&limit=1"), chromedp.WaitVisible("#next-page", chromedp.ByQuery))
		first := b.rowIDs(t, "#events")
		b.navigatedBy(t, chromedp.Click("#next-page", chromedp.ByQuery))
		if second := b.rowIDs(t, "#events"); len(first) != 1 || len(second) != 1 || first[0] == second[0] {
			t.Errorf("pages: %v then %v", first, second)
		}
		// The export is the selection as JSON Lines.
		var href string
		b.run(t, chromedp.Navigate(c.base+"/audit?source=archive"), chromedp.WaitVisible("#export", chromedp.ByQuery),
			chromedp.AttributeValue("#export", "href", &href, nil, chromedp.ByQuery))
		_, body := c.do(t, http.MethodGet, href, token, "", nil)
		if lines := strings.Split(strings.TrimSpace(body), "\n"); len(lines) != 1 || !strings.Contains(lines[0], archived) {
			t.Errorf("export %s: %q", href, body)
		}
		b.run(t, chromedp.AttributeValue("#export-csv", "href", &href, nil, chromedp.ByQuery))
		_, body = c.do(t, http.MethodGet, href, token, "", nil)
		rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
		if err != nil || len(rows) != 2 || rows[0][1] != "id" || rows[1][1] != archived {
			t.Errorf("CSV export %s: %v %v", href, rows, err)
		}
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})

	t.Run("the trace page shows a three-level chain in order", func(t *testing.T) {
		b.run(t, chromedp.Navigate(c.base+"/audit/event/"+notified), chromedp.WaitVisible("#trace-link", chromedp.ByQuery))
		b.navigatedBy(t, chromedp.Click("#trace-link", chromedp.ByQuery))
		var tree []string
		b.eval(t, `Array.from(document.querySelectorAll("#tree a")).map(a => a.textContent)`, &tree)
		want := []string{"module.umami.site.created", "module.notifier.notification.sent", "module.archive.record.archived"}
		if strings.Join(tree, " ") != strings.Join(want, " ") {
			t.Errorf("the tree: %v, want %v", tree, want)
		}
		// Nested: the archive's event is inside the notification's.
		var depth int
		b.eval(t, `(() => { let n = 0; for (let e = Array.from(document.querySelectorAll("#tree a")).pop(); e; e = e.parentElement) if (e.tagName === "UL") n++; return n; })()`, &depth)
		if depth != 2 {
			t.Errorf("the archived record sits %d lists deep, want 2 (below the notification)", depth)
		}
		var marks []string
		b.eval(t, `Array.from(document.querySelectorAll("#timeline .mark text")).map(t => t.textContent.split(" ")[0])`, &marks)
		if strings.Join(marks, " ") != strings.Join(want, " ") {
			t.Errorf("the timeline, top to bottom: %v, want %v", marks, want)
		}
		var lanes []string
		b.eval(t, `Array.from(document.querySelectorAll("#timeline .lane-label")).map(t => t.textContent)`, &lanes)
		if strings.Join(lanes, " ") != "umami notifier archive" {
			t.Errorf("the timeline's lanes: %v", lanes)
		}
		var arrows int
		b.eval(t, `document.querySelectorAll("#timeline line.cause").length`, &arrows)
		if arrows != 2 {
			t.Errorf("%d arrows, want 2 (a cause to each effect)", arrows)
		}
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})

	t.Run("an action without the CSRF token is refused", func(t *testing.T) {
		deadBefore := w.queue(t, wire.QueueDead).Messages
		for _, h := range []map[string]string{{}, {"X-Mesh-CSRF": "guessed"}} {
			if resp, body := c.do(t, http.MethodPost, "/api/dlq/replay", token, `{"ids":["`+dead[0]+`"]}`, h); resp.StatusCode != http.StatusForbidden {
				t.Errorf("a replay with headers %v: %s %s, want 403", h, resp.Status, body)
			}
		}
		// From another site, with the token read by a page of the console's
		// own: the Origin gives it away.
		csrf := csrfOf(t, c, token)
		h := map[string]string{"X-Mesh-CSRF": csrf, "Origin": "http://evil.example"}
		if resp, body := c.do(t, http.MethodPost, "/api/dispatcher/pause", token, `{"trigger":"orders"}`, h); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a pause from another origin: %s %s, want 403", resp.Status, body)
		}
		// A page asked for by another name (DNS rebinding) is refused.
		req, _ := http.NewRequest(http.MethodGet, c.base+"/", nil)
		req.Host = "evil.example"
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("Host evil.example: %s, want 421", resp.Status)
		}
		if n := w.queue(t, wire.QueueDead).Messages; n != deadBefore {
			t.Errorf("%d dead letters after refused replays, want %d", n, deadBefore)
		}
		if c := w.queue(t, "legacy.orders").Consumers; c != 1 {
			t.Errorf("the trigger's queue has %d consumers after a refused pause, want 1", c)
		}
	})

	t.Run("a dead-letter group replayed from the page is handled", func(t *testing.T) {
		deadBefore := w.queue(t, wire.QueueDead).Messages
		w.broken.Store(false) // the ledger is fixed: a replay now succeeds
		b.run(t, chromedp.Navigate(c.base+"/dlq"), chromedp.WaitVisible("#groups", chromedp.ByQuery))
		if s := b.text(t, "#groups"); !strings.Contains(s, "anchor.ledger.events") || !strings.Contains(s, "the ledger is closed") {
			t.Errorf("the group: %q", s)
		}
		b.run(t, chromedp.Navigate(c.base+ledgerGroup(t, b)), chromedp.WaitVisible("#replay-group", chromedp.ByQuery),
			chromedp.Click("#replay-group", chromedp.ByQuery), chromedp.WaitVisible("#confirm", chromedp.ByQuery))
		if s := b.text(t, "#confirm-text"); !strings.Contains(s, "Replay 3 dead letters") {
			t.Errorf("the confirmation: %q", s)
		}
		b.run(t, chromedp.Click("#confirm-yes", chromedp.ByQuery), chromedp.WaitVisible(`#result[data-finished="true"]`, chromedp.ByQuery))
		if s := b.text(t, "#result"); !strings.Contains(s, "replayed 3 of 3 dead letters") {
			t.Errorf("the result: %q", s)
		}
		got := map[string]bool{}
		for len(got) < 3 {
			select {
			case id := <-w.ledger:
				got[id] = true
			case <-ctx.Done():
				t.Fatalf("the ledger handled %v of %v after the replay", got, dead)
			}
		}
		for _, id := range dead {
			if !got[id] {
				t.Errorf("%s not handled", id)
			}
		}
		// The audit log says each was replayed, and where to.
		for _, id := range dead {
			waitFor(t, ctx, "the replayed fate of "+id, func() bool {
				ev, err := w.log.Store().Get(ctx, id)
				if err != nil {
					return false
				}
				for _, f := range ev.Fates {
					if f.Kind == store.FateReplayed && f.Queue == "anchor.ledger.events" {
						return true
					}
				}
				return false
			})
		}
		// On the broker: the dead letters are gone and the ledger's queue
		// holds nothing (handled and acked).
		waitFor(t, ctx, "the ledger's queue to drain", func() bool {
			q := w.queue(t, "anchor.ledger.events")
			return q.Messages == 0
		})
		if n := w.queue(t, wire.QueueDead).Messages; n != deadBefore-3 {
			t.Errorf("%d dead letters after the replay, want %d", n, deadBefore-3)
		}
		// The action was logged with who took it, and recorded on the mesh.
		if s := c.stderr.String(); !strings.Contains(s, "console action") || !strings.Contains(s, "action=replay") || !strings.Contains(s, `who="tester (`) ||
			!strings.Contains(s, "as broker user guest)") || !strings.Contains(s, "auth=token") {
			t.Errorf("the console's log: %s", s)
		}
		w.audited(t, ctx, store.Filter{Types: []string{consoleActionType}, Body: map[string]string{"action": `"replay"`}}, 1)
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})

	t.Run("a trigger paused and resumed from the page", func(t *testing.T) {
		b.run(t, chromedp.Navigate(c.base+"/dispatcher"), chromedp.WaitVisible("#triggers", chromedp.ByQuery))
		if s := b.text(t, "#fires"); !strings.Contains(s, "order-1") {
			t.Errorf("the firings: %q", s)
		}
		b.run(t, chromedp.Click(`button[data-trigger="orders"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`button[data-trigger="orders"][data-action="resume"]`, chromedp.ByQuery))
		if c := w.queue(t, "legacy.orders").Consumers; c != 0 {
			t.Errorf("paused from the page, the trigger's queue has %d consumers", c)
		}
		b.run(t, chromedp.Reload(), chromedp.WaitVisible("#triggers", chromedp.ByQuery))
		if s := b.text(t, `tr[data-trigger="orders"] .state`); s != "paused" {
			t.Errorf("reloaded, the trigger is %q", s)
		}
		b.run(t, chromedp.Click(`button[data-trigger="orders"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`button[data-trigger="orders"][data-action="pause"]`, chromedp.ByQuery))
		waitFor(t, ctx, "the trigger to consume again", func() bool { return w.queue(t, "legacy.orders").Consumers == 1 })
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})

	t.Run("the live page shows an event emitted after it opened", func(t *testing.T) {
		b.run(t, chromedp.Navigate(c.base+"/live?pattern=mesh.live.%23"), chromedp.WaitVisible(`#live[data-ready="true"]`, chromedp.ByQuery))
		id, err := w.node.Emit(ctx, "books", "mesh.live.shown", json.RawMessage(`{"hello":"<b>world</b>"}`))
		if err != nil {
			t.Fatal(err)
		}
		b.run(t, chromedp.WaitVisible(`#live-events tr[data-id="`+id+`"]`, chromedp.ByQuery))
		if s := b.text(t, `#live-events tr[data-id="`+id+`"]`); !strings.Contains(s, "<b>world</b>") {
			t.Errorf("the live row (the body as text, not HTML): %q", s)
		}
		// Paused, it holds what passes and shows it on resume.
		b.run(t, chromedp.Click("#live-pause", chromedp.ByQuery), chromedp.WaitVisible(`#live[data-paused="true"]`, chromedp.ByQuery))
		held, err := w.node.Emit(ctx, "books", "mesh.live.held", map[string]int{"n": 2})
		if err != nil {
			t.Fatal(err)
		}
		b.run(t, chromedp.WaitVisible(`#live-waiting`, chromedp.ByQuery))
		waitFor(t, ctx, "the paused page to hold the event", func() bool {
			var s string
			_ = chromedp.Run(b.ctx, chromedp.Text("#live-waiting", &s, chromedp.ByQuery))
			return s == "1 waiting"
		})
		if ids := b.rowIDs(t, "#live-events"); contains(ids, held) {
			t.Error("a paused live page showed an event")
		}
		b.run(t, chromedp.Click("#live-pause", chromedp.ByQuery), chromedp.WaitVisible(`#live-events tr[data-id="`+held+`"]`, chromedp.ByQuery))
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// ledgerGroup is the link of the dead-letter group of the ledger's queue,
// read from the dead letters' page.
func ledgerGroup(t *testing.T, b *browser) string {
	t.Helper()
	var href string
	b.run(t, chromedp.Navigate(strings.TrimSuffix(b.base, "/")+"/dlq"), chromedp.WaitVisible("#groups", chromedp.ByQuery))
	b.eval(t, `(Array.from(document.querySelectorAll("#groups tbody tr")).find(r => r.textContent.includes("anchor.ledger.events")) || {querySelector: () => ({getAttribute: () => ""})}).querySelector("a").getAttribute("href")`, &href)
	if href == "" {
		t.Fatal("no dead-letter group of anchor.ledger.events")
	}
	return href
}

// csrfOf reads the CSRF token of token's pages from the overview's meta
// tag.
func csrfOf(t *testing.T, c *runningConsole, token string) string {
	t.Helper()
	_, body := c.do(t, http.MethodGet, "/", token, "", nil)
	_, rest, ok := strings.Cut(body, `<meta name="mesh-csrf" content="`)
	if !ok {
		t.Fatalf("no CSRF token on the page: %s", body)
	}
	tok, _, _ := strings.Cut(rest, `"`)
	if tok == "" {
		t.Fatalf("an empty CSRF token on the page: %s", body)
	}
	return tok
}

// login logs the tab in with token by the login page's form.
func (b *browser) login(t *testing.T, token string) {
	t.Helper()
	b.run(t, chromedp.Navigate(b.base+"/login"), chromedp.WaitVisible("form.login", chromedp.ByQuery), chromedp.SendKeys("#token", token, chromedp.ByQuery))
	b.navigatedBy(t, chromedp.Click("#login", chromedp.ByQuery))
	if h := b.text(t, "h1"); h != "Overview" {
		t.Fatalf("logged in, the page is %q", h)
	}
}

// TestConsoleGuards: a token is required on loopback too (issue 47): a
// process of the console's host without the operator's secret gets the
// login page and nothing else, whatever it scrapes; the one-time login
// URL works once; an operator's token counts from the request after it
// is added, stops at the request after it is revoked, and a read-only
// one cannot purge. Off loopback a token is printed as before; a token
// file works on loopback; --read-only refuses every action, with the
// CSRF token and all; --tls-cert serves HTTPS with a __Host- cookie.
func TestConsoleGuards(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := build(t)
	amqpURL := brokertest.VHost(t)
	node, err := runtime.New(ctx, runtime.Config{Node: "guard", AMQPURL: amqpURL, StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	unrouted := func() int {
		t.Helper()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(wire.QueueUnrouted, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspect %s: %v", wire.QueueUnrouted, err)
		}
		return q.Messages
	}
	// emitUnrouted emits an event no queue wants, and waits for it in
	// mesh.unrouted.
	emitUnrouted := func() string {
		t.Helper()
		before := unrouted()
		id, err := node.Emit(ctx, "books", "mesh.nobody.listens", map[string]int{"x": 1})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "the unrouted event", func() bool { return unrouted() == before+1 })
		return id
	}

	t.Run("on loopback with no flags, a process of this host without the secret gets nothing", func(t *testing.T) {
		secret := emitUnrouted()
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "127.0.0.1:0")
		if c.loginURL == "" || c.token != "" {
			t.Fatalf("login URL %q, token %q: want a login URL and no token printed", c.loginURL, c.token)
		}
		// The attacker: a process of this host, which can open connections
		// to 127.0.0.1 and has no cookie, no token, no login URL. Every page
		// sends it to the login page: no page has a CSRF token for it.
		for _, p := range []string{"/", "/unrouted", "/audit/export", "/audit/export?format=csv", "/live", "/dispatcher", "/groups"} {
			resp, body := c.do(t, http.MethodGet, p, "", "", nil)
			if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") {
				t.Errorf("GET %s: %s to %q, want 303 to the login page", p, resp.Status, resp.Header.Get("Location"))
			}
			if strings.Contains(body, secret) {
				t.Errorf("GET %s gave the unrouted event's id away", p)
			}
		}
		scraped := ""
		if _, login := c.do(t, http.MethodGet, "/login", "", "", nil); strings.Contains(login, `content="`) {
			_, rest, _ := strings.Cut(login, `<meta name="mesh-csrf" content="`)
			scraped, _, _ = strings.Cut(rest, `"`)
		}
		for _, p := range []string{"/api/live?pattern=%23", "/api/jobs/1"} {
			if resp, _ := c.do(t, http.MethodGet, p, "", "", nil); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET %s: %s, want 401", p, resp.Status)
			}
		}
		for _, h := range []map[string]string{{"X-Mesh-CSRF": scraped}, {"X-Mesh-CSRF": scraped, "Origin": c.base}, {"X-Mesh-CSRF": "guessed", "Cookie": "mesh_console=guessed"}} {
			if resp, body := c.do(t, http.MethodPost, "/api/unrouted/purge", "", `{"ids":["`+secret+`"]}`, h); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("the attacker's purge with %v: %s %s, want 401", h, resp.Status, body)
			}
		}
		if n := unrouted(); n != 1 {
			t.Fatalf("%d unrouted events after the attacker's purges, want 1 (its target)", n)
		}

		// The operator opens the login URL: once.
		jar, _ := cookiejar.New(nil)
		operator := &http.Client{Jar: jar, CheckRedirect: c.client.CheckRedirect}
		resp, err := operator.Get(c.loginURL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ck := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || ck[0].Path != "/" {
			t.Fatalf("the login URL: %s, cookies %+v", resp.Status, ck)
		}
		if resp, _ := c.do(t, http.MethodGet, c.loginURL[len(c.base):], "", "", nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
			t.Errorf("the login URL a second time: %s, cookies %v; want 401 and none", resp.Status, resp.Cookies())
		}
		opDo := func(method, path, body string, h map[string]string) (*http.Response, string) {
			t.Helper()
			saved := c.client
			c.client = operator
			defer func() { c.client = saved }()
			return c.do(t, method, path, "", body, h)
		}
		_, page := opDo(http.MethodGet, "/", "", nil)
		_, rest, _ := strings.Cut(page, `<meta name="mesh-csrf" content="`)
		csrf, _, _ := strings.Cut(rest, `"`)
		if resp, _ := c.do(t, http.MethodPost, "/api/unrouted/purge", "", `{"ids":["`+secret+`"]}`, map[string]string{"X-Mesh-CSRF": csrf}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("the attacker with the operator's CSRF token: %s, want 401", resp.Status)
		}
		resp, body := opDo(http.MethodPost, "/api/unrouted/purge", `{"ids":["`+secret+`"]}`, map[string]string{"X-Mesh-CSRF": csrf})
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("the operator's purge: %s %s", resp.Status, body)
		}
		var started struct{ Job string }
		if err := json.Unmarshal([]byte(body), &started); err != nil {
			t.Fatal(err)
		}
		var jb struct {
			Finished bool
			Summary  string
		}
		waitFor(t, ctx, "the operator's purge", func() bool {
			_, b := opDo(http.MethodGet, "/api/jobs/"+started.Job, "", nil)
			return json.Unmarshal([]byte(b), &jb) == nil && jb.Finished
		})
		if jb.Summary != "purged 1 of 1 unrouted events" {
			t.Errorf("the operator's purge: %q", jb.Summary)
		}
		// (The action itself is recorded as an event, mesh.console.action,
		// which no queue here wants either.)
		if s := c.stderr.String(); !strings.Contains(s, `who="login-url (`) || !strings.Contains(s, "auth=login-url") || strings.Contains(s, "auth=loopback") {
			t.Errorf("the console's log: %s", s)
		}

		// An operator's token, added while the console runs, counts from
		// the next request; revoked, it stops there.
		stdout, _ := want(t, bin, amqpURL, 0, []string{"console", "token", "add", "alice", "--tokens", c.tokens})
		alice := strings.TrimSpace(stdout)
		if resp, _ := c.do(t, http.MethodGet, "/", alice, "", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("alice's token: %s", resp.Status)
		}
		aliceCSRF := csrfOf(t, c, alice)
		want(t, bin, amqpURL, 0, []string{"console", "token", "list", "--tokens", c.tokens}, "alice", "read-write")
		want(t, bin, amqpURL, 0, []string{"console", "token", "revoke", "alice", "--tokens", c.tokens}, "revoked alice")
		if resp, _ := c.do(t, http.MethodGet, "/", alice, "", nil); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("alice's token, revoked: %s, want 303 to the login page", resp.Status)
		}
		if resp, _ := c.do(t, http.MethodPost, "/api/unrouted/purge", alice, `{"ids":["x"]}`, map[string]string{"X-Mesh-CSRF": aliceCSRF}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("alice's purge, her token revoked: %s, want 401", resp.Status)
		}

		// A read-only token views, and cannot purge.
		kept := emitUnrouted()
		before := unrouted()
		stdout, _ = want(t, bin, amqpURL, 0, []string{"console", "token", "add", "viewer", "--read-only", "--tokens", c.tokens})
		viewer := strings.TrimSpace(stdout)
		if resp, body := c.do(t, http.MethodGet, "/unrouted", viewer, "", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `class="read-only"`) {
			t.Errorf("the viewer's /unrouted: %s, read-only page: %v", resp.Status, strings.Contains(body, `class="read-only"`))
		}
		resp, body = c.do(t, http.MethodPost, "/api/unrouted/purge", viewer, `{"ids":["`+kept+`"]}`, map[string]string{"X-Mesh-CSRF": csrfOf(t, c, viewer)})
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("the viewer's purge: %s %s, want 403 read-only", resp.Status, body)
		}
		if n := unrouted(); n != before {
			t.Errorf("%d unrouted events after the viewer's purge, want %d", n, before)
		}
	})

	t.Run("the login URL in a browser", func(t *testing.T) {
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "127.0.0.1:0")
		b := newBrowser(t, ctx)
		b.base = c.base
		b.navigatedBy(t, chromedp.Navigate(c.loginURL))
		if h := b.text(t, "h1"); h != "Overview" {
			t.Errorf("after the login URL: %q", h)
		}
		b.navigatedBy(t, chromedp.Navigate(c.base+"/dispatcher"))
		if h := b.text(t, "h1"); h != "Dispatcher" {
			t.Errorf("logged in, /dispatcher: %q", h)
		}
		if errs := b.takeErrors(); len(errs) > 0 {
			t.Errorf("errors: %v", errs)
		}
		// Spent: another browser gets the login page, saying why.
		other := newBrowser(t, ctx)
		other.run(t, chromedp.Navigate(c.loginURL), chromedp.WaitVisible("form.login", chromedp.ByQuery))
		if s := other.text(t, ".error"); !strings.Contains(s, "used already") {
			t.Errorf("the login URL a second time: %q", s)
		}
	})

	t.Run("a token is required off loopback", func(t *testing.T) {
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "0.0.0.0:0")
		if len(c.token) < 32 || c.loginURL == "" {
			t.Fatalf("token %q, login URL %q", c.token, c.loginURL)
		}
		resp, _ := c.do(t, http.MethodGet, "/audit", "", "", nil)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Errorf("a page without the token: %s to %q, want a redirect to /login", resp.Status, resp.Header.Get("Location"))
		}
		for _, path := range []string{"/api/live?pattern=%23", "/api/jobs/1"} {
			if resp, _ := c.do(t, http.MethodGet, path, "", "", nil); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s without the token: %s, want 401", path, resp.Status)
			}
		}
		if resp, _ := c.do(t, http.MethodPost, "/api/dispatcher/pause", "", `{"trigger":"x"}`, map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("an action without the token: %s, want 401", resp.Status)
		}
		// In the browser: a wrong token is refused, the right one lets in
		// and goes on to the page first asked for.
		b := newBrowser(t, ctx)
		b.run(t, chromedp.Navigate(c.base+"/dispatcher"), chromedp.WaitVisible("form.login", chromedp.ByQuery),
			chromedp.SendKeys("#token", "wrong-token-wrong-token", chromedp.ByQuery))
		if _, err := chromedp.RunResponse(b.ctx, chromedp.Click("#login", chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if s := b.text(t, ".error"); !strings.Contains(s, "not a token of this console") {
			t.Errorf("a wrong token: %q", s)
		}
		b.takeErrors() // the refusal's 401 is logged by the browser
		b.run(t, chromedp.SendKeys("#token", c.token, chromedp.ByQuery))
		b.navigatedBy(t, chromedp.Click("#login", chromedp.ByQuery))
		if h := b.text(t, "h1"); h != "Dispatcher" {
			t.Errorf("after logging in: %q", h)
		}
		// The Authorization header works too, for scripts.
		if resp, _ := c.do(t, http.MethodGet, "/graph?format=json", c.token, "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("with the bearer token: %s", resp.Status)
		}
	})

	t.Run("a token file works on loopback", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte("a-token-of-my-own-choosing\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "127.0.0.1:0", "--token-file", f)
		if c.loginURL != "" {
			t.Errorf("a login URL printed with --token-file: %q", c.loginURL)
		}
		if resp, _ := c.do(t, http.MethodGet, "/", "", "", nil); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("without the file's token: %s", resp.Status)
		}
		form := url.Values{"token": {"a-token-of-my-own-choosing"}, "next": {"//evil.example/"}}.Encode()
		resp, _ := c.do(t, http.MethodPost, "/login", "", form, map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
			t.Errorf("login: %s to %q, cookies %v (want / and one HttpOnly cookie: never another site)", resp.Status, resp.Header.Get("Location"), resp.Cookies())
		}
	})

	t.Run("--read-only refuses every action", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte("a-token-of-my-own-choosing\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "127.0.0.1:0", "--read-only", "--token-file", f)
		token := "a-token-of-my-own-choosing"
		csrf := csrfOf(t, c, token)
		for _, a := range []struct{ path, body string }{
			{"/api/dlq/replay", `{"ids":["x"]}`}, {"/api/dlq/purge", `{"ids":["x"]}`},
			{"/api/unrouted/replay", `{"ids":["x"]}`}, {"/api/unrouted/purge", `{"ids":["x"]}`},
			{"/api/dispatcher/pause", `{"trigger":"orders"}`}, {"/api/dispatcher/resume", `{"trigger":"orders"}`},
		} {
			if resp, body := c.do(t, http.MethodPost, a.path, token, a.body, map[string]string{"X-Mesh-CSRF": csrf}); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
				t.Errorf("%s read-only: %s %s", a.path, resp.Status, body)
			}
		}
		// The page says so, and shows no action.
		b := newBrowser(t, ctx)
		b.base = c.base
		b.login(t, token)
		b.run(t, chromedp.Navigate(c.base+"/dispatcher"), chromedp.WaitVisible("header .badge", chromedp.ByQuery))
		if s := b.text(t, "header .badge"); s != "read-only" {
			t.Errorf("badge %q", s)
		}
	})

	t.Run("--tls-cert serves HTTPS, with a __Host- cookie", func(t *testing.T) {
		ca := brokertest.NewCA(t, "console test CA")
		pair := ca.ServerCert(t)
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		key, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]}), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
			t.Fatal(err)
		}
		c := startConsole(t, ctx, bin, amqpURL, "--addr", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile)
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		c.client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		if !strings.HasPrefix(c.loginURL, "https://") {
			t.Errorf("login URL %q, want https://", c.loginURL)
		}
		resp, _ := c.do(t, http.MethodGet, c.loginURL[strings.Index(c.loginURL, "/login"):], "", "", nil)
		if ck := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(ck) != 1 || ck[0].Name != "__Host-mesh_console" || !ck[0].Secure ||
			!ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || ck[0].Path != "/" {
			t.Errorf("the login URL over TLS: %s, cookies %+v", resp.Status, resp.Cookies())
		}
		if resp, _ := c.do(t, http.MethodGet, "/", "", "", nil); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("over TLS without a token: %s, want 303", resp.Status)
		}
		plain := &http.Client{CheckRedirect: c.client.CheckRedirect}
		resp, err = plain.Get(strings.Replace(c.base, "https://", "http://", 1) + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest { // Go's "client sent an HTTP request to an HTTPS server"
			t.Errorf("plain HTTP on the TLS port: %s, want 400", resp.Status)
		}
	})
}
