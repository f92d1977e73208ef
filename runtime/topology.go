package runtime

import (
	"fmt"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// BrokerObject is an exchange or a queue the mesh declares, as it
// declares it. meshctl topology prints and checks them.
type BrokerObject struct {
	// Kind is "exchange" or "queue".
	Kind string
	// Name is the object's name; Type the exchange's type (topic,
	// fanout) or the queue's (quorum, classic).
	Name, Type string
	// Durable, Exclusive and AutoDelete are the declare's flags.
	Durable, Exclusive, AutoDelete bool
	// Args are the declare's arguments.
	Args amqp.Table
	// Binds says what the object is bound to, in words.
	Binds string
	// Bindings are the queue's bindings, each to be there and no other,
	// when BindingsKnown. A module queue's come from the node's binding
	// record (its state dir), since the patterns are the module's Setup's
	// to say; without the record they are not known.
	Bindings      []Binding
	BindingsKnown bool
	// When, if not empty, says in which cases alone the object exists: a
	// module's dead-letter queue if it takes dead letters, its event queue
	// if it subscribes event patterns.
	When string
}

// Binding is a queue's binding to an exchange with a routing key (a
// topic pattern, or "" for a fanout exchange).
type Binding struct {
	Exchange, Key string
}

// MeshObjects are the exchanges and keeper queues every node declares,
// identically (rabbitmq-3.10-facts.md, item 4: differing arguments are a
// 406 on redeclare).
func MeshObjects() []BrokerObject {
	return []BrokerObject{
		{Kind: "exchange", Name: wire.ExchangeUnrouted, Type: amqp.ExchangeFanout, Durable: true},
		{Kind: "exchange", Name: wire.ExchangeEvents, Type: amqp.ExchangeTopic, Durable: true,
			Args: amqp.Table{"alternate-exchange": wire.ExchangeUnrouted}},
		{Kind: "exchange", Name: wire.ExchangeRPC, Type: amqp.ExchangeTopic, Durable: true},
		{Kind: "exchange", Name: wire.ExchangeDead, Type: amqp.ExchangeTopic, Durable: true},
		{Kind: "queue", Name: wire.QueueUnrouted, Type: QueueQuorum, Durable: true, Args: keeperQueueArgs(),
			Binds: wire.ExchangeUnrouted, Bindings: []Binding{{wire.ExchangeUnrouted, ""}}, BindingsKnown: true},
		{Kind: "queue", Name: wire.QueueDead, Type: QueueQuorum, Durable: true, Args: keeperQueueArgs(),
			Binds: wire.ExchangeDead + ` with "#"`, Bindings: []Binding{{wire.ExchangeDead, "#"}}, BindingsKnown: true},
	}
}

// NodeObjects are the queues node declares for itself and for its modules
// (mcs by module name; zero fields take the defaults of cfg): the lock
// queue, each module's event queue and dead-letter queue. A module queue's
// bindings are those the node's binding record in cfg.StateDir holds, if
// it has one for the queue. The serve queues of the tools they serve are
// shared by every server and declared by the first; their names come from
// the modules' Setup, not from the config.
func NodeObjects(cfg Config, mcs map[string]ModuleConfig) ([]BrokerObject, error) {
	cfg.withDefaults()
	objs := []BrokerObject{{Kind: "queue", Name: wire.NodeLockQueue(cfg.Node), Type: QueueClassic, Exclusive: true, AutoDelete: true,
		Args: amqp.Table{"x-queue-type": QueueClassic}, Binds: "nothing: held by the running node's connection", BindingsKnown: true}}
	record := bindingRecord{dir: cfg.StateDir}
	names := make([]string, 0, len(mcs))
	for name := range mcs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		mc := mcs[name].over(cfg.Module)
		queue := BrokerObject{Kind: "queue", Name: wire.ModuleQueue(cfg.Node, name), Type: mc.QueueType, Durable: true, Args: moduleQueueArgs(mc),
			Binds: wire.ExchangeEvents + " with the patterns the module subscribes"}
		events := &queue
		var group BrokerObject
		if mc.Group != "" {
			// A group's member: its group's queue takes the events, its
			// own is bound to nothing and keeps what it retries.
			group = BrokerObject{Kind: "queue", Name: wire.GroupQueue(mc.Group, name), Type: mc.QueueType, Durable: true, Args: moduleQueueArgs(mc),
				Binds: wire.ExchangeEvents + " with the patterns the module subscribes (group " + mc.Group + ", shared by its members)"}
			events = &group
			queue.Binds = "nothing: the node's retries of the group's events (group " + mc.Group + ")"
			queue.BindingsKnown = true
		}
		patterns, ok, err := record.recorded(events.Name)
		if err != nil {
			return nil, err
		}
		if ok {
			events.BindingsKnown = true
			for _, p := range patterns {
				events.Bindings = append(events.Bindings, Binding{wire.ExchangeEvents, p})
			}
		}
		if len(patterns) == 0 {
			// A module that subscribes no pattern (an agent serving tools)
			// has no event queue; without a record, that is not known here.
			queue.When = "only if the module subscribes event patterns"
			if mc.Group != "" {
				group.When = queue.When
			}
		}
		// The dead-letter queue is bound with the module's dead_letters
		// grant (# with none in-process), as its binding record says.
		deadPatterns := mc.DeadLetterGrants
		if deadPatterns == nil {
			deadPatterns = []string{"#"}
		}
		if recorded, ok, err := record.recorded(wire.ModuleDeadQueue(cfg.Node, name)); err != nil {
			return nil, err
		} else if ok {
			deadPatterns = recorded
		}
		dead := BrokerObject{Kind: "queue", Name: wire.ModuleDeadQueue(cfg.Node, name), Type: QueueQuorum, Durable: true, Args: deadQueueArgs(mc),
			Binds: wire.ExchangeDead + " with the event types of its dead_letters grant", BindingsKnown: true, When: "only if the module takes dead letters"}
		for _, p := range deadPatterns {
			dead.Bindings = append(dead.Bindings, Binding{wire.ExchangeDead, p})
		}
		objs = append(objs, queue)
		switch {
		case mc.Partitions > 0:
			e, err := loadEpoch(record, mc.Group, name, mc.Partitions) // the count the node last knew (meshctl groups repartition)
			if err != nil {
				return nil, err
			}
			objs = append(objs, orderedObjects(mc, name, group.When, e)...)
		case mc.Group != "":
			objs = append(objs, group)
		}
		objs = append(objs, dead)
	}
	if cfg.Delays {
		objs = append(objs, dueQueueObject(cfg.Node))
	}
	if cfg.History.Stream != "" {
		objs = append(objs, HistoryObject(cfg.History))
	}
	return objs, nil
}

