package deadletters

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/cloudevents"
	"github.com/meshkit/mesh/internal/wire"
)

// Message is one message kept in a keeper queue, as read from its
// properties and headers. Reading never fails: a header that is missing or
// of the wrong type leaves its field empty.
type Message struct {
	// ID is the AMQP message id, or the x-event-id header when the message
	// id is missing.
	ID string
	// Type is the event type. For a dead letter the runtime made it is the
	// routing key (the runtime dead-letters with the type as the key),
	// whatever the headers say. For one the broker made, and for an
	// unrouted event, it is the routing key too, unless the message had
	// been sent straight to a queue (default exchange: the key is the
	// queue's name) by a publisher the broker verified (a user-id): then it
	// is the x-mesh-routing-key header, as the consuming node read it (a
	// classic-queue retry copy, an event a node kept in mesh.unrouted).
	Type string
	// UserID is the broker user that published the event, as its consumer
	// saw it (sdk.Event.UserID). On a dead letter the runtime made it is
	// the x-mesh-user-id header, if the dead letter carries a user-id (the
	// dead-lettering node, checked by the broker: DeadBy); on one the
	// broker made, the message's user-id, or x-mesh-user-id on a copy sent
	// straight to the queue by a verified publisher (a node's retry copy);
	// on an unrouted event, its user-id.
	UserID string
	// DeadBy is the user-id of a dead letter the runtime made: the broker
	// user of the node that dead-lettered it (the broker checked it). Empty
	// for a dead letter the broker made, an older node's, and an unrouted
	// event.
	DeadBy string
	// Exchange and RoutingKey are as delivered: mesh.events.dead and the
	// event type for a dead letter, mesh.events and the event type for an
	// unrouted event.
	Exchange, RoutingKey string
	// Source and SourceNode are the emitting module and node (x-source,
	// x-node).
	Source, SourceNode string

	// Queue is the queue that gave up on a dead letter: x-mesh-dead-queue,
	// or for a dead letter the broker made, the queue of its latest
	// x-death entry. Empty for an unrouted event. A dead letter the broker
	// made (its x-death or x-*-death-* name a queue) is read from what the
	// broker says alone: x-mesh-dead-* headers on it came with the message
	// that died, from whoever published it, and are not the runtime's.
	Queue string
	// Node and Module are read from Queue when it is a module queue
	// (<node>.<module>.events), and empty otherwise; Group and Module when
	// it is a group's (group.<group>.<module>.events: the node is not
	// known from the queue, which the group's members share).
	Node, Module, Group string
	// Reason is why the message was dead-lettered (x-mesh-dead-reason, or
	// the broker's x-death reason such as "delivery_limit" or "expired").
	Reason string
	// Error is the handler's last error (x-mesh-dead-error).
	Error string
	// Attempts is how many times the handler was tried
	// (x-mesh-dead-attempts); 0 when unknown.
	Attempts int

	// Time is when the message was dead-lettered (x-mesh-dead-time, else
	// the latest x-death time) or, for an unrouted event, when it arrived
	// (x-death time, else the timestamp property, else x-time). It is UTC,
	// and zero when nothing says.
	Time time.Time

	// ContentType is the content type property.
	ContentType string
	// Size is the body's length in bytes.
	Size int
	// Headers are all headers as delivered, including the broker's
	// (x-death, x-delivery-count).
	Headers amqp.Table
	// Body is the body as delivered.
	Body []byte
}

// moduleFor is the name the module filter compares: for a dead letter
// the module whose queue gave up, for an unrouted event the module that
// emitted it.
func (m Message) moduleFor(dead bool) string {
	if dead {
		return m.Module
	}
	return m.Source
}

// nodeFor is the node the node filter compares, as moduleFor.
func (m Message) nodeFor(dead bool) string {
	if dead {
		return m.Node
	}
	return m.SourceNode
}

