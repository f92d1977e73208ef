// Package outbox_test kills a module process that uses the outbox
// (sdk/outbox) at each point of its work, under a real node on a real
// broker, and checks the database and the wire (raw amqp091-go): every
// committed change's event is published, under one id, and its consumer
// handles it once.
package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	_ "modernc.org/sqlite"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/pgtest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

var (
	buildOnce sync.Once
	ledgerBin string
	buildErr  error
)

// ledger builds ./ledger once for the package's tests.
func ledger(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mesh-outbox-test-")
		if err != nil {
			buildErr = err
			return
		}
		ledgerBin = filepath.Join(dir, "ledger")
		if out, err := exec.Command("go", "build", "-o", ledgerBin, "./ledger").CombinedOutput(); err != nil {
			buildErr = err
			ledgerBin = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build the ledger module: %v\n%s", buildErr, ledgerBin)
	}
	return ledgerBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if ledgerBin != "" && buildErr == nil {
		os.RemoveAll(filepath.Dir(ledgerBin))
	}
	os.Exit(code)
}

// startNode starts node anchor on url, its metrics read by reader, and
// closes it when t ends. Its log goes to logger (nil: nowhere).
func startNode(t *testing.T, ctx context.Context, url string, reader *sdkmetric.ManualReader, logger *slog.Logger) *runtime.Node {
	t.Helper()
	return startNodeNamed(t, ctx, "anchor", url, reader, logger)
}

// startNodeNamed is startNode for a node of another name.
func startNodeNamed(t *testing.T, ctx context.Context, name, url string, reader *sdkmetric.ManualReader, logger *slog.Logger) *runtime.Node {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	node, err := runtime.New(ctx, runtime.Config{Node: name, AMQPURL: url, StateDir: t.TempDir(),
		RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond, Logger: logger,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = node.Close(ctx)
	})
	return node
}

// logWatch is a slog handler that closes seen once a record's message
// contains want (a module process's lines arrive in its node's log).
type logWatch struct {
	want string
	seen chan struct{}
	once *sync.Once
}

// watchLog is a logger whose handler closes the channel returned once a
// record's message contains want.
func watchLog(want string) (*slog.Logger, <-chan struct{}) {
	w := logWatch{want: want, seen: make(chan struct{}), once: new(sync.Once)}
	return slog.New(w), w.seen
}

func (w logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w logWatch) WithGroup(string) slog.Handler            { return w }
func (w logWatch) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return nil
}

// events receives what an in-process module handles.
type events chan sdk.Event

func (e events) HandleEvent(_ context.Context, ev sdk.Event) error {
	e <- ev
	return nil
}

// next is the next event, or the test fails after 60 s.
func (e events) next(t *testing.T, what string) sdk.Event {
	t.Helper()
	select {
	case ev := <-e:
		return ev
	case <-time.After(60 * time.Second):
		t.Fatalf("waited 60 s for %s", what)
		return sdk.Event{}
	}
}

