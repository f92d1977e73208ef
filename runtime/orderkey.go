package runtime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// orderKey is an ordered group's rule for an event's key
// (ModuleConfig.OrderKey; ADR 48): "source", the event's x-source, or
// "body.PATH", the field at PATH (names joined by dots) of its JSON body,
// a string or a number. The rule decides every event's key in the group,
// whatever key its emitter gave: all of them reach the group through its
// intake, which keys them by the rule.
type orderKey struct {
	rule   string
	source bool
	path   []string
}

// parseOrderKey reads rule; "" is no rule.
func parseOrderKey(rule string) (orderKey, error) {
	k := orderKey{rule: rule}
	switch {
	case rule == "":
	case rule == "source":
		k.source = true
	case strings.HasPrefix(rule, "body."):
		k.path = strings.Split(strings.TrimPrefix(rule, "body."), ".")
		for _, name := range k.path {
			if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
				return orderKey{}, fmt.Errorf("order_key: %q: want source or body.FIELD (field names joined by dots, none empty)", rule)
			}
		}
	default:
		return orderKey{}, fmt.Errorf("order_key: %q: want source or body.FIELD (field names joined by dots)", rule)
	}
	return k, nil
}

// ErrNoOrderKey is what an event's key by a rule fails with when the event
// has no key there: it is dead-lettered (reason malformed), naming the
// rule.
var ErrNoOrderKey = errors.New("no key by the group's order_key")

// of is d's key by the rule.
func (k orderKey) of(d amqp.Delivery) (string, error) {
	var key string
	if k.source {
		key = deadletters.HeaderText(d.Headers[wire.HeaderSource])
		if key == "" {
			return "", fmt.Errorf("%w %s: the event has no %s", ErrNoOrderKey, k.rule, wire.HeaderSource)
		}
	} else {
		var err error
		if key, err = k.field(d.Body); err != nil {
			return "", fmt.Errorf("%w %s: %v", ErrNoOrderKey, k.rule, err)
		}
	}
	if err := wire.CheckKey(key); err != nil {
		return "", fmt.Errorf("%w %s: %v", ErrNoOrderKey, k.rule, err)
	}
	return key, nil
}

// field is the text of the body's field at k.path: a string as it is, a
// number as written.
func (k orderKey) field(body []byte) (string, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("the body is not JSON: %v", err)
	}
	for i, name := range k.path {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", fmt.Errorf("%s is not an object", strings.Join(append([]string{"the body"}, k.path[:i]...), "."))
		}
		if v, ok = obj[name]; !ok {
			return "", fmt.Errorf("the body has no field %s", strings.Join(k.path[:i+1], "."))
		}
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	default:
		return "", fmt.Errorf("field %s is %s, want a string or a number", strings.Join(k.path, "."), jsonKind(v))
	}
}

// jsonKind names a decoded JSON value's kind.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return fmt.Sprintf("%T", v)
	}
}
