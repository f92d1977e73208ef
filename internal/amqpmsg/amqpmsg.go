// Package amqpmsg copies a delivered AMQP message for publishing again: to
// the dead letters, back to a classic queue with its attempt count, or from
// the dead letters back to the queue that gave up on it. The copy keeps the
// body, id and properties, is persistent, and leaves out the headers the
// caller says to drop.
//
//	msg := amqpmsg.Republishing(d, amqpmsg.BrokerAdded)
package amqpmsg

import (
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// Republishing copies d for publishing again, without the headers drop
// reports true for. It has room for a few headers more. It does not copy
// the user-id: the broker refuses one other than the publishing
// connection's, so whoever publishes the copy sets its own (ConnUser) and
// keeps the original's in x-mesh-user-id.
func Republishing(d amqp.Delivery, drop func(header string) bool) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+5)
	for k, v := range d.Headers {
		if !drop(k) {
			headers[k] = v
		}
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// BrokerAdded reports the headers the broker adds on delivery and
// dead-lettering: x-delivery-count, x-death, x-first-death-* and
// x-last-death-*.
func BrokerAdded(header string) bool {
	return header == "x-delivery-count" || header == "x-death" ||
		strings.HasPrefix(header, "x-first-death-") || strings.HasPrefix(header, "x-last-death-")
}

// Bookkeeping reports the headers no copy takes over from the message it
// copies: the broker's (BrokerAdded) and the runtime's own, x-mesh-*. The
// publisher of the copy sets the runtime's headers it means, so none is
// carried along from a message that may have come with forged ones.
func Bookkeeping(header string) bool {
	return BrokerAdded(header) || strings.HasPrefix(header, "x-mesh-")
}

// ConnUser is the broker user conn authenticated as (PLAIN or AMQPLAIN,
// as amqp091-go dials a URL), the only user-id the broker accepts on what
// conn publishes; "" when the mechanism names none (EXTERNAL).
func ConnUser(conn *amqp.Connection) string {
	for _, a := range conn.Config.SASL {
		switch a := a.(type) {
		case *amqp.PlainAuth:
			return a.Username
		case *amqp.AMQPlainAuth:
			return a.Username
		}
	}
	return ""
}

// IsHistoryMarker reports whether d is a replay's marker in the history:
// sent straight to the stream, by a publisher the broker verified, with
// the header. The same header on an event routed through mesh.events is
// the emitter's, and does not make it one.
func IsHistoryMarker(d amqp.Delivery) bool {
	_, ok := d.Headers[wire.HeaderHistoryMarker]
	return ok && d.Exchange == "" && d.UserId != ""
}
