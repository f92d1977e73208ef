package auditlogger_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

func openLogger(t *testing.T) *auditlogger.Logger {
	t.Helper()
	l, err := auditlogger.Open(filepath.Join(t.TempDir(), "audit.db"), auditlogger.Options{MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// relay emits "relayed" for each mesh.order.# event: a two-level chain.
var relay = sdk.Module{Name: "shop", Emits: []string{"order.accepted"}, Setup: func(m sdk.Mesh) error {
	return m.On("mesh.order.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		_, err := m.Emit(ctx, "order.accepted", map[string]any{"order": ev.ID, "tier": "gold"}, sdk.WithSchema("3"))
		return err
	}))
}}

// TestRecordsAndAnswers: on the test mesh, the logger stores every event
// once with its headers, and answers query, count, get, trace and stats
// as tools.
func TestRecordsAndAnswers(t *testing.T) {
	l := openLogger(t)
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	for _, m := range []sdk.Module{l.Module(), relay} {
		if err := mt.Load(m, meshtest.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var orders []string
	for i := range 3 {
		id, err := mt.Emit(ctx, "web", "mesh.order.placed", map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		orders = append(orders, id)
	}
	mt.Settle()
	if err := mt.Redeliver(orders[0]); err != nil { // seen twice: stored once
		t.Fatal(err)
	}
	mt.Settle()

	var n int64
	if err := mt.Call(ctx, "test", auditlogger.ToolCount, store.Filter{}, &n); err != nil || n != 6 {
		t.Fatalf("count %d, %v; want 6 (3 orders, 3 accepted)", n, err)
	}
	var page auditlogger.QueryResponse
	q := auditlogger.QueryRequest{Filter: store.Filter{Types: []string{"module.shop.#"}, Body: map[string]string{"tier": `"gold"`}}, Page: store.Page{Limit: 2}}
	if err := mt.Call(ctx, "test", auditlogger.ToolQuery, q, &page); err != nil || len(page.Events) != 2 || page.Next == 0 {
		t.Fatalf("query page 1: %+v, %v", page, err)
	}
	first := page.Events[0]
	if first.Type != "module.shop.order.accepted" || first.Source != "shop" || first.Schema != "3" || first.CausationID != orders[0] ||
		first.Headers["x-event-id"] != first.ID || first.Headers["x-causation-id"] != orders[0] || first.Headers["x-time"] == "" {
		t.Errorf("stored event %+v", first)
	}
	q.Page.After = page.Next
	var page2 auditlogger.QueryResponse
	if err := mt.Call(ctx, "test", auditlogger.ToolQuery, q, &page2); err != nil || len(page2.Events) != 1 || page2.Next != 0 {
		t.Errorf("query page 2: %+v, %v", page2, err)
	}
	var got store.Event
	if err := mt.Call(ctx, "test", auditlogger.ToolGet, orders[1], &got); err != nil || got.ID != orders[1] || string(got.Body) != `{"n":1}` {
		t.Errorf("get: %+v, %v", got, err)
	}
	var tr store.Trace
	if err := mt.Call(ctx, "test", auditlogger.ToolTrace, auditlogger.TraceRequest{ID: orders[2]}, &tr); err != nil ||
		tr.Root == nil || len(tr.Root.Caused) != 1 || tr.Root.Caused[0].Event.Type != "module.shop.order.accepted" {
		t.Errorf("trace: %+v, %v", tr, err)
	}
	var st store.Stats
	if err := mt.Call(ctx, "test", auditlogger.ToolStats, nil, &st); err != nil || st.Events != 6 {
		t.Errorf("stats: %+v, %v", st, err)
	}
	var te *sdk.ToolError
	if err := mt.Call(ctx, "test", auditlogger.ToolGet, "01JNOPE", nil); !errors.As(err, &te) || te.Code != "not_found" || !te.Permanent {
		t.Errorf("get of an unknown id: %v", err)
	}
	bad := auditlogger.QueryRequest{Filter: store.Filter{Types: []string{"a..b"}}}
	if err := mt.Call(ctx, "test", auditlogger.ToolQuery, bad, nil); !errors.As(err, &te) || te.Code != "bad_request" {
		t.Errorf("query with a bad pattern: %v", err)
	}
}

// TestDeadLetterShownInTrace: a three-level chain whose last event a
// module gives up on shows, in the trace, where it died; the Dead filter
// selects it, and replays recorded by audit.replayed show beside it.
func TestDeadLetterShownInTrace(t *testing.T) {
	l := openLogger(t)
	mt := meshtest.New(meshtest.Config{Node: "anchor"})
	defer mt.Close()
	picky := sdk.Module{Name: "billing", Emits: []string{"invoice.drafted"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			_, err := m.Emit(ctx, "invoice.drafted", map[string]string{"order": ev.ID})
			return err
		}))
	}}
	ledger := sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("module.billing.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			return sdk.Permanent(errors.New("ledger closed"))
		}))
	}}
	for _, m := range []sdk.Module{l.Module(), relay, picky, ledger} {
		if err := mt.Load(m, meshtest.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	order, err := mt.Emit(ctx, "web", "mesh.order.placed", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	var tr store.Trace
	if err := mt.Call(ctx, "test", auditlogger.ToolTrace, auditlogger.TraceRequest{ID: order}, &tr); err != nil {
		t.Fatal(err)
	}
	if tr.Root == nil || len(tr.Root.Caused) != 1 || len(tr.Root.Caused[0].Caused) != 1 {
		t.Fatalf("trace is not three levels: %+v", tr)
	}
	invoice := tr.Root.Caused[0].Caused[0].Event
	if len(invoice.Fates) != 1 {
		t.Fatalf("the invoice event's fates: %+v, want one dead letter", invoice.Fates)
	}
	f := invoice.Fates[0]
	if f.Kind != store.FateDead || f.Queue != "anchor.ledger.events" || f.Reason != "permanent" || f.Attempts != 1 ||
		f.Error == "" || f.Time.IsZero() || f.EventID != invoice.ID {
		t.Errorf("dead-letter fate %+v", f)
	}
	if len(tr.Root.Event.Fates) != 0 {
		t.Errorf("the order has fates %+v", tr.Root.Event.Fates)
	}
	yes := true
	var dead auditlogger.QueryResponse
	if err := mt.Call(ctx, "test", auditlogger.ToolQuery, auditlogger.QueryRequest{Filter: store.Filter{Dead: &yes}}, &dead); err != nil ||
		len(dead.Events) != 1 || dead.Events[0].ID != invoice.ID {
		t.Errorf("query of dead events: %+v, %v", dead, err)
	}

	sent := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rec := auditlogger.ReplayedRequest{ReplayID: "01JREPLAY0000000000000000", Destination: "mesh.events",
		Sent: []auditlogger.ReplayedEvent{{ID: invoice.ID, Time: sent}}}
	var n int
	for range 2 { // a repeated record is one fate
		if err := mt.Call(ctx, "test", auditlogger.ToolReplayed, rec, &n); err != nil || n != 1 {
			t.Fatalf("audit.replayed: %d, %v", n, err)
		}
	}
	var got store.Event
	if err := mt.Call(ctx, "test", auditlogger.ToolGet, invoice.ID, &got); err != nil || len(got.Fates) != 2 ||
		got.Fates[1].Kind != store.FateReplayed || got.Fates[1].ReplayID != rec.ReplayID || !got.Fates[1].Time.Equal(sent) {
		t.Errorf("fates after a replay: %+v, %v", got.Fates, err)
	}
	var st store.Stats
	if err := mt.Call(ctx, "test", auditlogger.ToolStats, nil, &st); err != nil || st.DeadLetters != 1 || st.Replayed != 1 || st.LastSeq != 3 {
		t.Errorf("stats: %+v, %v", st, err)
	}
	var te *sdk.ToolError
	if err := mt.Call(ctx, "test", auditlogger.ToolReplayed, auditlogger.ReplayedRequest{}, nil); !errors.As(err, &te) || te.Code != "bad_request" {
		t.Errorf("audit.replayed without a replay id: %v", err)
	}
}
