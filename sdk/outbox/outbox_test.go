package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/meshkit/mesh/internal/pgtest"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
	"github.com/meshkit/mesh/sdk/outbox"
)

// databases runs test on a SQLite file of its own and on a PostgreSQL
// cluster of its own.
func databases(t *testing.T, test func(t *testing.T, open func() *sql.DB)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "ledger.db")
		test(t, func() *sql.DB {
			db, err := outbox.OpenSQLite(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		})
	})
	t.Run("postgresql", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.Start(t)
		test(t, func() *sql.DB {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		})
	})
}

// ledger is the module of these tests: it keeps orders in its database
// and emits module.ledger.booked for each.
var ledger = sdk.Module{Name: "ledger", Emits: []string{"booked", "cancelled"},
	Schemas: []sdk.Schema{{Event: "booked", Version: "1", JSON: []byte(`{"type":"object","required":["order"],"properties":{"order":{"type":"string"}}}`)}}}

// load loads ledger (with setup, if any, as its Setup) on a test mesh and
// returns the mesh and the module's view of it.
func load(t *testing.T, setup func(m sdk.Mesh) error) (*meshtest.Mesh, sdk.Mesh) {
	t.Helper()
	mt := meshtest.New(meshtest.Config{})
	t.Cleanup(mt.Close)
	var mesh sdk.Mesh
	def := ledger
	def.Setup = func(m sdk.Mesh) error {
		mesh = m
		if setup != nil {
			return setup(m)
		}
		return nil
	}
	if err := mt.Load(def, meshtest.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	return mt, mesh
}

func newOutbox(t *testing.T, db *sql.DB, opts ...outbox.Option) *outbox.Outbox {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, state text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(context.Background(), db, ledger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// book writes order o and its event in one transaction, committed or not.
func book(t *testing.T, ctx context.Context, db *sql.DB, ob *outbox.Outbox, order string, commit bool) string {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, rebind(db, `INSERT INTO orders (id, state) VALUES (?, 'booked')`), order); err != nil {
		t.Fatal(err)
	}
	id, err := ob.Emit(ctx, tx, "booked", map[string]string{"order": order})
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// rebind writes ? placeholders as PostgreSQL's $1, $2, ... when db is
// PostgreSQL's.
func rebind(db *sql.DB, q string) string {
	if !strings.Contains(fmt.Sprintf("%T", db.Driver()), "stdlib") {
		return q
	}
	n := 0
	var b strings.Builder
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// emitted is what the test mesh published of ledger's booked events.
func emitted(mt *meshtest.Mesh, typ string) []sdk.Event {
	var out []sdk.Event
	for _, ev := range mt.Emitted() {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

func idsOf(evs []sdk.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

// TestEmitCommitsWithTheChange: an event written with a change that
// commits is published once, with the id Emit returned, its body and its
// schema's version; one written with a change that rolls back never is.
// Flushing again publishes nothing more.
func TestEmitCommitsWithTheChange(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		mt, mesh := load(t, nil)
		db := open()
		ob := newOutbox(t, db)
		a := book(t, ctx, db, ob, "A-1", true)
		book(t, ctx, db, ob, "A-2", false)
		b := book(t, ctx, db, ob, "A-3", true)
		if n, err := ob.Flush(ctx, mesh); err != nil || n != 2 {
			t.Fatalf("flush: %d %v, want 2", n, err)
		}
		if n, err := ob.Flush(ctx, mesh); err != nil || n != 0 {
			t.Fatalf("second flush: %d %v, want 0", n, err)
		}
		got := emitted(mt, "module.ledger.booked")
		if !slices.Equal(idsOf(got), []string{a, b}) {
			t.Fatalf("published %v, want %v (in commit order)", idsOf(got), []string{a, b})
		}
		if string(got[0].Body) != `{"order":"A-1"}` || got[0].Schema != "1" || got[0].Source != "ledger" {
			t.Errorf("published %+v", got[0])
		}
		if bl, err := ob.Backlog(ctx); err != nil || bl.Unsent != 0 || bl.SetAside != 0 {
			t.Errorf("backlog %+v %v, want empty", bl, err)
		}
	})
}

// TestAResendAfterACrashCarriesTheSameID: the process dies after the
// broker confirmed a row and before the row was marked sent. The outbox
// opened again (a restart) publishes it again with the same id, and a
// consumer handles it once.
func TestAResendAfterACrashCarriesTheSameID(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		mt, mesh := load(t, nil)
		var handled []string
		consumer := sdk.Module{Name: "shipping", Setup: func(m sdk.Mesh) error {
			return m.On("module.ledger.booked", sdk.HandlerFunc(func(_ context.Context, ev sdk.Event) error {
				handled = append(handled, ev.ID)
				return nil
			}))
		}}
		if err := mt.Load(consumer, meshtest.ModuleConfig{}); err != nil {
			t.Fatal(err)
		}
		db := open()
		ob := newOutbox(t, db)
		id := book(t, ctx, db, ob, "B-1", true)
		crash := errors.New("killed after the confirm")
		ob.SetAfterPublish(func(string) error { return crash })
		if _, err := ob.Flush(ctx, mesh); !errors.Is(err, crash) {
			t.Fatalf("flush with the crash: %v", err)
		}
		restarted := newOutbox(t, open())
		if bl, err := restarted.Backlog(ctx); err != nil || bl.Unsent != 1 {
			t.Fatalf("backlog after the crash: %+v %v, want the row unsent", bl, err)
		}
		if n, err := restarted.Flush(ctx, mesh); err != nil || n != 1 {
			t.Fatalf("flush after the restart: %d %v", n, err)
		}
		mt.Settle()
		if got := idsOf(emitted(mt, "module.ledger.booked")); !slices.Equal(got, []string{id, id}) {
			t.Errorf("published %v, want %s twice", got, id)
		}
		if !slices.Equal(handled, []string{id}) {
			t.Errorf("handled %v, want %s once", handled, id)
		}
	})
}

// TestAHandlingWritesTheSameIDsAgain: a handler writes its change and an
// event in one transaction, commits, and fails; the retry writes the
// same event id, which the outbox keeps once. The event's cause is the
// handled event.
func TestAHandlingWritesTheSameIDsAgain(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		db := open()
		ob := newOutbox(t, db)
		var ids []string
		mt, mesh := load(t, func(m sdk.Mesh) error {
			return m.On("mesh.shop.ordered", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, rebind(db, `INSERT INTO orders (id, state) VALUES (?, 'booked') ON CONFLICT (id) DO NOTHING`), "C-1"); err != nil {
					return err
				}
				id, err := ob.Emit(ctx, tx, "booked", map[string]string{"order": "C-1"})
				if err != nil {
					return err
				}
				ids = append(ids, id)
				if err := tx.Commit(); err != nil {
					return err
				}
				if ev.Attempt == 1 {
					return errors.New("failed after the commit")
				}
				return nil
			}))
		})
		cause, err := mt.Emit(ctx, "shop", "mesh.shop.ordered", map[string]string{})
		if err != nil {
			t.Fatal(err)
		}
		mt.Settle()
		if len(ids) != 2 || ids[0] != ids[1] {
			t.Fatalf("the handler's two attempts wrote %v, want one id twice", ids)
		}
		if n, err := ob.Flush(ctx, mesh); err != nil || n != 1 {
			t.Fatalf("flush: %d %v, want 1", n, err)
		}
		got := emitted(mt, "module.ledger.booked")
		if len(got) != 1 || got[0].ID != ids[0] || got[0].CausationID != cause {
			t.Errorf("published %+v, want %s caused by %s", got, ids[0], cause)
		}
	})
}

