package runtime

import (
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestUnavailableTellsAWhileFromForGood: the refusals a module's first
// attach waits out (a queue's node down, a quorum queue without a leader)
// and those that fail its load (a queue that does not exist, one the user
// may not read), as RabbitMQ 3.10 words them, wrapped as the runtime wraps
// them.
func TestUnavailableTellsAWhileFromForGood(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&amqp.Error{Code: amqp.NotFound, Server: true, Reason: "NOT_FOUND - home node 'mesh-c3@localhost' of durable queue 'serve.audit.query' in vhost 'v' is down or inaccessible"}, true},
		{&amqp.Error{Code: amqp.InternalError, Server: true, Reason: "INTERNAL_ERROR"}, true},
		{&amqp.Error{Code: amqp.InternalError, Server: false, Reason: "internal error: invalid type assertion"}, false}, // amqp091-go's own, not the broker's
		{&amqp.Error{Code: amqp.NotFound, Server: true, Reason: "NOT_FOUND - no queue 'soak.legacy' in vhost 'v'"}, false},
		{&amqp.Error{Code: amqp.AccessRefused, Server: true, Reason: "ACCESS_REFUSED - access to queue 'q' in vhost 'v' refused for user 'u'"}, false},
		{&amqp.Error{Code: amqp.PreconditionFailed, Server: true, Reason: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'"}, false},
		{errors.New("INTERNAL_ERROR"), false},
		{nil, false},
	} {
		err := c.err
		if err != nil {
			err = fmt.Errorf("load module m: consume queue q: %w", err)
		}
		if got := unavailable(err); got != c.want {
			t.Errorf("unavailable(%v) = %v, want %v", err, got, c.want)
		}
	}
}