// TestKilledAtEachPointPublishesOnce: the ledger module process, which
// books orders through its inbox and emits through its outbox, is
// SIGKILLed right after the inbox's commit (before the delivery's ack;
// its relay not yet running), right after the mesh confirmed a row
// (before the relay marked it sent), and inside a handling before its
// commit. Each time meshd restarts it: the order redelivered after the
// commit is acknowledged without running again, the one killed before
// its commit runs again from nothing, and the row not marked sent is
// published again under the same id. On the wire every order's event
// has one id, the consumer handles each once, and the database holds
// each order's effect once and every row sent.
func TestKilledAtEachPointPublishesOnce(t *testing.T) {
	t.Parallel()
	bin := ledger(t)
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dsn, driver := filepath.Join(dir, "ledger.db"), "sqlite"
			if kind == "postgres" {
				dsn, driver = pgtest.Start(t), "pgx"
			}
			url := brokertest.VHost(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			reader := sdkmetric.NewManualReader()
			logger, tookOver := watchLog("outbox relay: holder gone")
			node := startNode(t, ctx, url, reader, logger)
			wire := brokertest.Tap(t, url, "mesh.events", "module.ledger.#")
			handled, lifecycle := make(events, 16), make(events, 16)
			if _, err := node.Load(ctx, sdk.Module{Name: "shipping", Setup: func(m sdk.Mesh) error {
				if err := m.On("node.anchor.module.#", lifecycle); err != nil {
					return err
				}
				return m.On("module.ledger.booked", handled)
			}}, runtime.ModuleConfig{}); err != nil {
				t.Fatal(err)
			}
			marker := func(name string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			restarted := func() {
				t.Helper()
				for {
					if ev := lifecycle.next(t, "the ledger's restart"); ev.Type == "node.anchor.module.restarted" {
						return
					}
				}
			}
			book := func(n int) {
				t.Helper()
				if _, err := node.Emit(ctx, "shop", "mesh.ledger.book", map[string]int{"n": n}); err != nil {
					t.Fatal(err)
				}
			}
			order := func(ev sdk.Event) int {
				var b struct{ N int }
				if err := json.Unmarshal(ev.Body, &b); err != nil {
					t.Fatalf("event %s: %v", ev.ID, err)
				}
				return b.N
			}

			// Killed after the commit, before the ack and the publish.
			marker("no-relay")
			marker("kill-after-commit")
			pm, err := node.LoadPlugin(ctx, bin, []string{kind, dsn, dir}, runtime.ModuleConfig{MaxAttempts: 10})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = pm.Stop(ctx)
			})
			for ev := lifecycle.next(t, "the ledger's start"); ev.Type != "node.anchor.module.started"; ev = lifecycle.next(t, "the ledger's start") {
			}
			book(1)
			restarted()
			first := handled.next(t, "order 1's event")
			if order(first) != 1 {
				t.Fatalf("handled %s of order %d, want order 1", first.ID, order(first))
			}

			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()

			// Killed after the publish, before the row is marked sent,
			// holding the relay's lease: the next process's relay (held
			// back until the test has read the lease the killed one left)
			// takes the lease at once, its holder provably gone, and sends
			// the row again before that lease would have run out.
			marker("hold-relay")
			marker("kill-after-publish-2")
			book(2)
			restarted()
			var killedHolder string
			var killedUntil int64
			if err := db.QueryRow(`SELECT holder, until FROM mesh_outbox_relay WHERE id = 1`).Scan(&killedHolder, &killedUntil); err != nil {
				t.Fatal(err)
			}
			if killedHolder == "" || killedUntil == 0 {
				t.Fatalf("the killed relay left the lease %q until %d, want it held", killedHolder, killedUntil)
			}
			if err := os.Remove(filepath.Join(dir, "hold-relay")); err != nil {
				t.Fatal(err)
			}
			second := handled.next(t, "order 2's event")
			if order(second) != 2 {
				t.Fatalf("handled %s of order %d, want order 2", second.ID, order(second))
			}
			// Its row marked sent before the next crash: a relay killed
			// between a publish and that mark sends the row again (at
			// least once), which the count of copies below would take
			// for this crash's (a loaded make test saw a third copy).
			for sent := false; !sent; {
				var at sql.NullInt64
				if err := db.QueryRowContext(ctx, `SELECT sent_at FROM mesh_outbox WHERE id = '`+second.ID+`'`).Scan(&at); err != nil {
					t.Fatal(err)
				}
				if sent = at.Valid; !sent {
					select {
					case <-ctx.Done():
						t.Fatal("order 2's row, sent again, was never marked sent")
					case <-time.After(20 * time.Millisecond): // polled, with a bound: the row is the signal
					}
				}
			}

			// Killed inside the handling, before the inbox's commit.
			marker("kill-before-commit")
			book(3)
			restarted()
			third := handled.next(t, "order 3's event")
			if order(third) != 3 {
				t.Fatalf("handled %s of order %d, want order 3", third.ID, order(third))
			}

			// Order 4, no crash: once it is handled, every earlier copy
			// was routed (one relay publishes in commit order).
			book(4)
			fourth := handled.next(t, "order 4's event")
			if order(fourth) != 4 {
				t.Fatalf("handled %s of order %d, want order 4", fourth.ID, order(fourth))
			}

			copies := map[string]int{}
			idOf := map[int]string{}
			for len(copies) < 4 || copies[second.ID] < 2 {
				select {
				case d := <-wire:
					id, _ := d.Headers["x-event-id"].(string)
					var b struct{ N int }
					_ = json.Unmarshal(d.Body, &b)
					if other, ok := idOf[b.N]; ok && other != id {
						t.Errorf("order %d published under two ids, %s and %s", b.N, other, id)
					}
					idOf[b.N] = id
					copies[id]++
					if d.DeliveryMode != 2 {
						t.Errorf("event %s published with delivery mode %d, want persistent", id, d.DeliveryMode)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("the wire carried %v; want orders 1, 3 and 4 once and order 2 twice (sent again after the crash)", copies)
				}
			}
			if copies[first.ID] != 1 || copies[third.ID] != 1 || copies[fourth.ID] != 1 || copies[second.ID] != 2 {
				t.Errorf("copies on the wire %v: want %s, %s and %s once, %s twice", copies, first.ID, third.ID, fourth.ID, second.ID)
			}
			select {
			case ev := <-handled:
				t.Errorf("handled %s (order %d) again", ev.ID, order(ev))
			default:
			}

			// The module process reported its outbox's backlog to meshd:
			// nothing left unsent.
			for unsent := int64(-1); unsent != 0; {
				if ctx.Err() != nil {
					t.Fatalf("mesh_outbox_unsent of the ledger is %d, want 0", unsent)
				}
				unsent = gauge(t, reader, "mesh.outbox.unsent")
				<-time.After(50 * time.Millisecond) // the relay reports about once a second
			}

			// The row sent again was marked sent before the killed relay's
			// lease ran out (both times are the same machine's clock), and
			// the relay that took it over said why.
			var secondSent int64
			var holder string
			if err := db.QueryRow(`SELECT (SELECT sent_at FROM mesh_outbox WHERE id = '`+second.ID+`'), (SELECT holder FROM mesh_outbox_relay WHERE id = 1)`).Scan(&secondSent, &holder); err != nil {
				t.Fatal(err)
			}
			if secondSent >= killedUntil {
				t.Errorf("order 2's row was sent again at %v, once the killed relay's lease ran out (%v): the restarted relay waited it out",
					time.Unix(0, secondSent), time.Unix(0, killedUntil))
			}
			if holder == killedHolder {
				t.Errorf("the lease is still the killed relay's (%s)", holder)
			}
			if !t.Failed() {
				select {
				case <-tookOver:
				case <-ctx.Done():
					t.Error(`the restarted relay never logged "outbox relay: holder gone"`)
				}
			}

			var orders, applied, rows, unsent, inbox int
			if err := db.QueryRow(`SELECT (SELECT count(*) FROM applied), (SELECT coalesce(sum(times), 0) FROM applied), (SELECT count(*) FROM mesh_outbox),
				(SELECT count(*) FROM mesh_outbox WHERE sent_at IS NULL), (SELECT count(*) FROM mesh_inbox)`).Scan(&orders, &applied, &rows, &unsent, &inbox); err != nil {
				t.Fatal(err)
			}
			if orders != 4 || applied != 4 || rows != 4 || unsent != 0 || inbox != 4 {
				t.Errorf("the database holds %d orders applied %d times, %d outbox rows (%d unsent), %d inbox records; want 4, 4, 4, 0, 4", orders, applied, rows, unsent, inbox)
			}
		})
	}
}

// gauge is the value of an int64 gauge of the node's metrics, or -1 while
// it is not observed.
func gauge(t *testing.T, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == name && len(g.DataPoints) > 0 {
				return g.DataPoints[0].Value
			}
		}
	}
	return -1
}