// TestEmitRefusesWhatTheMeshWould: a body against the schema, not JSON
// or too large, an undeclared name, a bad name, AtMostOnce and a missing
// transaction are refused at the call, and nothing is written.
func TestEmitRefusesWhatTheMeshWould(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	ob := newOutbox(t, db, outbox.MaxBodyBytes(64))
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, c := range []struct {
		name string
		body any
		opts []sdk.EmitOption
		want error
		says string
	}{
		{"booked", map[string]int{"order": 1}, nil, sdk.ErrInvalid, "/order"},
		{"booked", []byte(`{"order":`), nil, sdk.ErrInvalid, "not valid JSON"},
		{"booked", map[string]string{"order": strings.Repeat("x", 64)}, nil, sdk.ErrInvalid, "too large"},
		{"shipped", map[string]string{}, nil, sdk.ErrForbidden, `add "shipped" to its Emits`},
		{"booked.#", map[string]string{}, nil, sdk.ErrInvalid, ""},
		{"cancelled", map[string]string{}, []sdk.EmitOption{sdk.AtMostOnce()}, sdk.ErrInvalid, "at least once"},
		{"cancelled", map[string]string{}, []sdk.EmitOption{sdk.WithPriority(10)}, sdk.ErrInvalid, "priority"},
	} {
		_, err := ob.Emit(ctx, tx, c.name, c.body, c.opts...)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("emit %s %v: %v, want %v saying %q", c.name, c.body, err, c.want, c.says)
		}
	}
	if _, err := ob.Emit(ctx, nil, "cancelled", map[string]string{}); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("emit without a transaction: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if bl, err := ob.Backlog(ctx); err != nil || bl.Unsent != 0 {
		t.Errorf("backlog after the refusals: %+v %v, want nothing written", bl, err)
	}
}

