//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// TestPoisonEventReplayed: one event among 50 good ones fails every
// attempt. The good ones flow past it; it is dead-lettered after 3
// attempts; once the handler is fixed it is replayed from the dead letters
// to its module's queue only, and handled once.
func TestPoisonEventReplayed(t *testing.T) {
	url := brokertest.VHost(t)
	n := newNode(t, url, "faultp", nil)
	var fixed atomic.Bool
	var poisonAttempts atomic.Int64
	handled := newIDSet()
	other := newIDSet() // a second module on the same events: the replay must not reach it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := n.Load(ctx, sdk.Module{Name: "orders", Emits: []string{"placed"}, Setup: func(m sdk.Mesh) error {
		return m.On("module.orders.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			var order struct{ Poison bool }
			if err := ev.Decode(&order); err != nil {
				return sdk.Permanent(err)
			}
			if order.Poison && !fixed.Load() {
				poisonAttempts.Add(1)
				return errors.New("cannot price this order")
			}
			handled.add(ev.ID)
			return nil
		}))
	}}, runtime.ModuleConfig{MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Load(ctx, sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("module.orders.placed", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			other.add(ev.ID)
			return nil
		}))
	}}, runtime.ModuleConfig{}); err != nil {
		t.Fatal(err)
	}
	var poisonID string
	confirmed := newIDSet()
	for i := range 51 {
		id, err := m.Mesh().Emit(ctx, "placed", map[string]any{"i": i, "poison": i == 10})
		if err != nil {
			t.Fatal(err)
		}
		confirmed.add(id)
		if i == 10 {
			poisonID = id
		}
	}
	if !waitFor(time.Minute, func() bool { return handled.len() == 50 && other.len() == 51 }) {
		t.Fatalf("good events handled: %d of 50 (ledger %d of 51)", handled.len(), other.len())
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var dead []deadletters.Message
	waitFor(30*time.Second, func() bool {
		dead, err = deadletters.List(ctx, conn, wire.QueueDead, deadletters.Filter{Module: "orders"})
		return err == nil && len(dead) == 1
	})
	if len(dead) != 1 || dead[0].ID != poisonID || dead[0].Attempts != 3 || dead[0].Reason != wire.DeadReasonDeliveryLimit {
		t.Fatalf("dead letters of orders: %+v (err %v), want only %s after 3 attempts", dead, err, poisonID)
	}
	deadLettered := n.Stats().DeadLettered

	fixed.Store(true)
	res, err := deadletters.Replay(ctx, conn, wire.QueueDead, deadletters.Filter{IDs: []string{poisonID}})
	if err != nil || res.Done != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if !waitFor(30*time.Second, func() bool { return handled.count(poisonID) == 1 }) {
		t.Fatal("the replayed event was not handled")
	}
	time.Sleep(500 * time.Millisecond) // a second handling or a copy to ledger would show by now
	if c := handled.count(poisonID); c != 1 {
		t.Errorf("the replayed event was handled %d times", c)
	}
	if c := other.count(poisonID); c != 1 {
		t.Errorf("the replay reached the other module too (%d handlings)", c)
	}
	left, err := deadletters.List(ctx, conn, wire.QueueDead, deadletters.Filter{})
	if err != nil || len(left) != 0 {
		t.Errorf("dead letters after the replay: %d (%v), want 0", len(left), err)
	}
	st := n.Stats()
	summary{
		emitted: 51, confirmed: confirmed.len(), handled: handled.len(), duplicates: int(st.Duplicates),
		deadLettered: int(deadLettered), lost: confirmed.missingFrom(handled),
		extra: fmt.Sprintf("poison attempts before the fix=%d, replayed=%d, handled after the replay=%d", poisonAttempts.Load(), res.Done, handled.count(poisonID)),
	}.report(t)
}
