package upgrade_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/releasetest"
	"github.com/meshkit/mesh/internal/testdir"
)

// The binaries the test runs, of one release.
type binaries struct {
	release                                   string
	meshd, umami, notifier, billing, tax, aud string
}

// packages are the main packages of a node of the test, by role.
var packages = []string{"./cmd/meshd", "./examples/modules/umami", "./examples/modules/notifier", "./examples/modules/billing", "./examples/modules/tax", "./auditlogger/cmd/audit-logger"}

func (b *binaries) set(pkg, bin string) {
	switch pkg {
	case packages[0]:
		b.meshd = bin
	case packages[1]:
		b.umami = bin
	case packages[2]:
		b.notifier = bin
	case packages[3]:
		b.billing = bin
	case packages[4]:
		b.tax = bin
	case packages[5]:
		b.aud = bin
	}
}

// previousRelease builds the previous release's binaries from the git
// history.
func previousRelease(t *testing.T) binaries {
	prev := releasetest.Previous(t)
	b := binaries{release: prev.Version}
	for _, pkg := range packages {
		b.set(pkg, releasetest.Build(t, prev, pkg))
	}
	return b
}

// thisRelease builds this tree's binaries, and meshctl.
func thisRelease(t *testing.T) (binaries, string) {
	root, err := releasetest.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := testdir.Reachable(t)
	b := binaries{release: "this"}
	for _, pkg := range append(packages, "./cmd/meshctl") {
		bin := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(pkg, "./"), "/", "_"))
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
		b.set(pkg, bin)
	}
	return b, filepath.Join(dir, "cmd_meshctl")
}

// node is a meshd process of the test.
type node struct {
	t    *testing.T
	name string
	addr string // its http_addr
	cfg  string // its config file
	cmd  *exec.Cmd
	logs *lockedBuffer
}

// start runs bin with the node's config.
func (n *node) start(ctx context.Context, bin string) {
	n.t.Helper()
	n.cmd = exec.CommandContext(ctx, bin, "run", "--config", n.cfg)
	n.logs = &lockedBuffer{}
	n.cmd.Stderr = n.logs
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	cmd := n.cmd
	n.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
}

// ready waits for /readyz 200.
func (n *node) ready(ctx context.Context) {
	n.t.Helper()
	n.until(ctx, n.name+" ready", n.readyNow)
}

