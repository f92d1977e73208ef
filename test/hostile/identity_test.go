package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/testdir"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestNodesCannotClaimEachOther: node paris's broker user publishes, with
// raw amqp091-go, an event of billing that says it comes from node berlin
// (x-node berlin, its own user-id: the broker checks only that), then an
// honest one (x-node paris). Node berlin runs with the identity rule
// {berlin: its user, paris: paris's user}, an in-process module and a
// module process consuming billing's events, the audit logger beside
// them, and a tool.
//
//   - enforce: the claim is dead-lettered with reason identity, naming
//     both users, from every queue; no module gets it (each gets the honest
//     event first); the audit logger records it with that reason; a tool
//     request that claims berlin is refused as forbidden;
//   - warn: both are delivered, in order, and the claim is logged and
//     counted;
//   - off (the default): both are delivered, as before, and nothing is
//     said.
func TestNodesCannotClaimEachOther(t *testing.T) {
	for _, mode := range []string{runtime.IdentityEnforce, runtime.IdentityWarn, runtime.IdentityOff} {
		t.Run(mode, func(t *testing.T) { claimAnotherNode(t, mode) })
	}
}

func claimAnotherNode(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	url := brokertest.VHost(t)
	berlin, berlinURL := nodeUser(t, url)
	paris, parisURL := nodeUser(t, url)
	dir := testdir.Reachable(t)

	// The audit logger's store, closed after the node (cleanups run last
	// first).
	audit, err := auditlogger.Open(filepath.Join(dir, "audit.db"), auditlogger.Options{KeyFile: "-", CheckpointEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { audit.Close() })

	var logs lockedBuffer
	reader := sdkmetric.NewManualReader()
	n, err := runtime.New(ctx, runtime.Config{Node: "berlin", AMQPURL: berlinURL, StateDir: filepath.Join(dir, "state"),
		RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Identity:      runtime.IdentityConfig{Mode: mode, Users: map[string]string{"berlin": berlin, "paris": paris}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})

	// In process: the ledger, which consumes billing's events and serves
	// a tool that says which node asked.
	got := make(chan sdk.Event, 16)
	if _, err := n.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return errors.Join(
			m.On("module.billing.#", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error { got <- ev; return nil })),
			m.Serve("ledger.node", sdk.ToolHandlerFunc(func(_ context.Context, r sdk.Request) (any, error) { return r.Node, nil })))
	}}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	// A module process consuming the same, reporting each delivery.
	report := newReports(t, dir, "receiver")
	settings, _ := json.Marshal(map[string]any{"attack": "receive", "name": "receiver", "pattern": "module.billing.#", "report": report.path})
	pm, err := n.LoadPlugin(ctx, evilBin, nil, runtime.ModuleConfig{Name: "receiver", Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pm.Stop(ctx)
	})
	// The audit logger, on # and every dead letter; each dead letter it
	// has recorded is signalled.
	logger := audit.Module()
	record := logger.DeadLetters
	recorded := make(chan sdk.Event, 16)
	logger.DeadLetters = sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		err := record.HandleEvent(ctx, ev)
		if err == nil {
			recorded <- ev
		}
		return err
	})
	if _, err := n.Load(ctx, logger, runtime.ModuleConfig{DeadLetterGrants: []string{"#"}, ToolGrants: []string{"audit.*"}}); err != nil {
		t.Fatal(err)
	}

	// Paris's user, as a raw client: the claim, then an honest event, on
	// one channel (the broker keeps their order in every queue).
	_, ch := dialConfirm(t, parisURL)
	publish := func(node string) string {
		t.Helper()
		id := ulid.Make().String()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, wire.ExchangeEvents, "module.billing.invoice.paid", false, false, amqp.Publishing{
			Headers: amqp.Table{wire.HeaderEventID: id, wire.HeaderSource: "billing", wire.HeaderNode: node,
				wire.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano)},
			ContentType: wire.ContentTypeJSON, DeliveryMode: amqp.Persistent, MessageId: id, UserId: paris, Body: []byte(`{"amount":100}`)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish as %s: not confirmed: %v", node, err)
		}
		return id
	}
	forged := publish("berlin")
	honest := publish("paris")
	claim := fmt.Sprintf("x-node berlin published by broker user %s; identity.users says berlin is %s", paris, berlin)

	// What the in-process module and the module process get, in order.
	want := []string{forged, honest}
	if mode == runtime.IdentityEnforce {
		want = []string{honest}
	}
	for _, id := range want {
		select {
		case ev := <-got:
			if ev.ID != id || ev.Node != map[string]string{forged: "berlin", honest: "paris"}[id] || ev.UserID != paris {
				t.Errorf("ledger got %s from node %s by %q, want %s", ev.ID, ev.Node, ev.UserID, id)
			}
		case <-ctx.Done():
			t.Fatalf("ledger never got %s; log:\n%s", id, logs.String())
		}
	}
	var delivered []string
	for _, l := range waitDeliveries(t, report, len(want)) {
		delivered = append(delivered, l.Got)
	}
	if strings.Join(delivered, " ") != strings.Join(want, " ") {
		t.Errorf("the module process got %v, want %v", delivered, want)
	}

	// A call that claims node berlin, from paris's user, and an honest one.
	call := func(node string) (string, error) {
		t.Helper()
		caller, err := runtime.New(ctx, runtime.Config{Node: node, AMQPURL: parisURL, Ephemeral: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer caller.Close(context.Background())
		var answer string
		err = caller.Call(ctx, "billing", "ledger.node", nil, &answer)
		return answer, err
	}
	if answer, err := call("paris"); err != nil || answer != "paris" {
		t.Errorf("paris's honest call: %q, %v", answer, err)
	}
	answer, err := call("berlin")
	var te *sdk.ToolError
	switch {
	case mode != runtime.IdentityEnforce && (err != nil || answer != "berlin"):
		t.Errorf("a call claiming berlin, identity %s: %q, %v; want it served", mode, answer, err)
	case mode == runtime.IdentityEnforce && (!errors.As(err, &te) || te.Code != wire.CodeForbidden || !te.Permanent || !strings.Contains(te.Message, claim)):
		t.Errorf("a call claiming berlin: %q, %v; want the permanent tool error forbidden saying %q", answer, err, claim)
	}

	// Counted in mesh.identity.mismatches: the event and the request.
	counted := identityCount(t, reader, "ledger")
	switch {
	case mode == runtime.IdentityOff && counted != 0:
		t.Errorf("identity off: %d mismatches counted", counted)
	case mode != runtime.IdentityOff && counted != 2:
		t.Errorf("identity %s: %d mismatches counted for ledger, want 2 (the event and the request)", mode, counted)
	}
	said := logs.String()
	switch mode {
	case runtime.IdentityOff:
		if strings.Contains(said, "identity") {
			t.Errorf("identity off, yet the log speaks of it:\n%s", said)
		}
		return
	case runtime.IdentityWarn:
		for _, what := range []string{"event", "request"} {
			if !strings.Contains(said, "identity: "+what+" delivered although its x-node is not its publisher's") {
				t.Errorf("warn mode: no warning of the %s:\n%s", what, said)
			}
		}
		if !strings.Contains(said, claim) || strings.Contains(said, "dead-lettered") {
			t.Errorf("warn mode: the warning does not say %q, or something was dead-lettered:\n%s", claim, said)
		}
		return
	}

	// Enforce: the claim is in mesh.dead-letters once per queue that took
	// it, with reason identity, naming both users; published by the node,
	// paris's user kept as the original publisher.
	_, raw := dialConfirm(t, url)
	deliveries, err := raw.Consume(wire.QueueDead, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	queues := map[string]bool{"berlin.ledger.events": false, "berlin.receiver.events": false, "berlin.audit-logger.events": false}
	for left := len(queues); left > 0; {
		select {
		case d := <-deliveries:
			q, _ := d.Headers[wire.HeaderDeadQueue].(string)
			seen, ours := queues[q]
			if !ours || seen {
				t.Errorf("a dead letter of %s from %q", d.MessageId, q)
				continue
			}
			queues[q] = true
			left--
			if d.MessageId != forged || d.Headers[wire.HeaderDeadReason] != wire.DeadReasonIdentity ||
				!strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadError]), claim) {
				t.Errorf("dead letter from %s: %s, reason %v, error %v; want %s, identity, %q", q, d.MessageId,
					d.Headers[wire.HeaderDeadReason], d.Headers[wire.HeaderDeadError], forged, claim)
			}
			if d.UserId != berlin || d.Headers[wire.HeaderUserID] != paris || d.Headers[wire.HeaderNode] != "berlin" || d.RoutingKey != "module.billing.invoice.paid" {
				t.Errorf("dead letter from %s: by %q of %v (x-node %v) as %s", q, d.UserId, d.Headers[wire.HeaderUserID], d.Headers[wire.HeaderNode], d.RoutingKey)
			}
		case <-ctx.Done():
			t.Fatalf("dead letters: %v; log:\n%s", queues, logs.String())
		}
	}

	// The audit log holds the claim, with its node, its publisher and
	// its fate in each queue: reason identity.
	for fates := 0; fates < len(queues); {
		select {
		case ev := <-recorded:
			if ev.ID == forged {
				fates++
			}
		case <-ctx.Done():
			t.Fatalf("the audit logger recorded %d dead letters of the claim", fates)
		}
	}
	row, err := audit.Store().Get(ctx, forged)
	if err != nil {
		t.Fatal(err)
	}
	if row.Node != "berlin" || row.UserID != paris || len(row.Fates) != len(queues) {
		t.Errorf("audit row: node %q, user %q, %d fates; want berlin, %s, %d", row.Node, row.UserID, len(row.Fates), paris, len(queues))
	}
	for _, f := range row.Fates {
		if f.Reason != wire.DeadReasonIdentity || !strings.Contains(f.Error, claim) {
			t.Errorf("audit fate in %s: reason %q, error %q", f.Queue, f.Reason, f.Error)
		}
	}
}