// messageOf reads a delivery from a keeper queue: the dead letters' queue
// when dead, else the unrouted events'.
//
// The runtime's own headers (x-mesh-*) are honoured only where the
// runtime put them (SPEC §6): a message's headers are whatever its
// publisher wrote, and the broker keeps them when it dead-letters it.
//   - A dead letter the runtime made is published by a node to
//     mesh.events.dead with the event type as its routing key and its own
//     x-mesh-dead-* headers, and no x-death (it drops the broker's): its
//     type is the routing key, its x-mesh-user-id is honoured if it
//     carries a user-id (the broker checked the dead-lettering node's).
//   - A dead letter the broker made (its x-death, x-*-death-* name a
//     queue) is read from the broker's headers: its x-mesh-dead-* came
//     with the message that died. If that message had been sent straight
//     to its queue (the death's exchange is the default one) by a
//     verified publisher (a user-id), its x-mesh-routing-key and
//     x-mesh-user-id are honoured, as the consuming node honoured them.
//   - An unrouted event is of its routing key's type, unless it was sent
//     straight to mesh.unrouted (by a node that kept it there itself) with
//     a user-id: then of its x-mesh-routing-key.
func messageOf(d amqp.Delivery, dead bool) Message {
	h := d.Headers
	m := Message{
		ID:          d.MessageId,
		Type:        d.RoutingKey,
		Exchange:    d.Exchange,
		RoutingKey:  d.RoutingKey,
		UserID:      d.UserId,
		Source:      text(h[wire.HeaderSource]),
		SourceNode:  text(h[wire.HeaderNode]),
		ContentType: d.ContentType,
		Size:        len(d.Body),
		Headers:     h,
		Body:        d.Body,
	}
	if m.ID == "" {
		m.ID = text(h[wire.HeaderEventID])
	}
	if m.ID == "" || m.Source == "" {
		// A CloudEvent a module consumed and gave up on: its id and
		// source, as Consume read them (ADR 34).
		if ce, ok, err := cloudevents.Read(h, d.ContentType, d.Body); ok && err == nil {
			m.ID = cmp.Or(m.ID, ce.ID)
			m.Source = cmp.Or(m.Source, ce.Source)
		}
	}
	death, byBroker := latestDeath(h)
	// direct: the message (the one that died, for a broker-made dead
	// letter) was sent straight to a queue by a publisher the broker
	// verified, so its x-mesh-routing-key and x-mesh-user-id are what
	// the consuming node honoured.
	direct := d.UserId != "" && ((!dead && d.Exchange == "") || (dead && byBroker && death.Exchange == "" && death.ExchangeKnown))
	if rk := text(h[wire.HeaderRoutingKey]); rk != "" && direct {
		m.Type = rk
	}
	switch {
	case dead && !byBroker:
		m.Queue = text(h[wire.HeaderDeadQueue])
		m.Reason = text(h[wire.HeaderDeadReason])
		m.Error = text(h[wire.HeaderDeadError])
		if n, ok := integer(h[wire.HeaderDeadAttempts]); ok && n > 0 && n <= 1<<31 {
			m.Attempts = int(n)
		}
		m.DeadBy = d.UserId
		m.UserID = ""
		if d.UserId != "" {
			m.UserID = text(h[wire.HeaderUserID])
		}
	case direct:
		if u, ok := h[wire.HeaderUserID]; ok {
			m.UserID = text(u)
		}
	}
	if m.Queue == "" {
		m.Queue = death.Queue
	}
	if m.Reason == "" {
		m.Reason = death.Reason
	}
	m.Node, m.Module, _ = splitModuleQueue(m.Queue)
	if g, module, ok := wire.GroupOfQueue(m.Queue); ok {
		m.Group, m.Module = g, module
	}
	// A dead letter's timestamp and x-time say when the event was emitted,
	// not when it died, so they are no stand-in for the dead time.
	times := []time.Time{death.Time}
	if dead && !byBroker {
		times = []time.Time{parseTime(text(h[wire.HeaderDeadTime]))}
	}
	if !dead {
		times = []time.Time{death.Time, d.Timestamp, parseTime(text(h[wire.HeaderTime]))}
	}
	for _, t := range times {
		if !t.IsZero() {
			m.Time = t
			break
		}
	}
	if !m.Time.IsZero() {
		m.Time = m.Time.UTC()
	}
	return m
}

// death is what the broker says about the latest time it dead-lettered a
// message. Exchange is the exchange the message had been published to
// ("" for the default exchange), when ExchangeKnown.
type death struct {
	Queue, Reason, Exchange string
	ExchangeKnown           bool
	Time                    time.Time
}

// latestDeath reads the broker's dead-lettering headers: the first entry of
// x-death (the most recent one), then x-last-death-* (RabbitMQ 3.13+), then
// x-first-death-*. Entries of the wrong type are skipped. byBroker says
// whether they name a queue: the broker dead-lettered the message (it
// always names the queue, first in x-death; the runtime drops those
// headers from the dead letters it makes, so only a publisher's junk
// names none).
func latestDeath(h amqp.Table) (d death, byBroker bool) {
	defer func() { byBroker = d.Queue != "" }()
	if list, ok := h["x-death"].([]any); ok {
		for _, e := range list {
			t, ok := table(e)
			if !ok {
				continue
			}
			d.Queue = text(t["queue"])
			d.Reason = text(t["reason"])
			d.Time, _ = t["time"].(time.Time)
			d.Exchange, d.ExchangeKnown = textOK(t["exchange"])
			break
		}
	}
	for _, prefix := range []string{"x-last-death-", "x-first-death-"} {
		if d.Queue == "" {
			d.Queue = text(h[prefix+"queue"])
		}
		if d.Reason == "" {
			d.Reason = text(h[prefix+"reason"])
		}
		if !d.ExchangeKnown {
			d.Exchange, d.ExchangeKnown = textOK(h[prefix+"exchange"])
		}
	}
	return d, byBroker
}

// splitModuleQueue reads a module queue name, <node>.<module>.events (see
// wire.ModuleQueue), into its node and module. Node and module names are
// single words, so any other shape is not a module queue.
func splitModuleQueue(queue string) (node, module string, ok bool) {
	rest, found := strings.CutSuffix(queue, ".events")
	if !found {
		return "", "", false
	}
	node, module, found = strings.Cut(rest, ".")
	if !found || node == "" || module == "" || strings.Contains(module, ".") {
		return "", "", false
	}
	return node, module, true
}

// parseTime reads an RFC 3339 time, zero when s is not one.
func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t.UTC()
}

// text reads a header value sent as text: an AMQP long string (string) or a
// byte array, which other clients use for text.
func text(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	}
	return ""
}

// textOK is text that also says whether v was text at all.
func textOK(v any) (string, bool) {
	switch v.(type) {
	case string, []byte:
		return text(v), true
	}
	return "", false
}

// integer reads any AMQP integer header value.
func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

// table reads a nested AMQP table.
func table(v any) (amqp.Table, bool) {
	switch t := v.(type) {
	case amqp.Table:
		return t, true
	case map[string]any:
		return amqp.Table(t), true
	}
	return nil, false
}

// ReadDead reads a dead letter as delivered from mesh.events.dead (or a
// queue bound to it), whoever dead-lettered it: the runtime (x-mesh-dead-*
// headers) or the broker (x-death). Like every read here, it never fails.
func ReadDead(d amqp.Delivery) Message { return messageOf(d, true) }

// HeaderText formats a header value as text: a string or byte array as
// is, a time in RFC 3339, anything else as Go prints it.
func HeaderText(v any) string {
	switch v := v.(type) {
	case string, []byte:
		return text(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}
