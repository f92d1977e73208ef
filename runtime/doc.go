// Package runtime is the mesh node: it connects to RabbitMQ, declares the
// mesh's topology, publishes events with confirms and runs modules
// in-process, giving each its sdk.Mesh.
//
// # Topology
//
// Every node declares, identically and idempotently: the topic exchanges
// mesh.events (with the alternate exchange mesh.events.unrouted, whose
// queue mesh.unrouted keeps events no module consumes), mesh.rpc and
// mesh.events.dead (whose queue mesh.dead-letters keeps every dead letter).
// Each module that consumes gets one durable queue <node>.<module>.events,
// quorum by default, bound to exactly the patterns it subscribes.
//
// # Publishing
//
// Events are published persistent and mandatory on a confirm-mode channel;
// Emit returns once the broker confirmed the event. Confirms are pipelined:
// concurrent emits share the channel and each waits only for its own.
//
// # Consuming
//
// Deliveries are acknowledged after the handler returns nil. A failed
// attempt (an error, a panic, a handler past its timeout) is tried again
// after an exponential back-off, up to ModuleConfig.MaxAttempts, then
// dead-lettered with its original id, headers, body and routing key plus
// the queue, the attempt count, the reason and the last error. Quorum
// queues count attempts on the broker; on classic queues the runtime counts
// them itself. Messages that break the wire contract are dead-lettered at
// once and never reach a handler.
//
// # Use
//
//	node, err := runtime.New(ctx, runtime.Config{Node: "anchor"})
//	if err != nil {
//		return err
//	}
//	defer node.Close(ctx)
//	mod, err := node.Load(ctx, myModule, runtime.ModuleConfig{})
package runtime
