package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
	"github.com/meshkit/mesh/sdk/outbox"
)

// payments is a module that keeps a balance in its database and books
// each payment from the queue shop.payments through the inbox, emitting
// module.ledger.booked in the same transaction. runs counts its effect's
// runs; the first fail attempts of each payment fail after the effect.
func payments(t *testing.T, db *sql.DB, ob *outbox.Outbox, runs *atomic.Int64, fail int) sdk.Module {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS balance (account text PRIMARY KEY, cents integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	def := ledger
	def.Setup = func(m sdk.Mesh) error {
		return m.Consume("shop.payments", 1, ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			runs.Add(1)
			var p struct{ Cents int }
			if err := ev.Decode(&p); err != nil {
				return sdk.Permanent(err)
			}
			if _, err := tx.ExecContext(ctx, rebind(db, `INSERT INTO balance (account, cents) VALUES ('shop', ?) ON CONFLICT (account) DO UPDATE SET cents = balance.cents + excluded.cents`), p.Cents); err != nil {
				return err
			}
			if _, err := ob.Emit(ctx, tx, "booked", map[string]string{"order": ev.ID}); err != nil {
				return err
			}
			if ev.Attempt <= fail {
				return errors.New("failed after the effect, before the commit")
			}
			return nil
		}))
	}
	return def
}

func balance(t *testing.T, db *sql.DB) int {
	t.Helper()
	var cents int
	if err := db.QueryRow(`SELECT cents FROM balance WHERE account = 'shop'`).Scan(&cents); err != nil {
		t.Fatal(err)
	}
	return cents
}

// node is a test mesh as one node of the module sharing db: a node that
// starts after another crashed, or another server of the module.
func node(t *testing.T, def sdk.Module) (*meshtest.Mesh, sdk.Mesh) {
	t.Helper()
	mt := meshtest.New(meshtest.Config{Start: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)})
	t.Cleanup(mt.Close)
	var mesh sdk.Mesh
	setup := def.Setup
	def.Setup = func(m sdk.Mesh) error {
		mesh = m
		return setup(m)
	}
	if err := mt.Load(def, meshtest.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	return mt, mesh
}

// TestInboxAppliesEachEventOnce: a payment whose first attempt fails
// after its effect is applied once (the failed attempt rolled back); a
// redelivery of it at another node sharing the database (the ack lost in
// a crash after the commit) is acknowledged without running; a copy of
// its id with another body is a conflict, dead-lettered, not applied. The
// event it emitted commits with the effect, once.
func TestInboxAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		db := open()
		ob := newOutbox(t, db)
		var runs atomic.Int64
		def := payments(t, db, ob, &runs, 1)
		first, mesh := node(t, def)
		const id = "01JPAYMENT000000000000000A"
		if err := first.Put("shop.payments", id, "", []byte(`{"cents":1000}`), nil); err != nil {
			t.Fatal(err)
		}
		first.Settle()
		if got := balance(t, db); got != 1000 || runs.Load() != 2 {
			t.Fatalf("balance %d after %d runs, want 1000 after 2 (the failed one rolled back)", got, runs.Load())
		}

		second, _ := node(t, def)
		if err := second.Put("shop.payments", id, "", []byte(`{"cents":1000}`), nil); err != nil {
			t.Fatal(err)
		}
		second.Settle()
		if got := balance(t, db); got != 1000 || runs.Load() != 2 || len(second.DeadLetters()) != 0 {
			t.Errorf("after the redelivery at another node: balance %d, %d runs, dead letters %+v; want 1000, 2, none", got, runs.Load(), second.DeadLetters())
		}

		third, _ := node(t, def)
		if err := third.Put("shop.payments", id, "", []byte(`{"cents":99999}`), nil); err != nil {
			t.Fatal(err)
		}
		third.Settle()
		dead := third.DeadLetters()
		if len(dead) != 1 || !strings.Contains(dead[0].Err, "other content") || dead[0].Reason != "conflict" || balance(t, db) != 1000 || runs.Load() != 2 {
			t.Errorf("a conflicting copy: dead letters %+v, balance %d, %d runs; want it dead-lettered as a conflict, nothing applied", dead, balance(t, db), runs.Load())
		}

		if n, err := ob.Flush(context.Background(), mesh); err != nil || n != 1 {
			t.Errorf("flush: %d %v, want the one event of the payment", n, err)
		}
	})
}