// readyNow says whether /readyz answers 200 now.
func (n *node) readyNow() bool {
	resp, err := http.Get("http://" + n.addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// until polls cond until it holds; the test fails with the node's log when
// ctx ends first.
func (n *node) until(ctx context.Context, what string, cond func() bool) {
	n.t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			n.t.Fatalf("%s: not within the test's time; %s's log:\n%s", what, n.name, n.logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// metric is the value of a metric line of /metrics that starts with
// prefix, or -1.
func (n *node) metric(prefix string) float64 {
	resp, err := http.Get("http://" + n.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			var v float64
			fields := strings.Fields(sc.Text())
			if _, err := fmt.Sscan(fields[len(fields)-1], &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// stop ends the node with SIGTERM; it must exit 0.
func (n *node) stop() {
	n.t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatal(err)
	}
	if err := n.cmd.Wait(); err != nil {
		n.t.Fatalf("%s exited with %v; its log:\n%s", n.name, err, n.logs.String())
	}
}

// reload writes config and sends SIGHUP, and waits for the reload to end
// with the node ready.
func (n *node) reload(ctx context.Context, config string) {
	n.t.Helper()
	before := strings.Count(n.logs.String(), "config reloaded")
	if err := os.WriteFile(n.cfg, []byte(config), 0o600); err != nil {
		n.t.Fatal(err)
	}
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		n.t.Fatal(err)
	}
	n.until(ctx, n.name+" reloaded", func() bool { return strings.Count(n.logs.String(), "config reloaded") > before })
	n.ready(ctx)
}

// freeAddr is a free loopback address for a node's http_addr.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// alphaConfig is node alpha's config, with its three modules' binaries.
func alphaConfig(url, stateDir, addr, umami, notifier, audit string) string {
	return fmt.Sprintf(`node: alpha
amqp_url: %s
state_dir: %s
http_addr: %s
heartbeat_interval: 1s
reconnect_min: 50ms
reconnect_max: 500ms
grace: 5s
modules:
  - name: umami
    path: %s
  - name: notifier
    path: %s
    calls: ["invoice.*"]
  - name: audit-logger
    path: %s
    tools: ["audit.*"]
    dead_letters: ["#"]
`, url, stateDir, addr, umami, notifier, audit)
}

// TestUpgradeInPlace is the release promise under load (docs/compatibility.md):
// a mesh of a node of the previous release (alpha: its meshd and module
// binaries, the audit logger among them, built from the git history) and
// a node of this one (beta: billing and tax), with events flowing both
// ways (site events from alpha's umami and from a loader, handled by
// alpha's notifier, which calls beta's invoice.create, which calls
// tax.rate). Alpha is cut off from the broker until its spool holds
// events, stopped, and started again on the same state dir by this
// release's meshd with its old module binaries (the spool and the dedup
// log of the previous release are read, the spool resent); then each
// module binary is swapped for this release's with SIGHUP. Then it is
// rolled back to the previous release and forward again on the same
// state dir and audit.db. The checker over what crossed mesh.events:
// every site event caused exactly one notification (lost 0, duplicates
// handled 0), every event is in the audit log once, and the audit log's
// chain verifies.
func TestUpgradeInPlace(t *testing.T) {
	old := previousRelease(t)
	cur, meshctl := thisRelease(t)
	url := brokertest.VHost(t)
	proxy := brokertest.NewProxy(t)
	alphaURL := strings.Replace(url, brokertest.Host(), proxy.Addr(), 1)

	declareEvents(t, url)
	seen := newLedger()
	go seen.follow(brokertest.Tap(t, url, "mesh.events", "module.umami.site.created", "module.notifier.notification.sent"))

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := testdir.Reachable(t)
	alpha := &node{t: t, name: "alpha", addr: freeAddr(t), cfg: filepath.Join(dir, "alpha.yaml")}
	beta := &node{t: t, name: "beta", addr: freeAddr(t), cfg: filepath.Join(dir, "beta.yaml")}
	alphaState := filepath.Join(dir, "alpha-state")
	config := func(umami, notifier, audit string) string {
		return alphaConfig(alphaURL, alphaState, alpha.addr, umami, notifier, audit)
	}
	if err := os.WriteFile(alpha.cfg, []byte(config(old.umami, old.notifier, old.aud)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(beta.cfg, []byte(fmt.Sprintf(`node: beta
amqp_url: %s
state_dir: %s
http_addr: %s
heartbeat_interval: 1s
grace: 5s
modules:
  - name: billing
    kind: agent
    path: %s
    tools: ["invoice.create"]
    calls: ["tax.rate"]
  - name: tax
    kind: agent
    path: %s
    tools: ["tax.rate"]
`, url, filepath.Join(dir, "beta-state"), beta.addr, cur.billing, cur.tax)), 0o600); err != nil {
		t.Fatal(err)
	}
	beta.start(ctx, cur.meshd)
	alpha.start(ctx, old.meshd)
	beta.ready(ctx)
	alpha.ready(ctx)

	began := time.Now()
	load := startLoad(t, url, false)
	// Each phase runs until alpha's umami has emitted under it and the
	// loader's events have gone through it (20 more notified).
	phase := func(what string) {
		t.Helper()
		sites, fromAlpha := seen.notified(), seen.notifiedFromAlpha()
		alpha.until(ctx, what, func() bool { return seen.notified() >= sites+20 && seen.notifiedFromAlpha() >= fromAlpha+1 })
		t.Logf("%v: %s: %d site events notified, %d of them from alpha's umami", time.Since(began).Round(time.Millisecond), what, seen.notified(), seen.notifiedFromAlpha())
	}
	phase("both releases running")

	// Alpha cut off: umami's emits wait in the previous release's spool;
	// then it stops with them there.
	umami := `mesh_events_emitted_total{module="umami"`
	emitted := alpha.metric(umami)
	proxy.Down()
	alpha.until(ctx, "umami's emits in alpha's spool", func() bool { return alpha.metric(umami) >= emitted+2 && alpha.metric("mesh_spool_events") >= 2 })
	t.Logf("%v: alpha (%s) cut off with %v events in its spool", time.Since(began).Round(time.Millisecond), old.release, alpha.metric("mesh_spool_events"))
	alpha.stop()
	proxy.Up()

	// This release's meshd on the same state dir, with the old module binaries.
	alpha.start(ctx, cur.meshd)
	alpha.ready(ctx)
	if !strings.Contains(alpha.logs.String(), "resending events spooled by an earlier run") {
		t.Errorf("the new meshd did not resend the old spool; its log:\n%s", alpha.logs.String())
	}
	phase("this release's meshd with the old module binaries, the spool resent")
	// The module binaries swapped for this release's, one at a time.
	alpha.reload(ctx, config(old.umami, cur.notifier, old.aud))
	phase("the notifier swapped")
	alpha.reload(ctx, config(cur.umami, cur.notifier, old.aud))
	phase("umami swapped")
	alpha.reload(ctx, config(cur.umami, cur.notifier, cur.aud))
	phase("the audit logger swapped")

	// Rolled back to the previous release (meshd and modules) on the same
	// state dir, then forward again.
	alpha.stop()
	if err := os.WriteFile(alpha.cfg, []byte(config(old.umami, old.notifier, old.aud)), 0o600); err != nil {
		t.Fatal(err)
	}
	alpha.start(ctx, old.meshd)
	alpha.ready(ctx)
	phase("rolled back to " + old.release)
	alpha.stop()
	if err := os.WriteFile(alpha.cfg, []byte(config(cur.umami, cur.notifier, cur.aud)), 0o600); err != nil {
		t.Fatal(err)
	}
	alpha.start(ctx, cur.meshd)
	alpha.ready(ctx)
	phase("rolled forward")
	load.stop()

	// The checker: every site event notified once, every event audited.
	alpha.until(ctx, "every site event notified", func() bool { return len(seen.lost()) == 0 })
	if dup := seen.duplicates(); len(dup) > 0 {
		t.Errorf("site events handled more than once (distinct notifications): %v", dup)
	}
	var missing []string
	alpha.until(ctx, "every event in the audit log", func() bool {
		out, err := exec.CommandContext(ctx, meshctl, "--amqp-url", url, "audit", "export", "--format", "jsonl").Output()
		if err != nil {
			return false
		}
		missing = seen.missingFrom(out)
		return len(missing) == 0
	})
	out, err := exec.CommandContext(ctx, meshctl, "--amqp-url", url, "audit", "verify").CombinedOutput()
	if err != nil {
		t.Errorf("meshctl audit verify after the upgrade and the rollback: %v\n%s", err, out)
	}
	sites, notes, fromAlpha := seen.counts()
	seen.mu.Lock()
	copies := seen.copies
	seen.mu.Unlock()
	// A notification's id derives from its cause, so a handler run again
	// emits the same id: the distinct ids above cannot see it. The copies
	// on the wire beyond them are spool resends or such re-runs; each is
	// one effect to a consumer (de-duplicated by id). Reported, not failed.
	t.Logf("%v: lost=0 duplicates=0 audit_missing=0: %d site events (%d from the loader, %d from alpha's umami), %d notifications (%d copies on the wire: %d repeated ids); audit verify: %s",
		time.Since(began).Round(time.Millisecond), sites, load.sent(), fromAlpha, notes, copies, copies-notes, strings.TrimSpace(string(out)))
	alpha.stop()
	beta.stop()
}

// declareEvents declares mesh.events and its alternate as meshd does, for
// a tap to bind before any node runs.
func declareEvents(t *testing.T, url string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("mesh.events.unrouted", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("mesh.events", "topic", true, false, false, false, amqp.Table{"alternate-exchange": "mesh.events.unrouted"}); err != nil {
		t.Fatal(err)
	}
}

// ledger is what the tap saw: site events and the notifications they caused.
type ledger struct {
	mu        sync.Mutex
	sites     map[string]bool
	alpha     int                        // site events from alpha's umami
	fromAlpha map[string]bool            // their ids
	notes     map[string]map[string]bool // cause → notification ids
	copies    int                        // notifications seen on the wire, copies of one id included
	ids       map[string]bool            // every event id seen
}

func newLedger() *ledger {
	return &ledger{sites: map[string]bool{}, fromAlpha: map[string]bool{}, notes: map[string]map[string]bool{}, ids: map[string]bool{}}
}

// follow records every delivery of the tap until it closes.
func (l *ledger) follow(ds <-chan amqp.Delivery) {
	for d := range ds {
		id, _ := d.Headers["x-event-id"].(string)
		l.mu.Lock()
		l.ids[id] = true
		switch d.RoutingKey {
		case "module.umami.site.created":
			if !l.sites[id] && d.Headers["x-node"] == "alpha" {
				l.alpha++
				l.fromAlpha[id] = true
			}
			l.sites[id] = true
		case "module.notifier.notification.sent":
			cause, _ := d.Headers["x-causation-id"].(string)
			if l.notes[cause] == nil {
				l.notes[cause] = map[string]bool{}
			}
			l.notes[cause][id] = true
			l.copies++
		}
		l.mu.Unlock()
	}
}

// notified is how many site events have a notification.
func (l *ledger) notified() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for s := range l.sites {
		if len(l.notes[s]) > 0 {
			n++
		}
	}
	return n
}

// notifiedFromAlpha is how many site events of alpha's umami have a
// notification.
func (l *ledger) notifiedFromAlpha() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for s, a := range l.fromAlpha {
		if a && len(l.notes[s]) > 0 {
			n++
		}
	}
	return n
}

// lost are the site events without a notification.
func (l *ledger) lost() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for s := range l.sites {
		if len(l.notes[s]) == 0 {
			out = append(out, s)
		}
	}
	return out
}

// duplicates are the site events that caused more than one distinct
// notification: a handler that ran again with an effect of its own.
func (l *ledger) duplicates() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for cause, ids := range l.notes {
		if len(ids) > 1 {
			out[cause] = len(ids)
		}
	}
	return out
}

// counts are how many site events and notifications the tap saw, and how
// many of the site events alpha's umami emitted.
func (l *ledger) counts() (sites, notes, fromAlpha int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ids := range l.notes {
		notes += len(ids)
	}
	return len(l.sites), notes, l.alpha
}

// missingFrom are the ids seen that an audit export (JSON lines) lacks.
func (l *ledger) missingFrom(export []byte) []string {
	have := map[string]bool{}
	for line := range strings.Lines(string(export)) {
		var e struct {
			ID string `json:"id"`
		}
		if json.Unmarshal([]byte(line), &e) == nil {
			have[e.ID] = true
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id := range l.ids {
		if !have[id] {
			out = append(out, id)
		}
	}
	return out
}

// loader publishes site events as a foreign producer would (raw
// amqp091-go, the contract's headers, confirmed), one every 50 ms, until
// stopped; keyed, each with the site's name as its x-partition-key.
type loader struct {
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	n        int
}

func startLoad(t *testing.T, url string, keyed bool) *loader {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	l := &loader{quit: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(l.stop)
	go func() {
		defer close(l.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-l.quit:
				return
			case <-tick.C:
			}
			now := time.Now().UTC()
			name := fmt.Sprintf("load-%d.example", i)
			body, _ := json.Marshal(map[string]any{"id": 100000 + i, "name": name})
			headers := amqp.Table{"x-event-id": ulid.Make().String(), "x-source": "umami", "x-node": "loader", "x-time": now.Format(time.RFC3339Nano), "x-schema": "1"}
			if keyed {
				headers["x-partition-key"] = name
			}
			c, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "mesh.events", "module.umami.site.created", true, false, amqp.Publishing{
				Headers:     headers,
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: now, Body: body,
			})
			if err != nil || !c.Wait() {
				t.Errorf("the loader's publish %d: %v", i, err)
				return
			}
			l.mu.Lock()
			l.n++
			l.mu.Unlock()
		}
	}()
	return l
}

// stop ends the load and waits for its last publish.
func (l *loader) stop() {
	l.stopOnce.Do(func() { close(l.quit) })
	<-l.done
}

// sent is how many events the loader published.
func (l *loader) sent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// lockedBuffer is a log safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

var _ io.Writer = (*lockedBuffer)(nil)

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
