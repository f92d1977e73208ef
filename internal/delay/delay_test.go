package delay

import (
	"errors"
	"math/bits"
	"strings"
	"testing"
	"time"
)

func TestSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint32
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {time.Second, 1},
		{time.Second + time.Millisecond, 2}, {90 * time.Minute, 5400}, {Max, 1<<Levels - 1},
	} {
		if got, err := Seconds(c.d); err != nil || got != c.want {
			t.Errorf("Seconds(%v) = %d, %v; want %d", c.d, got, err, c.want)
		}
	}
	_, err := Seconds(Max + time.Nanosecond)
	if !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), Max.String()) {
		t.Errorf("past Max: %v, want ErrTooLong naming %v", err, Max)
	}
}

func TestRoutingKey(t *testing.T) {
	if got, want := RoutingKey(5, "n1"), strings.Repeat("0.", Levels-3)+"1.0.1.n1"; got != want {
		t.Fatalf("RoutingKey(5) = %q, want %q", got, want)
	}
	for _, s := range []uint32{0, 1, 2, 3, 1000, 86400, 1<<Levels - 1} {
		key := RoutingKey(s, "edge-1")
		if len(key) > 255 {
			t.Fatalf("key of %d is %d bytes", s, len(key))
		}
		if got, node, err := ParseRoutingKey(key); err != nil || got != s || node != "edge-1" {
			t.Errorf("ParseRoutingKey(RoutingKey(%d)) = %d, %q, %v", s, got, node, err)
		}
		if !topicMatch(DueBinding("edge-1"), key) || topicMatch(DueBinding("edge"), key) {
			t.Errorf("%q: the due binding of its node must match it, and another node's not", key)
		}
	}
	for _, bad := range []string{"", "due", "module.a.x", strings.Repeat("0.", Levels), strings.Repeat("2.", Levels) + "n", strings.Repeat("0.", Levels+1) + "n"} {
		if _, _, err := ParseRoutingKey(bad); err == nil {
			t.Errorf("ParseRoutingKey(%q) accepted", bad)
		}
	}
}

// TestLevelsRoute walks the bindings as a topic exchange would: a key of s
// seconds, from ExchangeIn, matches exactly one binding at each exchange,
// waits in exactly the levels of s's set bits, whose TTLs add up to s, each
// dead-lettering to its own exchange, and reaches ExchangeDue.
func TestLevelsRoute(t *testing.T) {
	exchanges := map[string]Exchange{}
	for _, x := range Exchanges() {
		exchanges[x.Name] = x
	}
	levels := map[string]Level{}
	for _, l := range AllLevels() {
		levels[l.Name] = l
		if l.QueueArg["x-message-ttl"] != l.TTL.Milliseconds() || l.QueueArg["x-dead-letter-exchange"] != l.Name {
			t.Fatalf("%s: args %v", l.Name, l.QueueArg)
		}
	}
	if len(exchanges) != Levels+1 || len(levels) != Levels {
		t.Fatalf("%d exchanges and %d levels", len(exchanges), len(levels))
	}
	for _, s := range []uint32{0, 1, 2, 6, 7, 3600, 1 << (Levels - 1), 1<<Levels - 1} {
		key := RoutingKey(s, "n")
		var waited time.Duration
		waits, at := 0, ExchangeIn
		for hops := 0; ; hops++ {
			if hops > Levels {
				t.Fatalf("%d s: more hops than levels", s)
			}
			var matched []Binding
			for _, b := range exchanges[at].Bindings {
				if topicMatch(b.Key, key) {
					matched = append(matched, b)
				}
			}
			if len(matched) != 1 {
				t.Fatalf("%d s at %s: %d bindings match, want exactly one: %v", s, at, len(matched), matched)
			}
			if matched[0].Exchange == ExchangeDue {
				break
			}
			l := levels[matched[0].Queue]
			waited += l.TTL
			waits++
			at = l.Name // it dead-letters to its own exchange
		}
		if waited != time.Duration(s)*time.Second || waits != bits.OnesCount32(s) {
			t.Errorf("%d s waited %v in %d levels", s, waited, waits)
		}
	}
}

// topicMatch is RabbitMQ's topic matching for the patterns the cascade
// uses: "*" one word, "#" zero or more.
func topicMatch(pattern, key string) bool {
	var match func(p, k []string) bool
	match = func(p, k []string) bool {
		switch {
		case len(p) == 0:
			return len(k) == 0
		case p[0] == "#":
			for i := 0; i <= len(k); i++ {
				if match(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case len(k) == 0:
			return false
		case p[0] == "*" || p[0] == k[0]:
			return match(p[1:], k[1:])
		}
		return false
	}
	return match(strings.Split(pattern, "."), strings.Split(key, "."))
}

func FuzzParseRoutingKey(f *testing.F) {
	f.Add(RoutingKey(0, "n1"))
	f.Add(RoutingKey(12345, "edge"))
	f.Add("1.0.due")
	f.Add("")
	f.Fuzz(func(t *testing.T, key string) {
		s, node, err := ParseRoutingKey(key)
		if err != nil {
			return
		}
		if RoutingKey(s, node) != key || node == "" || strings.Contains(node, ".") {
			t.Fatalf("accepted %q as %d for node %q, whose key is %q", key, s, node, RoutingKey(s, node))
		}
	})
}
