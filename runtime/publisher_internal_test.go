package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// TestPublisherClassifiesConfirms publishes concurrently, half to a key no
// queue is bound for, and checks each publish gets its own outcome: routed,
// returned (errUnroutable) or refused by a full queue (ErrRefused).
func TestPublisherClassifiesConfirms(t *testing.T) {
	t.Parallel()
	url := brokertest.VHost(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	setup, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.ExchangeDeclare("x", "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.QueueDeclare("routed", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := setup.QueueBind("routed", "ok.#", "x", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.QueueDeclare("full", false, true, false, false, amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := setup.QueueBind("full", "full", "x", false, nil); err != nil {
		t.Fatal(err)
	}
	p, err := newPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 400
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "ok.x"
			if i%2 == 1 {
				key = "nobody.x"
			}
			errs[i] = p.publish(ctx, "x", key, amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte("1")})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 && err != nil {
			t.Errorf("routed publish %d: %v", i, err)
		}
		if i%2 == 1 && !errors.Is(err, errUnroutable) {
			t.Errorf("unroutable publish %d: %v, want errUnroutable", i, err)
		}
	}
	if err := p.publish(ctx, "x", "full", amqp.Publishing{MessageId: "f1", Body: []byte("1")}); err != nil {
		t.Fatalf("first publish to the full queue: %v", err)
	}
	if err := p.publish(ctx, "x", "full", amqp.Publishing{MessageId: "f2", Body: []byte("1")}); !errors.Is(err, wire.ErrRefused) {
		t.Errorf("publish past x-max-length with reject-publish: %v, want ErrRefused", err)
	}
	p.close()
	if err := p.publish(ctx, "x", "ok.x", amqp.Publishing{MessageId: "late", Body: []byte("1")}); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("publish after close: %v, want ErrClosed", err)
	}
}

func TestTruncateTextKeepsRunes(t *testing.T) {
	s := "ab€" // € is 3 bytes
	for n := range 6 {
		got := truncateText(s, n)
		if !utf8.ValidString(got) {
			t.Errorf("truncateText(%q, %d) = %q, not valid UTF-8", s, n, got)
		}
	}
	if got := truncateText(s, 5); got != s {
		t.Errorf("short enough text changed: %q", got)
	}
}

// TestPublisherNoticesARefusingChannel: negative confirms with no positive
// one in between, for longer than the watch's span, call onRefusing once;
// a positive confirm in between starts the count again; an unwatched
// publisher calls nothing.
func TestPublisherNoticesARefusingChannel(t *testing.T) {
	var calls int
	p := &publisher{}
	p.confirmed(false, "", "", amqp.Publishing{})
	p.confirmed(false, "", "", amqp.Publishing{}) // not watched: nothing to call
	p.watchRefusals(0, func(string, string, amqp.Publishing) { calls++ })
	p.nackSince.Store(0)
	p.confirmed(false, "", "", amqp.Publishing{})
	p.confirmed(true, "", "", amqp.Publishing{})
	p.confirmed(false, "", "", amqp.Publishing{})
	if calls != 0 {
		t.Fatalf("onRefusing called %d times with a positive confirm between the refusals", calls)
	}
	p.confirmed(false, "", "", amqp.Publishing{})
	p.confirmed(false, "", "", amqp.Publishing{})
	if calls != 1 {
		t.Fatalf("onRefusing called %d times after refusals only, want once", calls)
	}
	p = &publisher{}
	p.watchRefusals(time.Hour, func(string, string, amqp.Publishing) { calls++ })
	p.confirmed(false, "", "", amqp.Publishing{})
	p.confirmed(false, "", "", amqp.Publishing{})
	if calls != 1 {
		t.Fatalf("onRefusing called before the refusals lasted their span")
	}
}
