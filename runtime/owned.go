package runtime

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// Headers the runtime owns (x-mesh-*) are honoured only where the runtime
// put them (SPEC §6, docs/adr/0001-event-wire-contract.md "Headers the
// runtime owns"). Anyone allowed to publish writes whatever headers it
// likes, and the broker checks only the user-id property, so:
//
//   - a delivery that came through an exchange (mesh.events: every
//     emitter's) is of the type its routing key says, from the user its
//     user-id says, and has made no earlier attempt, whatever its x-mesh-*
//     headers claim;
//   - x-mesh-routing-key is honoured on a delivery that came through the
//     default exchange straight into the queue (its routing key is then the
//     queue's name) with a user-id, the broker having verified who sent it:
//     the node's own classic-queue retry, meshctl's replay to one queue. A
//     direct delivery that carries it without a user-id is malformed;
//   - x-mesh-user-id and x-mesh-attempt are honoured only on a direct
//     delivery whose user-id is the node's own broker user: the node's own
//     retry copy, which it publishes as itself and which keeps the original
//     publisher's user in x-mesh-user-id. (Another node or meshctl sharing
//     that broker user is the same principal to the broker, and to the
//     node.)

// origin is what a delivery says of the event it carries, the runtime's
// own headers read by the rules above.
type origin struct {
	eventType string // the event type
	userID    string // the original publisher's broker user (sdk.Event.UserID)
	own       bool   // the node sent it straight to the queue itself: its x-mesh-attempt counts
}

// originOf reads d's origin. The error says why d is malformed (a direct
// delivery claiming a type without a verified publisher, or a runtime
// header of the wrong type); the origin is then read from the broker's
// properties alone.
func (n *Node) originOf(d amqp.Delivery) (origin, error) {
	o := origin{eventType: d.RoutingKey, userID: d.UserId}
	if d.Exchange != "" {
		return o, nil // through an exchange: its routing key is the type
	}
	if v, ok := d.Headers[wire.HeaderRoutingKey]; ok {
		rk, isText := v.(string)
		switch {
		case !isText:
			return o, &wire.MalformedError{Reason: fmt.Sprintf("header %s is %T, want a string", wire.HeaderRoutingKey, v)}
		case d.UserId == "":
			return o, &wire.MalformedError{Reason: fmt.Sprintf("header %s %q on a message sent straight to queue %s without a user-id: "+
				"the runtime honours its own headers only from a publisher the broker verified, so its type is not known", wire.HeaderRoutingKey, truncateText(rk, 300), d.RoutingKey)}
		}
		o.eventType = rk
	}
	if n.userID == "" || d.UserId != n.userID {
		return o, nil
	}
	o.own = true
	if v, ok := d.Headers[wire.HeaderUserID]; ok {
		u, isText := v.(string)
		if !isText {
			return o, &wire.MalformedError{Reason: fmt.Sprintf("header %s is %T, want a string", wire.HeaderUserID, v)}
		}
		o.userID = u
	}
	return o, nil
}
