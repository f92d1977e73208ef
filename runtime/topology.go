package runtime

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// declareTopology declares the mesh's exchanges and the queues that keep
// dead letters and unrouted events. Every node declares them with the same
// arguments, so a redeclare never conflicts (rabbitmq-3.10-facts.md,
// item 4: differing alternate-exchange arguments are a 406).
func declareTopology(ch *amqp.Channel) error {
	exchanges := []struct {
		name, kind string
		args       amqp.Table
	}{
		{wire.ExchangeUnrouted, amqp.ExchangeFanout, nil},
		{wire.ExchangeEvents, amqp.ExchangeTopic, amqp.Table{"alternate-exchange": wire.ExchangeUnrouted}},
		{wire.ExchangeRPC, amqp.ExchangeTopic, nil},
		{wire.ExchangeDead, amqp.ExchangeTopic, nil},
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDeclare(x.name, x.kind, true, false, false, false, x.args); err != nil {
			return fmt.Errorf("declare exchange %s: %w", x.name, err)
		}
	}
	keepers := []struct{ queue, exchange, key string }{
		{wire.QueueUnrouted, wire.ExchangeUnrouted, ""},
		{wire.QueueDead, wire.ExchangeDead, "#"},
	}
	for _, k := range keepers {
		if _, err := ch.QueueDeclare(k.queue, true, false, false, false, keeperQueueArgs()); err != nil {
			return fmt.Errorf("declare queue %s: %w", k.queue, err)
		}
		if err := ch.QueueBind(k.queue, k.key, k.exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s: %w", k.queue, k.exchange, err)
		}
	}
	return nil
}

// keeperQueueArgs are the arguments of the queues that keep dead letters and
// unrouted events: quorum, so they survive what the module queues survive.
func keeperQueueArgs() amqp.Table {
	return amqp.Table{"x-queue-type": QueueQuorum}
}

// moduleQueueArgs builds a module queue's arguments for its type. The two
// types accept different arguments and a wrong one is a 406 that closes the
// channel (rabbitmq-3.10-facts.md), so they are never shared.
func moduleQueueArgs(mc ModuleConfig) amqp.Table {
	args := amqp.Table{
		"x-queue-type":           mc.QueueType,
		"x-dead-letter-exchange": wire.ExchangeDead,
	}
	switch mc.QueueType {
	case QueueQuorum:
		// The broker dead-letters a message returned for the
		// MaxAttempts-th time. The runtime dead-letters it itself, with
		// the last error, when it sees the last attempt fail; the
		// broker's limit covers what the runtime cannot see, such as a
		// consumer that crashes on every attempt.
		args["x-delivery-limit"] = int64(mc.MaxAttempts - 1)
	case QueueClassic:
		if mc.MaxPriority > 0 {
			args["x-max-priority"] = int64(mc.MaxPriority)
		}
	}
	return args
}
