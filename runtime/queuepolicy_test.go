package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokerapi"
	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// gatedLedger is a module that records the ids of the events it handles
// once its gate opens; until then each handler waits, and one stopped
// meanwhile returns its event to the queue.
type gatedLedger struct {
	gate    chan struct{}
	entered chan struct{}
	mu      sync.Mutex
	handled map[string]int
	want    int           // distinct events that close reached
	reached chan struct{} // closed when want distinct events were handled
}

func newGatedLedger() *gatedLedger {
	return &gatedLedger{gate: make(chan struct{}), entered: make(chan struct{}, 100), handled: map[string]int{}, reached: make(chan struct{})}
}

func (g *gatedLedger) module() sdk.Module {
	return sdk.Module{Name: "ledger", Setup: func(m sdk.Mesh) error {
		return m.On("module.shop.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			select {
			case g.entered <- struct{}{}:
			default:
			}
			select {
			case <-g.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			g.mu.Lock()
			g.handled[ev.ID]++
			if g.want > 0 && len(g.handled) == g.want && g.handled[ev.ID] == 1 {
				close(g.reached)
			}
			g.mu.Unlock()
			return nil
		}))
	}}
}

func (g *gatedLedger) count() (distinct, runs int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.handled {
		runs += n
	}
	return len(g.handled), runs
}

