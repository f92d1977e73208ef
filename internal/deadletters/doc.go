// Package deadletters browses and acts on the messages in the mesh's two
// keeper queues: mesh.dead-letters, where the runtime (or, as a backstop,
// the broker) sets aside events a module gave up on, and mesh.unrouted,
// where the alternate exchange keeps events no queue was bound for
// (docs/adr/0005-dead-letters-and-unrouted-events.md). It is what
// `meshctl dlq` and `meshctl unrouted` run.
//
// # Operations
//
//   - [List] and [Show] read messages and leave every one in place.
//   - [Replay] sends dead letters back to only the queue that gave up, with
//     their original id, headers and body and the attempts starting over;
//     it sends unrouted events to mesh.events again. A message leaves the
//     keeper queue only after the broker confirmed its copy.
//   - [Purge] deletes the matching messages, and only those.
//
// Each selects messages with a [Filter] (module, node, event type pattern,
// age, ids) and takes per-call [Option]s ([DryRun], [WithProgress]).
//
// # How a queue is browsed
//
// AMQP has no "peek". Each call consumes the queue with manual
// acknowledgements on a channel of its own, reading at most as many
// messages as a passive declare counted at the start and stopping early if
// none arrives within the idle timeout ([DefaultIdleTimeout]; the first
// message of each consumer it starts may take 10 s, as a quorum queue
// registers a consumer through its log, which a busy broker is slow to
// write). It holds
// every message unacknowledged, acknowledges the ones it replayed or purged
// and gives the others back by cancelling its consumer and closing the
// channel, so a crash at any point loses nothing (at worst a replayed event
// is also still kept: replay is at least once). It cannot give a message
// back as soon as it has read it: a message given back goes to the head of
// the queue, and the browse would read it again instead of the next. So
// while a call runs, the messages it holds are invisible to other
// consumers of the keeper queue (such as a second meshctl, or a replay
// that began after it: one that counts and finds only the messages not
// held), and each message given back raises its x-delivery-count, which a
// keeper queue (no delivery limit) ignores and a replay strips.
//
// The broker sends a browse a window of messages at a time, as many as
// about 8 MiB of bodies at the largest size read so far (between 1 and 512
// messages), so the client buffers no more than that however deep the
// queue. What a call keeps is what it returns: [List] with [Summaries]
// keeps of each message its fields alone (a few hundred bytes, at most 8
// KiB), and with [WithBodyLimit] a bounded part of each body.
//
// Use a connection without automatic recovery: delivery tags do not survive
// a reconnect.
//
// # Example
//
//	conn, err := amqp.Dial(url)
//	if err != nil {
//		return err
//	}
//	defer conn.Close()
//	f := deadletters.Filter{Module: "billing", Type: "module.shop.order.#"}
//	msgs, err := deadletters.List(ctx, conn, wire.QueueDead, f)
//	if err != nil {
//		return err
//	}
//	for _, m := range msgs {
//		fmt.Println(m.ID, m.Type, m.Reason, m.Error)
//	}
//	res, err := deadletters.Replay(ctx, conn, wire.QueueDead, f)
//	if err != nil {
//		return err
//	}
//	for _, l := range res.Left { // e.g. the module's queue is gone
//		fmt.Println("left", l.ID, l.Err)
//	}
package deadletters
