package wire

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Exchanges, all durable, declared identically by every node.
const (
	// ExchangeEvents is the topic exchange every event rides.
	ExchangeEvents = "mesh.events"
	// ExchangeRPC is the topic exchange tool invocations ride.
	ExchangeRPC = "mesh.rpc"
	// ExchangeDead is the topic exchange dead letters are published to, with
	// the event's original routing key.
	ExchangeDead = "mesh.events.dead"
	// ExchangeUnrouted is the fanout exchange set as mesh.events' alternate
	// exchange: it receives every event no queue is bound for.
	ExchangeUnrouted = "mesh.events.unrouted"
)

// Queues the topology keeps for operators.
const (
	// QueueDead keeps every dead letter (bound to ExchangeDead with "#").
	QueueDead = "mesh.dead-letters"
	// QueueUnrouted keeps every event no module consumed.
	QueueUnrouted = "mesh.unrouted"
)

// Headers of the event contract (SPEC §1).
const (
	HeaderEventID     = "x-event-id"
	HeaderSource      = "x-source"
	HeaderNode        = "x-node"
	HeaderTime        = "x-time"
	HeaderCausationID = "x-causation-id"
	HeaderSchema      = "x-schema"

	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"

	// ContentTypeJSON is the only content type an event may carry.
	ContentTypeJSON = "application/json"
)

// Headers the runtime adds for its own bookkeeping. They start with x-mesh-
// so they never collide with an emitter's own x- headers, and they are
// honoured only where the runtime put them (SPEC §6, ADR 1 "Headers the
// runtime owns"): anyone may publish any header, so a consumer never takes
// one from a message that came through an exchange (mesh.events carries
// every emitter's messages), only from one sent straight to its queue
// through the default exchange by a publisher the broker verified (the
// user-id property), as the node's own retries and meshctl's replays are.
const (
	// HeaderAttempt is the number of attempts already made on a classic
	// queue, which counts nothing itself (the runtime republishes a failed
	// event with this header raised by one). Honoured only on a message
	// the node itself sent straight to the queue (user-id its own).
	HeaderAttempt = "x-mesh-attempt"
	// HeaderRoutingKey keeps the original routing key, the event type, on
	// an event sent straight to a queue (the default exchange's routing key
	// is the queue's name): a classic-queue retry, a replay to one queue,
	// an event a node kept in mesh.unrouted itself. Honoured only on a
	// message that came through the default exchange with a user-id; one
	// without a user-id that carries it is dead-lettered as malformed. A
	// message through an exchange is of its routing key's type, whatever
	// this header says.
	HeaderRoutingKey = "x-mesh-routing-key"
	// HeaderUserID keeps the user-id of the original publisher on a
	// message the runtime or meshctl publishes again under its own broker
	// user (the broker refuses a user-id other than the publishing
	// connection's): a classic-queue retry, a dead letter, a replay. ""
	// says the original had none. A node honours it only on a message it
	// sent straight to its own queue (through the default exchange, with
	// its own user-id); a dead letter's is honoured when the dead letter
	// carries a user-id (the dead-lettering node's, deadletters.Message).
	HeaderUserID = "x-mesh-user-id"
	// HeaderSuspect marks a copy of an event that was in flight when its
	// module process exited: a suspect, which the node hands its module
	// process alone until the process survives it (ADR 38, amendment).
	// Its value is how many times the process exited while handling the
	// event alone (0: only in a crowd, which counts no attempt). Honoured
	// only on a message the node itself sent straight to the queue
	// (user-id its own), as HeaderAttempt; never carried into a dead
	// letter.
	HeaderSuspect = "x-mesh-suspect"

	// HeaderDeadQueue names the queue that gave up on a dead letter.
	HeaderDeadQueue = "x-mesh-dead-queue"
	// HeaderDeadAttempts is how many times the handler was tried.
	HeaderDeadAttempts = "x-mesh-dead-attempts"
	// HeaderDeadReason is why: one of the DeadReason values.
	HeaderDeadReason = "x-mesh-dead-reason"
	// HeaderDeadError is the last error, as text.
	HeaderDeadError = "x-mesh-dead-error"
	// HeaderDeadTime is when the runtime gave up, RFC 3339 UTC.
	HeaderDeadTime = "x-mesh-dead-time"
)