// mgmt is the management API of url's virtual host.
func mgmt(t *testing.T, url string) *brokerapi.Client {
	t.Helper()
	api, err := brokerapi.New(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// effectiveLimit waits until queue's effective delivery-limit (its
// policies' and its argument's, the lower) is want, and fails the test if
// it is not within 30 s.
func effectiveLimit(t *testing.T, api *brokerapi.Client, queue string, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		q, err := api.Queue(context.Background(), queue)
		if err == nil {
			limit, ok := int64(-1), false
			if v, has := q.Effective["delivery-limit"].(float64); has {
				limit, ok = int64(v), true
			}
			if arg, has := q.IntArgument("x-delivery-limit"); has && (!ok || arg < limit) {
				limit, ok = arg, true
			}
			if ok && limit == want {
				return
			}
			last = fmt.Sprintf("policy %q, effective %v, arguments %v", q.Policy, q.Effective, q.Arguments)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond) // the broker applies a policy on its own time; polled, with a bound
	}
	t.Fatalf("queue %s: delivery limit not %d within 30 s: %s", queue, want, last)
}

// TestMaxAttemptsChangesInPlace: with queue settings in policies alone
// (ADR 43, queue_limit_policy_only),
// max_attempts goes 5 → 3 → 8 on a quorum queue holding 1,000 events, the
// module stopped and loaded again with each (what a reload does): each
// load is accepted (not 406), the policy carries the new limit, the queue
// is declared without x-delivery-limit, and the 1,000 events are all
// handled at the end, none lost. The broker's limit is then proven in
// force with raw amqp091-go: a message rejected with requeue is delivered
// exactly 8 times before the broker dead-letters it.
func TestMaxAttemptsChangesInPlace(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "keeper", func(c *runtime.Config) { c.QueuePolicies, c.QueueLimitPolicyOnly = true, true })
	api := mgmt(t, url)
	queue := wire.ModuleQueue("keeper", "ledger")
	ctx := context.Background()

	ledger := newGatedLedger()
	m := load(t, n, ledger.module(), runtime.ModuleConfig{MaxAttempts: 5, Prefetch: 1, Concurrency: 1})
	q, err := api.Queue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if _, has := q.IntArgument("x-delivery-limit"); has {
		t.Fatalf("the queue was declared with x-delivery-limit %v; want its limit in a policy", q.Arguments)
	}
	if q.Arguments["x-dead-letter-exchange"] != wire.ExchangeDead || q.Arguments["x-queue-type"] != "quorum" {
		t.Errorf("the queue's identity is not in its arguments: %v", q.Arguments)
	}
	p, err := api.Policy(ctx, runtime.QueuePolicyName(queue))
	if err != nil {
		t.Fatal(err)
	}
	if p.Definition["delivery-limit"] != float64(4) || p.ApplyTo != "queues" || p.Pattern != "^keeper\\.ledger\\.events$" {
		t.Errorf("policy %+v: want delivery-limit 4 on queues matching the queue's name alone", p)
	}
	effectiveLimit(t, api, queue, 4)
	quick := func(m *runtime.Module) {
		t.Helper()
		stopCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_ = m.Stop(stopCtx) // the waiting handler's event returns to the queue
	}
	quick(m)

	const total = 1000
	for i := range total {
		if _, err := n.Emit(emitCtx(t), "shop", "module.shop.order", i); err != nil {
			t.Fatal(err)
		}
	}
	raw := rawConn(t, url)
	ready := func() int {
		t.Helper()
		q, err := raw.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	for _, attempts := range []int{3, 8} {
		for len(ledger.entered) > 0 { // what an earlier round's handler said
			<-ledger.entered
		}
		m = load(t, n, ledger.module(), runtime.ModuleConfig{MaxAttempts: attempts, Prefetch: 1, Concurrency: 1})
		select { // consuming: one event in its handler, the rest waiting
		case <-ledger.entered:
		case <-time.After(60 * time.Second):
			t.Fatalf("max_attempts %d: no event reached the handler within 60 s", attempts)
		}
		effectiveLimit(t, api, queue, int64(attempts-1))
		if got := ready(); got != total-1 {
			t.Errorf("max_attempts %d: %d events ready beside the one in hand, want %d", attempts, got, total-1)
		}
		if attempts == 8 {
			break
		}
		quick(m)
	}
	ledger.mu.Lock()
	ledger.want = total
	ledger.mu.Unlock()
	close(ledger.gate)
	select {
	case <-ledger.reached:
	case <-time.After(60 * time.Second):
	}
	stop(t, m) // what is in flight finishes: a second run of an event would show below
	distinct, runs := ledger.count()
	if distinct != total || runs != total {
		t.Fatalf("handled %d distinct events in %d runs, want %d in %d", distinct, runs, total, total)
	}

	// The limit in force: delivered 8 times, then the broker drops it to
	// the dead letters (a copy bound here to mesh.events.dead).
	if _, err := raw.QueueDeclare("test.dead", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := raw.QueueBind("test.dead", "#", wire.ExchangeDead, false, nil); err != nil {
		t.Fatal(err)
	}
	dead, err := raw.Consume("test.dead", "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := rejectUntilDead(t, url, queue, dead); n != 8 {
		t.Errorf("the broker delivered a rejected message %d times, want 8 (max_attempts 8)", n)
	}
}

// rejectUntilDead publishes one message to queue and rejects it with
// requeue until it arrives in dead; it returns how many times it was
// delivered.
func rejectUntilDead(t *testing.T, url, queue string, dead <-chan amqp.Delivery) int {
	t.Helper()
	c := rawConn(t, url)
	if err := c.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := c.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, amqp.Publishing{Body: []byte("poison"), MessageId: "poison"})
	if err != nil || !conf.Wait() {
		t.Fatalf("publish to %s: %v", queue, err)
	}
	if err := c.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := c.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		select {
		case d := <-ds:
			n++
			if err := d.Reject(true); err != nil {
				t.Fatal(err)
			}
		case d := <-dead:
			if d.MessageId == "poison" {
				return n
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: neither redelivered nor dead-lettered within 30 s, after %d deliveries", queue, n)
		}
	}
}

// TestV010QueueKeepsItsArgument: a queue v0.1.0 declared with its limit
// as an argument loads under a node that keeps policies (its declare
// repeats the argument, so it is not refused), and its policy lowers the
// limit in place; a limit above the argument leaves the argument's (the
// broker applies the lower). A node that keeps no policies, on a queue
// made by one that does, declares it without the argument rather than
// being refused.
func TestV010QueueKeepsItsArgument(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	queue := wire.ModuleQueue("elder", "ledger")
	raw := rawConn(t, url)
	// What v0.1.0 declared for max_attempts 5.
	if _, err := raw.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": wire.ExchangeDead, "x-delivery-limit": int64(4)}); err != nil {
		t.Fatal(err)
	}
	n := testNode(t, url, "elder", func(c *runtime.Config) { c.QueuePolicies = true })
	api := mgmt(t, url)
	for _, c := range []struct{ attempts, limit int64 }{{3, 2}, {8, 4}} {
		m := load(t, n, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: int(c.attempts)})
		effectiveLimit(t, api, queue, c.limit)
		stop(t, m)
	}

	// A node of v0.1.0's way (no policies) on a queue made with one.
	fresh := wire.ModuleQueue("mixed", "ledger")
	withPolicies := testNode(t, url, "mixed", func(c *runtime.Config) { c.QueuePolicies, c.QueueLimitPolicyOnly = true, true })
	stop(t, load(t, withPolicies, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: 4}))
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := withPolicies.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	without := testNode(t, url, "mixed", nil)
	m := load(t, without, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: 4})
	q, err := api.Queue(context.Background(), fresh)
	if err != nil {
		t.Fatal(err)
	}
	if _, has := q.IntArgument("x-delivery-limit"); has {
		t.Errorf("the queue gained an x-delivery-limit: %v", q.Arguments)
	}
	effectiveLimit(t, api, fresh, 3)
	stop(t, m)
}