// TestInboxDecidesEachRequestOnce: a tool served through the inbox runs
// once per request id: the same request at another server sharing the
// database gets the stored response, a permanent refusal is stored as
// well, a transient failure is not (the retry runs), and the same id with
// another body is the permanent ToolError "conflict".
func TestInboxDecidesEachRequestOnce(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, open func() *sql.DB) {
		db := open()
		ob := newOutbox(t, db)
		var runs atomic.Int64
		flaky := atomic.Bool{}
		flaky.Store(true)
		tool := ob.ToolHandler(func(ctx context.Context, tx *sql.Tx, req sdk.Request) (any, error) {
			runs.Add(1)
			var in struct{ N int }
			if err := req.Decode(&in); err != nil {
				return nil, sdk.Permanent(err)
			}
			switch {
			case in.N < 0:
				return nil, &sdk.ToolError{Code: "negative", Message: "no negative orders", Permanent: true}
			case in.N == 7 && flaky.Swap(false):
				return nil, errors.New("the printer is warming up")
			}
			return map[string]int{"booked": in.N, "run": int(runs.Load())}, nil
		})
		ctx := context.Background()
		call := func(server sdk.ToolHandler, id string, body string) (string, error) {
			resp, err := server.HandleCall(ctx, sdk.Request{ID: id, Tool: "ledger.book", Caller: "shop", Body: []byte(body)})
			if err != nil {
				return "", err
			}
			raw, _ := resp.(interface{ MarshalJSON() ([]byte, error) }).MarshalJSON()
			return string(raw), nil
		}
		ob2, err := outbox.New(ctx, open(), ledger)
		if err != nil {
			t.Fatal(err)
		}
		other := ob2.ToolHandler(func(context.Context, *sql.Tx, sdk.Request) (any, error) {
			t.Error("the other server ran the tool for a request already decided")
			return nil, nil
		})

		got, err := call(tool, "r1", `{"n":3}`)
		if err != nil || got != `{"booked":3,"run":1}` {
			t.Fatalf("first call: %s %v", got, err)
		}
		if again, err := call(other, "r1", `{"n":3}`); err != nil || again != got {
			t.Errorf("the same request at another server: %s %v, want %s", again, err, got)
		}
		var te *sdk.ToolError
		if _, err := call(tool, "r2", `{"n":-1}`); !errors.As(err, &te) || te.Code != "negative" {
			t.Errorf("a permanent refusal: %v", err)
		}
		if _, err := call(other, "r2", `{"n":-1}`); !errors.As(err, &te) || te.Code != "negative" || !te.Permanent {
			t.Errorf("the stored refusal at another server: %v", err)
		}
		if _, err := call(tool, "r3", `{"n":7}`); err == nil || errors.As(err, &te) {
			t.Errorf("a transient failure: %v", err)
		}
		if got, err := call(tool, "r3", `{"n":7}`); err != nil || !strings.HasPrefix(got, `{"booked":7`) {
			t.Errorf("the retry after a transient failure: %s %v, want it run again", got, err)
		}
		if _, err := call(tool, "r1", `{"n":4}`); !errors.As(err, &te) || te.Code != "conflict" || !te.Permanent {
			t.Errorf("the same id with another body: %v, want the permanent ToolError conflict", err)
		}
		if runs.Load() != 4 {
			t.Errorf("the tool ran %d times, want 4 (r1, r2, r3 twice)", runs.Load())
		}
	})
}

// TestInboxKeepsDeadLettersApart: one event given up by two queues is two
// dead letters, each handled once.
func TestInboxKeepsDeadLettersApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	ob := newOutbox(t, db)
	var runs atomic.Int64
	h := ob.Handler(func(context.Context, *sql.Tx, sdk.Event) error { runs.Add(1); return nil })
	for _, queue := range []string{"anchor.a.events", "anchor.b.events", "anchor.a.events"} {
		ev := sdk.Event{ID: "01JDEAD0000000000000000000", Type: "module.x.y", Body: []byte(`{}`), DeadQueue: queue, DeadReason: "permanent"}
		if err := h.HandleEvent(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 2 {
		t.Errorf("ran %d times, want once per queue (2)", runs.Load())
	}
}

func open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := outbox.OpenSQLite(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
