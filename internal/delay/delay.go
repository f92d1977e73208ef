// Package delay is the shape of the mesh's delay cascade (ADR 32): the
// levels of quorum queues with fixed TTLs that a delayed message waits in,
// the routing key that carries its delay as binary digits and the node
// that scheduled it, and the bound and resolution of a delay. It declares
// nothing: the runtime and meshctl declare what Levels describes.
//
// A message published to ExchangeIn with RoutingKey(s, node) waits, for
// each bit n set in s, 2^n seconds in level n's queue, and reaches
// DueQueue(node) s seconds (and a few milliseconds a level) after it was
// published; never before.
package delay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Levels is how many levels the cascade has: level n waits 2^n seconds.
const Levels = 28

// Max is the longest delay: 2^Levels − 1 seconds, about 8.5 years.
const Max = (1<<Levels - 1) * time.Second

// The cascade's names.
const (
	// ExchangeIn is the topic exchange a delayed message is published to
	// (Exchanges).
	ExchangeIn = "mesh.delay"
	// ExchangeDue is where a message with no bit left goes: a topic
	// exchange that routes each message by its last word, the node that
	// scheduled it, to that node's DueQueue.
	ExchangeDue = "mesh.delay.due"
)

// DueQueue is the queue of what node scheduled and came due, which its
// mover consumes.
func DueQueue(node string) string { return "mesh.node." + node + ".due" }

// DueBinding binds DueQueue(node) to ExchangeDue.
func DueBinding(node string) string { return "#." + node }

// ErrTooLong is a delay longer than Max.
var ErrTooLong = errors.New("delay: longer than the longest delay")

// Seconds is d in whole seconds, rounded up (a delayed event is never
// early); 0 for d ≤ 0. A d past Max is refused, naming the bound.
func Seconds(d time.Duration) (uint32, error) {
	if d <= 0 {
		return 0, nil
	}
	if d > Max {
		return 0, fmt.Errorf("%w: %v is more than %v (2^%d−1 s)", ErrTooLong, d, Max, Levels)
	}
	s := d / time.Second
	if d%time.Second != 0 {
		s++
	}
	return uint32(s), nil
}

// RoutingKey is the key that makes a message wait s seconds and come due
// in DueQueue(node): the bits of s from the top level's down, one word
// each, then the node's name (one word, as the runtime checks node names).
func RoutingKey(s uint32, node string) string {
	var b strings.Builder
	b.Grow(2*Levels + len(node))
	for n := Levels - 1; n >= 0; n-- {
		b.WriteByte('0' + byte(s>>n&1))
		b.WriteByte('.')
	}
	b.WriteString(node)
	return b.String()
}

// ParseRoutingKey is the delay and the node RoutingKey made key for.
func ParseRoutingKey(key string) (s uint32, node string, err error) {
	words := strings.Split(key, ".")
	if len(words) != Levels+1 || words[Levels] == "" {
		return 0, "", fmt.Errorf("delay: %q is no delay routing key (%d bits, then a node's name)", truncate(key), Levels)
	}
	for _, w := range words[:Levels] {
		switch w {
		case "0":
			s <<= 1
		case "1":
			s = s<<1 | 1
		default:
			return 0, "", fmt.Errorf("delay: %q is no delay routing key: %q is no bit", truncate(key), w)
		}
	}
	return s, words[Levels], nil
}

// Level is one level of the cascade: its queue, the time a message waits
// in it, and the exchange it dead-letters to, which has the level's name
// too and sends the message on by the bits below N.
type Level struct {
	N        int            // its bit: a message waits here if bit N of its delay is set
	Name     string         // its queue's, and the exchange the queue dead-letters to
	TTL      time.Duration  // 2^N seconds, the queue's x-message-ttl
	QueueArg map[string]any // the queue's arguments (amqp.Table)
}

// AllLevels returns the cascade's levels, from the top down to level 0.
func AllLevels() []Level {
	out := make([]Level, 0, Levels)
	for n := Levels - 1; n >= 0; n-- {
		out = append(out, LevelOf(n))
	}
	return out
}

// LevelOf is level n (0 ≤ n < Levels).
func LevelOf(n int) Level {
	ttl := time.Duration(1<<n) * time.Second
	return Level{
		N: n, Name: levelName(n), TTL: ttl,
		QueueArg: map[string]any{
			"x-queue-type":           "quorum",
			"x-message-ttl":          ttl.Milliseconds(),
			"x-dead-letter-exchange": levelName(n),
			// at-least-once dead-lettering needs reject-publish, or the
			// broker falls back to at-most-once and only logs it
			// (rabbitmq-3.10-facts §3).
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		},
	}
}

// Exchange is one topic exchange of the cascade: ExchangeIn, where a
// delayed message is published and which routes it by all its bits, or the
// exchange a level's queue dead-letters to, which routes it by the bits
// below that level. Each binds the queue of every level below (the one of
// the highest set bit left takes it) and, for no bit left, ExchangeDue:
// one topic lookup a hop, not one per level (measured: a chain of 28
// exchanges bound exchange to exchange, one per bit, took 500 to 900
// publishes a second on one channel; ADR 32).
type Exchange struct {
	Name     string
	Below    int // it routes by the bits below Below (Levels for ExchangeIn)
	Bindings []Binding
}

// Binding binds a level's queue (Queue) or ExchangeDue (Exchange) to an
// Exchange with Key.
type Binding struct {
	Key             string
	Queue, Exchange string
}

// Exchanges returns the cascade's exchanges, ExchangeIn first, then the
// levels' from the top down.
func Exchanges() []Exchange {
	out := make([]Exchange, 0, Levels+1)
	out = append(out, exchangeBelow(Levels, ExchangeIn))
	for n := Levels - 1; n >= 0; n-- {
		out = append(out, exchangeBelow(n, levelName(n)))
	}
	return out
}

// exchangeBelow is the exchange named name that routes by the bits below
// below: bit m (m < below) set and none between it and below goes to level
// m's queue; none set, to ExchangeDue.
func exchangeBelow(below int, name string) Exchange {
	x := Exchange{Name: name, Below: below}
	word := func(i, m int) string { // bit i's word in the pattern of level m (m < 0: none set)
		switch {
		case i >= below:
			return "*"
		case i > m:
			return "0"
		case i == m:
			return "1"
		}
		return ""
	}
	for m := below - 1; m >= -1; m-- {
		var b strings.Builder
		for i := Levels - 1; i >= 0 && (i >= m || m < 0); i-- {
			b.WriteString(word(i, m))
			b.WriteByte('.')
		}
		if m >= 0 {
			b.WriteString("#") // the lower bits and the node
			x.Bindings = append(x.Bindings, Binding{Key: b.String(), Queue: levelName(m)})
		} else {
			b.WriteString("*") // the node
			x.Bindings = append(x.Bindings, Binding{Key: b.String(), Exchange: ExchangeDue})
		}
	}
	return x
}

func levelName(n int) string { return "mesh.delay." + pad(n) }

func pad(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