// TestNewQueueIsDeclaredAsThePreviousRelease (issue 60, defect 4): by
// default a node that keeps policies declares a new queue with its limit
// as the argument too, as v0.1.0 declares it, so that v0.1.0's declare of
// the same queue (a rollback) is accepted, as raw amqp091-go shows; the
// policy still lowers the limit in place, and a higher max_attempts
// leaves the argument's (the broker applies the lower).
func TestNewQueueIsDeclaredAsThePreviousRelease(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	n := testNode(t, url, "today", func(c *runtime.Config) { c.QueuePolicies = true })
	api := mgmt(t, url)
	queue := wire.ModuleQueue("today", "ledger")
	m := load(t, n, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: 5})
	q, err := api.Queue(context.Background(), queue)
	if err != nil {
		t.Fatal(err)
	}
	if v, has := q.IntArgument("x-delivery-limit"); !has || v != 4 {
		t.Errorf("a new queue's arguments %v: want x-delivery-limit 4, as v0.1.0 declares it", q.Arguments)
	}
	if p, err := api.Policy(context.Background(), runtime.QueuePolicyName(queue)); err != nil || p.Definition["delivery-limit"] != float64(4) {
		t.Errorf("its policy: %+v, %v; want delivery-limit 4", p, err)
	}
	stop(t, m)
	for _, c := range []struct{ attempts, limit int64 }{{3, 2}, {8, 4}} {
		m := load(t, n, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: int(c.attempts)})
		effectiveLimit(t, api, queue, c.limit)
		stop(t, m)
	}
	// What v0.1.0's meshd declares for max_attempts 5, on the queue this
	// release made: accepted.
	raw := rawConn(t, url)
	if _, err := raw.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": wire.ExchangeDead, "x-delivery-limit": int64(4)}); err != nil {
		t.Errorf("v0.1.0's declare of a queue this release made: %v", err)
	}
}

// TestNoPoliciesWithoutTheTag: a node whose broker user may not set
// policies (no policymaker tag) declares its limits as arguments, as
// v0.1.0 did, and runs.
func TestNoPoliciesWithoutTheTag(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user, pass := brokertest.User(t)
	brokertest.Ctl(t, "set_user_tags", user, "management")
	brokertest.Ctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	userURL := strings.Replace(url, "guest:guest", user+":"+pass, 1)
	n := testNode(t, userURL, "plain", func(c *runtime.Config) { c.QueuePolicies = true })
	m := load(t, n, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: 6})
	q, err := mgmt(t, url).Queue(context.Background(), wire.ModuleQueue("plain", "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := q.IntArgument("x-delivery-limit"); v != 5 {
		t.Errorf("arguments %v: want x-delivery-limit 5", q.Arguments)
	}
	if _, err := mgmt(t, url).Policy(context.Background(), runtime.QueuePolicyName(q.Name)); !errors.Is(err, brokerapi.ErrNotFound) {
		t.Errorf("a policy for the queue: %v, want none", err)
	}
	stop(t, m)
}

// TestNoPoliciesThroughAnotherBrokersAPI: a management API that is not the
// broker's the node is on (its cluster name differs: another broker, as a
// URL derived from a proxy's host can be) is not used; the node declares
// its limits as arguments, so no queue runs without one.
func TestNoPoliciesThroughAnotherBrokersAPI(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	var policies atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/whoami":
			fmt.Fprint(w, `{"name":"guest","tags":["administrator"]}`)
		case r.URL.Path == "/api/overview":
			fmt.Fprint(w, `{"cluster_name":"rabbit@elsewhere"}`)
		default:
			policies.Add(1)
			http.NotFound(w, r)
		}
	}))
	defer other.Close()
	n := testNode(t, url, "far", func(c *runtime.Config) { c.QueuePolicies, c.ManagementURL = true, other.URL })
	m := load(t, n, newGatedLedger().module(), runtime.ModuleConfig{MaxAttempts: 6})
	q, err := mgmt(t, url).Queue(context.Background(), wire.ModuleQueue("far", "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := q.IntArgument("x-delivery-limit"); v != 5 {
		t.Errorf("arguments %v: want x-delivery-limit 5", q.Arguments)
	}
	if got := policies.Load(); got != 0 {
		t.Errorf("%d requests past whoami and overview to the other broker's API", got)
	}
	stop(t, m)
}