// HeaderDue marks a delayed event (sdk.After, sdk.At): when it was due,
// RFC 3339 UTC, set by the emitting node. Handlers see it in
// Event.Headers. Like x-replay-id it informs and decides nothing: the
// delay cascade's routing key, not this header, is what delays an event.
const HeaderDue = "x-due"

// HeaderScheduledBy is, on a delayed event the mover delivered, the
// broker user that scheduled it (the schedule's user-id, which the broker
// verified): the mover publishes as its node's own user, so this is what
// keeps an operator's schedule sent through a node (meshctl emit --after)
// the operator's in the audit log. Set by the mover, whatever the
// schedule carried; like x-due it informs and decides nothing.
const HeaderScheduledBy = "x-scheduled-by"

// The records a node emits of its schedules (ADR 32), as
// node.<node>.delay.<what>: one that it scheduled an event or a retry
// (caused by that event, its book entry as the body), one that it was
// cancelled.
const (
	NodeDelayScheduled = "scheduled"
	NodeDelayCancelled = "cancelled"
	// NodeDelayDropped: a schedule came due whose module is no longer
	// on the node or no longer granted its type, and was not delivered:
	// it was set aside in the dead letters (reason DeadReasonRevoked).
	NodeDelayDropped = "dropped"
)

// NodeDelayEvent is the type of node's record what of a schedule.
func NodeDelayEvent(node, what string) string { return "node." + node + ".delay." + what }

// HeaderReplayID marks an event replayed from the audit log: its value is
// the replay's id. Handlers see it in Event.Headers, so a consumer can
// tell a replay from the first delivery.
const HeaderReplayID = "x-replay-id"

// Reasons a dead letter gives in HeaderDeadReason.
const (
	DeadReasonPermanent     = "permanent"      // the handler said the error is permanent
	DeadReasonDeliveryLimit = "delivery_limit" // every attempt failed
	DeadReasonForbidden     = "forbidden"      // the handler's emit or call was not granted (ErrForbidden): no retry could succeed
	DeadReasonMalformed     = "malformed"      // the message breaks the contract
	DeadReasonSchema        = "schema"         // its x-schema is not a version its handler reads (sdk.Module.Reads)
	DeadReasonNoHandler     = "no_handler"     // no subscribed pattern matches it (a binding left from an earlier run)
	DeadReasonExpired       = "expired"        // its x-deadline passed before a handler took it (a consumed queue's message)
	DeadReasonConflict      = "conflict"       // its id was handled with other content (type, body or the headers of its meaning): wire.Digest differs
	DeadReasonRefused       = "refused"        // the broker refused a spooled event until emit_timeout (no queue gave up: x-mesh-dead-queue is absent)
	DeadReasonIdentity      = "identity"       // its x-node was published by another broker user than the node's identity rule names (identity: in mesh.yaml), or by none
	DeadReasonRevoked       = "revoked"        // a schedule came due whose module is no longer in its node's configuration, or no longer may emit its type (no queue gave up: x-mesh-dead-queue is absent; a replay sends it to mesh.events)
)

// Origins are the reserved first words of an event type.
var Origins = []string{"module", "mesh", "node"}

// ModuleQueue is the durable queue of a consuming module on a node.
func ModuleQueue(node, module string) string {
	return node + "." + module + ".events"
}

// GroupQueuePrefix begins the name of every group's queue.
const GroupQueuePrefix = "group."

// GroupQueue is the durable queue a module's group shares (ADR 48): its
// copies on every node of the group consume it and compete for its
// events. Its four words never meet a node's three (ModuleQueue,
// ModuleDeadQueue), whatever the names.
func GroupQueue(group, module string) string {
	return GroupQueuePrefix + group + "." + module + ".events"
}

// GroupOfQueue reads the name of a group's queue (GroupQueue,
// PartitionQueue, GroupIntake): its group and module, and whether it is
// one.
func GroupOfQueue(queue string) (group, module string, ok bool) {
	rest, found := strings.CutPrefix(queue, GroupQueuePrefix)
	if !found {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", "", false
	}
	switch last := rest[i+1:]; {
	case last == "events", last == "intake":
	case isPartitionWord(last):
	default:
		return "", "", false
	}
	group, module, found = strings.Cut(rest[:i], ".")
	if !found || group == "" || module == "" || strings.Contains(module, ".") {
		return "", "", false
	}
	return group, module, true
}

