package runtime

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

func TestOrderKeyRules(t *testing.T) {
	for _, c := range []struct {
		rule, body, source, want, err string
	}{
		{rule: "source", source: "shop", want: "shop"},
		{rule: "source", err: "the event has no x-source"},
		{rule: "body.account", body: `{"account":"a-7"}`, want: "a-7"},
		{rule: "body.order.account", body: `{"order":{"account":"a-8"}}`, want: "a-8"},
		{rule: "body.n", body: `{"n":12345678901234567890}`, want: "12345678901234567890"}, // as written, not as a float
		{rule: "body.n", body: `{"n":1.5e3}`, want: "1.5e3"},
		{rule: "body.account", body: `{"other":1}`, err: "the body has no field account"},
		{rule: "body.order.account", body: `{"order":"x"}`, err: "the body.order is not an object"},
		{rule: "body.account", body: `{"account":true}`, err: "field account is a boolean"},
		{rule: "body.account", body: `{"account":null}`, err: "field account is null"},
		{rule: "body.account", body: `{"account":{}}`, err: "field account is an object"},
		{rule: "body.account", body: `not json`, err: "the body is not JSON"},
		{rule: "body.account", body: `{"account":"` + strings.Repeat("x", wire.MaxKeyBytes+1) + `"}`, err: "order_key body.account"},
		{rule: "body.account", body: `{"account":"a\u0001b"}`, err: "control"},
	} {
		k, err := parseOrderKey(c.rule)
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		d := amqp.Delivery{Body: []byte(c.body), Headers: amqp.Table{}}
		if c.source != "" {
			d.Headers[wire.HeaderSource] = c.source
		}
		got, err := k.of(d)
		switch {
		case c.err != "" && (err == nil || !errors.Is(err, ErrNoOrderKey) || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s of %s: %q, %v; want an ErrNoOrderKey saying %q", c.rule, c.body, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s of %s: %q, %v; want %q", c.rule, c.body, got, err, c.want)
		}
	}
	for _, bad := range []string{"account", "body.", "body..x", "body.a\nb", "header.x", "sourcey"} {
		if _, err := parseOrderKey(bad); err == nil {
			t.Errorf("order_key %q was accepted", bad)
		}
	}
}

// FuzzOrderKeyOf: whatever the body, a rule's key is one CheckKey
// accepts, or an ErrNoOrderKey; never a panic.
func FuzzOrderKeyOf(f *testing.F) {
	f.Add("body.a.b", []byte(`{"a":{"b":"k"}}`))
	f.Add("body.n", []byte(`{"n":1e999}`))
	f.Add("source", []byte(`x`))
	f.Fuzz(func(t *testing.T, rule string, body []byte) {
		k, err := parseOrderKey(rule)
		if err != nil || rule == "" {
			return
		}
		key, err := k.of(amqp.Delivery{Body: body, Headers: amqp.Table{wire.HeaderSource: string(body)}})
		if err != nil {
			if !errors.Is(err, ErrNoOrderKey) {
				t.Fatalf("%s of %q: %v is not an ErrNoOrderKey", rule, body, err)
			}
			return
		}
		if wire.CheckKey(key) != nil {
			t.Fatalf("%s of %q: key %q fails CheckKey", rule, body, key)
		}
	})
}
