//go:build fault

package fault

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestAuditCompleteAcrossFaults: events from modules on two nodes and from
// a raw amqp091-go publisher (each id published twice) give exactly one
// row each in the audit log, which runs as a module process on one node,
// across a SIGKILL of that process mid-stream and a restart of the
// broker application (both redeliver what the logger had not
// acknowledged).
func TestAuditCompleteAcrossFaults(t *testing.T) {
	url := brokertest.VHost(t)
	ensureBrokerRuns(t)
	bin := filepath.Join(t.TempDir(), "audit-logger")
	if out, err := exec.Command("go", "build", "-o", bin, "../../auditlogger/cmd/audit-logger").CombinedOutput(); err != nil {
		t.Fatalf("build the audit logger: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	anchor, harbor := newNode(t, url, "anchor", nil), newNode(t, url, "harbor", nil)
	logger, err := anchor.LoadPlugin(ctx, bin, []string{"--db", filepath.Join(t.TempDir(), "audit.db")},
		runtime.ModuleConfig{Prefetch: 64, Concurrency: 64, ToolGrants: []string{"audit.*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer logger.Stop(context.Background())
	alpha, err := anchor.Load(ctx, sdk.Module{Name: "alpha", Emits: []string{"tick"}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	beta, err := harbor.Load(ctx, sdk.Module{Name: "beta", Emits: []string{"tick"}}, runtime.ModuleConfig{})
	if err != nil {
		t.Fatal(err)
	}

	// The raw publisher goes first, with confirms: it has no spool to
	// ride out the broker's restart.
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const rawEvents = 200
	raw := newIDSet()
	for i := range rawEvents {
		id := ulid.Make().String()
		for range 2 { // a resend of the same id
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "mesh.events", "mesh.raw.tick", false, false, amqp.Publishing{
				Headers:     amqp.Table{"x-event-id": id, "x-source": "legacy", "x-node": "far", "x-time": time.Now().UTC().Format(time.RFC3339Nano)},
				ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(fmt.Sprintf(`{"i":%d}`, i)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("raw publish of %s not confirmed: %v", id, err)
			}
		}
		raw.add(id)
	}

	streams := []*stream{startStream(t, alpha.Mesh(), 2), startStream(t, beta.Mesh(), 2)}
	time.Sleep(time.Second)
	if err := syscall.Kill(logger.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	rabbitmqctl(t, "stop_app")
	time.Sleep(3 * time.Second)
	rabbitmqctl(t, "start_app")
	waitBroker(t)
	time.Sleep(2 * time.Second) // the streams go on after the restart
	for _, s := range streams {
		s.end()
	}

	want := newIDSet()
	for _, set := range []*idSet{raw, streams[0].confirmed, streams[1].confirmed} {
		for id := range set.ids {
			want.add(id)
		}
	}
	mine := store.Filter{Types: []string{"mesh.raw.#", "module.alpha.#", "module.beta.#"}}
	count := func() int64 {
		var n int64
		if err := anchor.Call(ctx, "meshctl", auditlogger.ToolCount, mine, &n); err != nil {
			return -1 // the logger or the broker is coming back
		}
		return n
	}
	var rows int64
	if !waitFor(2*time.Minute, func() bool { rows = count(); return rows >= int64(want.len()) }) {
		t.Fatalf("%d rows within 2 min for %d events", rows, want.len())
	}
	// Each confirmed id is there: asked by id, a page of ids at a time.
	ids := make([]string, 0, want.len())
	for id := range want.ids {
		ids = append(ids, id)
	}
	found := 0
	for start := 0; start < len(ids); start += 500 {
		var n int64
		if err := anchor.Call(ctx, "meshctl", auditlogger.ToolCount, store.Filter{IDs: ids[start:min(start+500, len(ids))]}, &n); err != nil {
			t.Fatal(err)
		}
		found += int(n)
	}
	if rows != int64(want.len()) || found != want.len() {
		t.Errorf("%d rows, %d of the %d confirmed ids found: want exactly one row each", rows, found, want.len())
	}
	summary{emitted: int(streams[0].attempts.Load()+streams[1].attempts.Load()) + rawEvents, confirmed: want.len(), handled: int(rows),
		lost: want.len() - found, extra: fmt.Sprintf("raw=%d (each twice) logger restarts after SIGKILL=1 broker restarts=1 nodes=2", rawEvents)}.report(t)
}