// Per-key order (ADR 48). An event's key is x-partition-key (at most
// MaxKeyBytes of UTF-8; none is the empty key); its slot is Slot(key),
// which the emitting node stamps as a header of its own, SlotHeader(key)
// with the value SlotMark. A group that keeps order over n partitions binds
// partition i to its headers exchange (GroupExchange) once, matching any
// of the slot headers of the slots s with s mod n == i: n bindings a group
// and Slots arguments in all, which the broker goes through for each event
// it routes there. Their count is the cost (make bench, -only groups: a
// binding a slot over 256 slots cost the broker 6 times an unordered
// event's CPU for matching, one binding a partition over 256 slots twice,
// over 64 slots half again: ADR 48). The headers exchange matches only
// headers whose names do not begin with "x-" (rabbitmq-3.10-facts.md:
// partition facts).
const (
	// HeaderPartitionKey is an event's key: events of one key are
	// handled one at a time, in broker order, by a group that keeps
	// order (sdk.WithKey sets it; a foreign publisher may).
	HeaderPartitionKey = "x-partition-key"
	// SlotHeaderPrefix begins the name of an event's slot header,
	// SlotHeader: mesh-slot-0 to mesh-slot-63. Its name has no x-
	// prefix, for the headers exchange to match it.
	SlotHeaderPrefix = "mesh-slot-"
	// SlotMark is the value of the slot header (a string: the headers
	// exchange tells "1" from 1).
	SlotMark = "1"
	// Slots is how many slots a key falls into: the most partitions a
	// group may have.
	Slots = 64
	// MaxKeyBytes bounds a key.
	MaxKeyBytes = 256
)

// Slot is the slot of key: its 32-bit FNV-1a hash modulo Slots. A foreign
// publisher that stamps the slot header computes the same.
func Slot(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % Slots)
}

// SlotHeader is the name of the header that says key's slot: mesh-slot-
// and the slot in decimal.
func SlotHeader(key string) string { return SlotHeaderOf(Slot(key)) }

// SlotHeaderOf is the name of slot's header (0 <= slot < Slots).
func SlotHeaderOf(slot int) string { return slotHeaders[slot] }

// slotHeaders are the slot headers' names, made once: every event a node
// publishes bears one.
var slotHeaders = func() (names [Slots]string) {
	for i := range names {
		names[i] = SlotHeaderPrefix + strconv.Itoa(i)
	}
	return names
}()

// CheckKey checks an event's key: at most MaxKeyBytes of UTF-8 without
// control characters.
func CheckKey(key string) error {
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: a key of %d bytes is over %d", ErrInvalid, len(key), MaxKeyBytes)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: the key is not UTF-8", ErrInvalid)
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: the key holds a control character", ErrInvalid)
		}
	}
	return nil
}

// GroupExchange is the headers exchange of a group that keeps order,
// bound to mesh.events with the module's patterns; its partitions are
// bound to it on their slots.
func GroupExchange(group, module string) string {
	return GroupQueuePrefix + group + "." + module
}

// PartitionQueue is partition i of a group that keeps order, of its first
// partition count (epoch 0).
func PartitionQueue(group, module string, i int) string {
	return fmt.Sprintf("%s%s.%s.p%03d", GroupQueuePrefix, group, module, i)
}

// PartitionQueueOf is partition i of a group's partition count number
// epoch: the first count's are PartitionQueue's, a later count's
// group.GROUP.MODULE.eEpNNN (a count changed by meshctl groups
// repartition; ADR 48).
func PartitionQueueOf(group, module string, epoch, i int) string {
	if epoch == 0 {
		return PartitionQueue(group, module, i)
	}
	return fmt.Sprintf("%s%s.%s.e%dp%03d", GroupQueuePrefix, group, module, epoch, i)
}

// EpochExchange marks that a group's partition count number epoch (from 1)
// was made: a fanout exchange bound to nothing, declared once the epoch's
// queues are, and kept, so that the latest epoch is found by looking for
// each in turn (ADR 48).
func EpochExchange(group, module string, epoch int) string {
	return fmt.Sprintf("%s%s.%s.e%d", GroupQueuePrefix, group, module, epoch)
}

// CatchUpQueue is where a count change (epoch) puts the events of
// partition i of the new count that reached the group while the change was
// under way: handled after the old partitions those slots came from, before
// partition i itself; deleted once handled (ADR 48).
func CatchUpQueue(group, module string, epoch, i int) string {
	return fmt.Sprintf("%s%s.%s.e%dc%03d", GroupQueuePrefix, group, module, epoch, i)
}

