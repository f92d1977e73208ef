// Package wire holds the event wire contract that the sdk and the runtime
// share: the names of the exchanges, queues and headers, the rules for event
// types, patterns and names, and the decoding of an event's metadata from its
// headers.
//
// It imports neither the sdk nor amqp091-go: headers arrive as the plain
// map[string]any that an AMQP table is, so the same rules serve the runtime,
// the command line and, later, the in-memory test mesh.
//
//	if err := wire.ValidateEventType("module.umami.site.created"); err != nil {
//		return err // names the rule that broke
//	}
package wire