// TestARefusedRowIsSetAside: a row the node refuses for good (a type
// outside the module's namespace its config does not grant) is set aside,
// and the rows after it are published.
func TestARefusedRowIsSetAside(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mt, mesh := load(t, nil)
	db := open(t)
	ob := newOutbox(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Emit(ctx, tx, "mesh.billing.paid", map[string]string{}, sdk.AsFullType()); err != nil {
		t.Fatal(err)
	}
	after, err := ob.Emit(ctx, tx, "cancelled", map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.Flush(ctx, mesh); err != nil || n != 1 {
		t.Fatalf("flush: %d %v, want 1", n, err)
	}
	if got := idsOf(emitted(mt, "module.ledger.cancelled")); !slices.Equal(got, []string{after}) {
		t.Errorf("published %v, want %s", got, after)
	}
	if len(emitted(mt, "mesh.billing.paid")) != 0 {
		t.Error("an ungranted type was published")
	}
	var why string
	if err := db.QueryRow(`SELECT failed FROM mesh_outbox WHERE type = 'mesh.billing.paid'`).Scan(&why); err != nil || !strings.Contains(why, "grants") {
		t.Errorf("the refused row's reason: %q %v", why, err)
	}
	if bl, err := ob.Backlog(ctx); err != nil || bl.Unsent != 0 || bl.SetAside != 1 {
		t.Errorf("backlog %+v %v, want 1 set aside", bl, err)
	}
}

// TestRelayPublishesWhatCommits: the relay, running as the module's Run
// would, publishes a row soon after its transaction commits, without a
// Flush; a second relay on the same database stands by (Flush says the
// outbox is held) until the first stops and releases the outbox.
func TestRelayPublishesWhatCommits(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mt, mesh := load(t, nil)
		db := open()
		ob := newOutbox(t, db)
		passes := make(chan int, 100)
		ob.SetAfterPass(func(n int) {
			select {
			case passes <- n:
			default:
			}
		})
		relayed := make(chan error, 1)
		go func() { relayed <- ob.Relay(ctx, mesh) }()
		<-passes // the relay holds the outbox
		standby := newOutbox(t, open())
		if _, err := standby.Flush(ctx, mesh); !errors.Is(err, outbox.ErrHeld) {
			t.Errorf("flush while another relay runs: %v, want %v", err, outbox.ErrHeld)
		}
		if err := ob.Relay(ctx, mesh); !errors.Is(err, outbox.ErrRelaying) {
			t.Errorf("a second Relay of one outbox: %v, want %v", err, outbox.ErrRelaying)
		}
		id := book(t, ctx, db, ob, "D-1", true)
		for sent := 0; sent == 0; sent = <-passes {
		}
		if got := idsOf(emitted(mt, "module.ledger.booked")); !slices.Equal(got, []string{id}) {
			t.Errorf("published %v, want %s", got, id)
		}
		cancel()
		if err := <-relayed; err != nil {
			t.Errorf("relay: %v", err)
		}
		other := book(t, context.Background(), db, ob, "D-2", true)
		if n, err := standby.Flush(context.Background(), mesh); err != nil || n != 1 {
			t.Errorf("flush once the relay stopped: %d %v, want 1", n, err)
		}
		if got := idsOf(emitted(mt, "module.ledger.booked")); !slices.Equal(got, []string{id, other}) {
			t.Errorf("published %v, want %s, %s", got, id, other)
		}
	})
}

// TestADelayCountsFromTheWrite: sdk.After is counted from Emit, not from
// the relay's publish.
func TestADelayCountsFromTheWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mt, mesh := load(t, nil)
	db := open(t)
	ob := newOutbox(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if _, err := ob.Emit(ctx, tx, "cancelled", map[string]string{}, sdk.After(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var opts string
	if err := db.QueryRow(`SELECT options FROM mesh_outbox`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	var stored struct {
		At int64 `json:"at_ms"`
	}
	if err := json.Unmarshal([]byte(opts), &stored); err != nil {
		t.Fatal(err)
	}
	if due := time.UnixMilli(stored.At); due.Before(written.Add(time.Hour-time.Second)) || due.After(time.Now().Add(time.Hour)) {
		t.Errorf("stored due time %v, want an hour after %v", due, written)
	}
	if n, err := ob.Flush(ctx, mesh); err != nil || n != 1 {
		t.Fatalf("flush: %d %v", n, err)
	}
	if len(mt.Delayed()) != 1 {
		t.Errorf("delayed %v, want the event", mt.Delayed())
	}
}

// TestInFlightPublishesEveryRow: with rows in flight at once, every
// committed row is published once and marked sent.
func TestInFlightPublishesEveryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mt, mesh := load(t, nil)
	db := open(t)
	ob := newOutbox(t, db, outbox.InFlight(8))
	var want []string
	for i := range 50 {
		want = append(want, book(t, ctx, db, ob, fmt.Sprint("E-", i), true))
	}
	if n, err := ob.Flush(ctx, mesh); err != nil || n != 50 {
		t.Fatalf("flush: %d %v, want 50", n, err)
	}
	got := idsOf(emitted(mt, "module.ledger.booked"))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("published %d events, want the 50 written once each", len(got))
	}
	if bl, err := ob.Backlog(ctx); err != nil || bl.Unsent != 0 {
		t.Errorf("backlog %+v %v, want every row sent", bl, err)
	}
	if _, err := outbox.New(ctx, db, ledger, outbox.InFlight(0)); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("InFlight(0): %v, want %v", err, sdk.ErrInvalid)
	}
}