// nodeUser makes a broker user with every right on url's virtual host
// (deleted when the test ends), and returns it with its URL.
func nodeUser(t *testing.T, url string) (name, userURL string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	name, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", strings.TrimPrefix(u.Path, "/"), name, ".*", ".*", ".*")
	u.User = neturl.UserPassword(name, password)
	return name, u.String()
}

// dialConfirm dials url and opens a channel in confirm mode, closed when
// the test ends.
func dialConfirm(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
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
	return conn, ch
}

// waitDeliveries waits until the module process reported n deliveries
// and returns them, in order.
func waitDeliveries(t *testing.T, r *reports, n int) []reportLine {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		lines, changed := r.all()
		var got []reportLine
		for _, l := range lines {
			if l.Step == "delivery" {
				got = append(got, l)
			}
		}
		if len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("the module process reported %d deliveries, want %d: %+v", len(got), n, lines)
		}
	}
}

// identityCount is mesh.identity.mismatches of module, over its origins.
func identityCount(t *testing.T, reader *sdkmetric.ManualReader, module string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if !ok || mt.Name != "mesh.identity.mismatches" {
				continue
			}
			for _, p := range sum.DataPoints {
				if v, _ := p.Attributes.Value("module"); v.AsString() == module {
					total += p.Value
				}
			}
		}
	}
	return total
}

// lockedBuffer is a log's buffer, written by the node's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