// isPartitionWord says whether word is the last word of a partition's or
// a catch-up queue's name: pNNN, eEpNNN or eEcNNN.
func isPartitionWord(word string) bool {
	kinds := "p"
	if rest, ok := strings.CutPrefix(word, "e"); ok {
		i := strings.IndexAny(rest, "pc")
		if i < 1 || strings.Trim(rest[:i], "0123456789") != "" {
			return false
		}
		word, kinds = rest[i:], "pc"
	}
	return len(word) == 4 && strings.IndexByte(kinds, word[0]) >= 0 && strings.Trim(word[1:], "0123456789") == ""
}

// HeaderPartitions marks a message of the mesh's own in a group's intake,
// partition or catch-up queue that changes the group's partition count
// (ADR 48): PartitionsStart (its body a PartitionChange) and PartitionsEnd
// in the intake, PartitionsRetire as the last message of a partition or
// catch-up queue that a change retires. Honoured only from a node's or
// an operator's user (the marker's user-id).
const HeaderPartitions = "x-mesh-partitions"

// The values of HeaderPartitions.
const (
	PartitionsStart  = "start"
	PartitionsEnd    = "end"
	PartitionsRetire = "retire"
)

// PartitionChange is the body of a PartitionsStart marker: the group's
// next partition count and its epoch (the current one's plus one).
type PartitionChange struct {
	Epoch      int `json:"epoch"`
	Partitions int `json:"partitions"`
	// From is the count it changes from (the previous epoch's).
	From int `json:"from"`
}

// GroupIntake is the exchange and queue that take an event of a group that
// keeps order which bears no slot header (its publisher did not stamp it):
// the alternate exchange of GroupExchange. A member slots it and sends it
// on, in order.
func GroupIntake(group, module string) string {
	return GroupQueuePrefix + group + "." + module + ".intake"
}

// ModuleDeadQueue is the durable queue on which a module with a
// DeadLetters handler receives the mesh's dead letters (bound to
// ExchangeDead with "#").
func ModuleDeadQueue(node, module string) string {
	return node + "." + module + ".dead"
}

// NodeLockQueue is the exclusive, auto-delete queue a running node holds on
// its connection: a second node of the same name gets 405 RESOURCE_LOCKED
// declaring it, so two nodes never share a name (and module queues).
func NodeLockQueue(node string) string {
	return "mesh.node." + node + ".lock"
}

// ModuleEventType is the full type of an event a module emits by its own
// relative name: module.<module>.<name>.
func ModuleEventType(module, name string) string {
	return "module." + module + "." + name
}

// Headers and values of the RPC wire (docs/adr/0007-rpc-wire.md).
const (
	// HeaderDeadline is when the caller gives up, RFC 3339 UTC with
	// nanoseconds; a server never starts a request past it.
	HeaderDeadline = "x-deadline"
	// HeaderStatus is a reply's outcome: StatusOK or StatusError.
	HeaderStatus = "x-status"
	// HeaderErrorCode, HeaderErrorMessage and HeaderErrorPermanent
	// describe an error reply.
	HeaderErrorCode      = "x-error-code"
	HeaderErrorMessage   = "x-error-message"
	HeaderErrorPermanent = "x-error-permanent"

	StatusOK    = "ok"
	StatusError = "error"
)

// ServeQueue is the durable queue shared by every server of a tool.
func ServeQueue(tool string) string {
	return "serve." + tool
}

// Expired reports whether headers carry an x-deadline (RFC 3339) that is
// not after now, and returns it.
func Expired(deadline string, now time.Time) (time.Time, bool) {
	if deadline == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, deadline)
	if err != nil {
		return time.Time{}, false
	}
	return t, !now.Before(t)
}

// MeshQueuePrefix begins the names of the mesh's own queues: the dead
// letters and unrouted events kept for operators, the history's stream,
// each node's due and lock queues, the delay levels.
const MeshQueuePrefix = "mesh."

// ConsumeGranted reports whether a consumes: grant lets a module consume
// queue: by topic pattern, except that one of the mesh's own queues
// (MeshQueuePrefix) is granted only by its exact name, never by a
// wildcard ("#", "mesh.#").
func ConsumeGranted(grant, queue string) bool {
	if strings.HasPrefix(queue, MeshQueuePrefix) {
		return grant == queue
	}
	return MatchPattern(grant, queue)
}
