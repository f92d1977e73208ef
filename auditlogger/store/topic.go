package store

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"
)

// matchTopic reports whether an event type matches an AMQP topic pattern:
// words split on dots, "*" matches exactly one word and "#" zero or more;
// the empty event type has no words. It is the broker's rule (and the
// runtime's, internal/wire.MatchPattern, which this package may not import:
// the audit logger stands on the sdk alone); a fuzz test holds the two to
// each other.
//
// It runs as the SQL function mesh_topic_match, once per row, so it neither
// allocates nor backtracks: its steps are at most (p+1)×(t+1) for p pattern
// words and t event type words, whatever the pattern (see matchTopicSteps).
func matchTopic(pattern, eventType string) bool {
	ok, _ := matchTopicSteps(pattern, eventType)
	return ok
}

// matchTopicSteps is matchTopic, also counting the steps it took, for the
// test that bounds them.
//
// Treating "#" as a glob's "*" and "*" as its "?", over words rather than
// bytes, it is the greedy wildcard match: walk pattern and type together;
// at a "#", note where it is and let it match nothing; on a mismatch (or a
// pattern that ends before the type), go back to the last "#" and let it
// take one word more. Between two "#"s the pattern is a run of words that
// each match exactly one word, so the leftmost place the run fits is never
// worse than a later one, and an earlier "#" never needs to be revisited.
// Each return to the last "#" moves where it ends one word on, and it never
// moves back, so there are at most t returns, with at most p steps after
// each.
//
// Positions are byte offsets where a word starts; len(s)+1 means no words
// are left (so "a." has the words "a" and "", and "" has none).
func matchTopicSteps(pattern, eventType string) (ok bool, steps int) {
	pEnd, tEnd := len(pattern)+1, len(eventType)+1
	pi, ti := 0, 0
	if pattern == "" {
		pi = pEnd
	}
	if eventType == "" {
		ti = tEnd
	}
	// After the last "#" seen: the pattern position that follows it, and
	// the type position where what it matches ends; starP < 0 until a "#".
	starP, starT := -1, 0
	for ti != tEnd {
		steps++
		if pi != pEnd {
			pw, pnext := word(pattern, pi)
			if pw == "#" {
				starP, starT, pi = pnext, ti, pnext
				continue
			}
			if tw, tnext := word(eventType, ti); pw == "*" || pw == tw {
				pi, ti = pnext, tnext
				continue
			}
		}
		if starP < 0 {
			return false, steps
		}
		_, starT = word(eventType, starT)
		pi, ti = starP, starT
	}
	// The type is used up: what is left of the pattern must match nothing.
	for pi != pEnd {
		steps++
		pw, pnext := word(pattern, pi)
		if pw != "#" {
			return false, steps
		}
		pi = pnext
	}
	return true, steps
}

// word returns the word of s starting at byte offset i (i <= len(s)) and
// the offset of the word after it, len(s)+1 if it is the last.
func word(s string, i int) (w string, next int) {
	j := strings.IndexByte(s[i:], '.')
	if j < 0 {
		return s[i:], len(s) + 1
	}
	return s[i : i+j], i + j + 1
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
