package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshkit/mesh/examples/ledger"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// TestBookOnceAndEmit: a booking is answered, and its event published by
// the relay after the commit; the same request again gets the stored
// answer (the order is not booked twice); another request for the same
// order is refused.
func TestBookOnceAndEmit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, db, err := ledger.Module(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	// The shop calls ledger.book from a handler, so a retry sends the
	// same request id.
	failOnce := true
	shop := sdk.Module{Name: "shop", Setup: func(sm sdk.Mesh) error {
		return sm.On("mesh.cart.paid", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var b ledger.Booked
			if err := sm.Call(ctx, "ledger.book", ev.Body, &b); err != nil {
				return err
			}
			if failOnce {
				failOnce = false
				return errors.New("the shop failed after its call")
			}
			return nil
		}))
	}}
	for _, mod := range []sdk.Module{m, shop} {
		if err := mt.Load(mod, meshtest.ModuleConfig{ToolGrants: []string{"ledger.*"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mt.Emit(ctx, "web", "mesh.cart.paid", ledger.Order{ID: "A-1", Cents: 1200}); err != nil {
		t.Fatal(err)
	}
	mt.Settle()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("orders booked: %d %v, want 1", n, err)
	}
	if len(mt.DeadLetters()) != 0 {
		t.Errorf("dead letters %+v", mt.DeadLetters())
	}
	var resp ledger.Booked
	err = mt.Call(ctx, "web", "ledger.book", ledger.Order{ID: "A-1", Cents: 5}, &resp)
	var te *sdk.ToolError
	if !errors.As(err, &te) || te.Code != "already_booked" {
		t.Errorf("booking A-1 again in another request: %v, want already_booked", err)
	}
	// The relay (the module's Run) publishes the event once committed.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		var booked []sdk.Event
		for _, ev := range mt.Emitted() {
			if ev.Type == "module.ledger.order.booked" {
				booked = append(booked, ev)
			}
		}
		if len(booked) > 0 {
			var b ledger.Booked
			_ = json.Unmarshal(booked[0].Body, &b)
			if len(booked) != 1 || b != (ledger.Booked{ID: "A-1", Cents: 1200, BalanceCents: 1200}) {
				t.Errorf("published %+v, want one order.booked of A-1", booked)
			}
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("the relay published no order.booked in 30 s")
		}
	}
}
