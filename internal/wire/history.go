package wire

import amqp "github.com/rabbitmq/amqp091-go"

// HeaderStreamOffset is where a delivery from the mesh's history (a
// stream, ADR 35) carries its offset: a long, the broker's.
const HeaderStreamOffset = "x-stream-offset"

// HeaderHistoryMarker marks a message a replay from the history puts into
// the stream itself (through the default exchange, with its user-id: the
// broker checks both) to fix its cutoff: what the stream holds before the
// marker is replayed, what comes after never is. Its value is the
// replay's id. A History reader skips it.
const HeaderHistoryMarker = "x-mesh-history-marker"

// IsHistoryMarker reports whether d is a replay's marker in the history:
// sent straight to the stream, by a publisher the broker verified, with
// the header. The same header on an event routed through mesh.events is
// the emitter's, and does not make it one.
func IsHistoryMarker(d amqp.Delivery) bool {
	_, ok := d.Headers[HeaderHistoryMarker]
	return ok && d.Exchange == "" && d.UserId != ""
}
