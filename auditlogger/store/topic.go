package store

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"
)

// matchTopic reports whether an event type matches an AMQP topic pattern:
// words split on dots, "*" matches exactly one word and "#" zero or more.
// It is the broker's rule (and the runtime's, internal/wire.MatchPattern,
// which this package may not import: the audit logger stands on the sdk
// alone); a fuzz test holds the two to each other.
func matchTopic(pattern, eventType string) bool {
	return matchWords(words(pattern), words(eventType))
}

// words splits on dots; "" has no words (the empty routing key).
func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

func matchWords(p, t []string) bool {
	for len(p) > 0 {
		switch p[0] {
		case "#":
			for len(p) > 1 && p[1] == "#" {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(t); i++ {
				if matchWords(p[1:], t[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(t) == 0 {
				return false
			}
		default:
			if len(t) == 0 || t[0] != p[0] {
				return false
			}
		}
		p, t = p[1:], t[1:]
	}
	return len(t) == 0
}

// checkPattern refuses a pattern with an empty word.
func checkPattern(p string) error {
	if p == "" {
		return errors.New("type pattern is empty")
	}
	for _, w := range strings.Split(p, ".") {
		if w == "" {
			return fmt.Errorf("type pattern %q has an empty word", p)
		}
	}
	return nil
}

// topicMatchFunc is matchTopic as the SQL function mesh_topic_match.
func topicMatchFunc(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
	p, ok1 := args[0].(string)
	t, ok2 := args[1].(string)
	if !ok1 || !ok2 {
		return false, nil
	}
	return matchTopic(p, t), nil
}