// orderedObjects are what a group that keeps order by key declares
// (partitions.go): its headers exchange, bound to mesh.events with the
// module's patterns (under an order_key, its intake exchange is, instead),
// its intake exchange and queue, and its partitions,
// each bound to the headers exchange on its slots (the binding is
// checked, not the slots it matches; nor the exchange's own bindings to
// mesh.events).
func orderedObjects(mc ModuleConfig, module, when string, e groupEpoch) []BrokerObject {
	exchange, intake := wire.GroupExchange(mc.Group, module), wire.GroupIntake(mc.Group, module)
	args := partitionQueueArgs(mc)
	byPatterns := wire.ExchangeEvents + " with the patterns the module subscribes (group " + mc.Group + ", ordered by key)"
	intakeBinds, exchangeBinds := "", byPatterns
	if mc.OrderKey != "" {
		// Under a rule every event comes in through the intake, which
		// keys it and sends it on to the exchange.
		intakeBinds, exchangeBinds = byPatterns+", keyed by order_key "+mc.OrderKey, ""
	}
	objs := []BrokerObject{
		{Kind: "exchange", Name: intake, Type: amqp.ExchangeFanout, Durable: true, Binds: intakeBinds, When: when},
		{Kind: "exchange", Name: exchange, Type: amqp.ExchangeHeaders, Durable: true, Args: amqp.Table{"alternate-exchange": intake},
			Binds: exchangeBinds, When: when},
		{Kind: "queue", Name: intake, Type: QueueQuorum, Durable: true, Args: args, Binds: intake,
			Bindings: []Binding{{intake, ""}}, BindingsKnown: true, When: when},
	}
	if e.Number > 0 {
		objs = append(objs, BrokerObject{Kind: "exchange", Name: wire.EpochExchange(mc.Group, module, e.Number), Type: amqp.ExchangeFanout, Durable: true,
			Binds: fmt.Sprintf("nothing: it says the group's partition count changed to %d (epoch %d, meshctl groups repartition)", e.Count, e.Number), When: when})
	}
	for i := range e.Count {
		objs = append(objs, BrokerObject{Kind: "queue", Name: wire.PartitionQueueOf(mc.Group, module, e.Number, i), Type: QueueQuorum, Durable: true, Args: args,
			Binds:    fmt.Sprintf("%s on its slots (those equal to %d modulo %d)", exchange, i, e.Count),
			Bindings: []Binding{{exchange, ""}}, BindingsKnown: true, When: when})
	}
	return objs
}

// declareTopology declares the mesh's exchanges and the queues that keep
// dead letters and unrouted events (MeshObjects), and binds the queues.
func declareTopology(ch *amqp.Channel) error {
	for _, o := range MeshObjects() {
		if o.Kind != "exchange" {
			continue
		}
		if err := ch.ExchangeDeclare(o.Name, o.Type, o.Durable, o.AutoDelete, false, false, o.Args); err != nil {
			return fmt.Errorf("declare exchange %s: %w", o.Name, err)
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
