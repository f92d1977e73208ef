package nodeconfig

import (
	"regexp"
	"testing"

	"github.com/meshkit/mesh/internal/wire"
)

// TestPatternRegexpMatchesLikeTheBroker: the regular expression of a topic
// pattern matches exactly the keys the pattern matches (wire.MatchPattern,
// itself checked against the broker's binding semantics).
func TestPatternRegexpMatchesLikeTheBroker(t *testing.T) {
	patterns := []string{"#", "*", "a", "a.*", "a.#", "#.a", "a.#.b", "*.b.#", "#.#", "a.#.#.b", "#.*", "*.#.*", "a.b.c", "m1.*"}
	keys := []string{"a", "b", "a.b", "b.a", "a.b.c", "a.x.b", "a.x.y.b", "x.b.y", "x.b", "m1.echo", "m1.echo.x", "a.a", "c.a.b"}
	for _, p := range patterns {
		re := regexp.MustCompile("^(?:" + PatternRegexp(p) + ")$")
		for _, k := range keys {
			if got, want := re.MatchString(k), wire.MatchPattern(p, k); got != want {
				t.Errorf("pattern %q key %q: regexp %q says %v, the broker %v", p, k, PatternRegexp(p), got, want)
			}
		}
	}
}

// FuzzPatternRegexp: for any valid pattern and key, the regular
// expression agrees with wire.MatchPattern.
func FuzzPatternRegexp(f *testing.F) {
	f.Add("a.#.b", "a.x.b")
	f.Add("#.*", "a")
	f.Add("*.#", "a.b.c")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if wire.ValidatePattern(pattern) != nil || wire.ValidateEventType(key) != nil {
			return
		}
		re := regexp.MustCompile("^(?:" + PatternRegexp(pattern) + ")$")
		if got, want := re.MatchString(key), wire.MatchPattern(pattern, key); got != want {
			t.Errorf("pattern %q key %q: regexp %q says %v, the broker %v", pattern, key, PatternRegexp(pattern), got, want)
		}
	})
}

// TestPermissionsNames: the names each of a node's permissions and the
// operator's matches, and those it must not: another node's queues, the
// keepers for a node's reads, a node's queues for the operator.
func TestPermissionsNames(t *testing.T) {
	f := File{Node: "n1", AMQPURL: "amqp://mesh-n1:secret@broker:5672/prod", Modules: []Module{
		{Name: "shop", Tools: []string{"shop.*"}}, {Name: "mail", Group: "eu"}, {Name: "ledger", Group: "books", Partitions: 4},
	}}
	node := f.Permissions("", []string{"orders.incoming"})
	if node.User != "mesh-n1" || node.VHost != "prod" {
		t.Errorf("node user %q on %q, want mesh-n1 on prod", node.User, node.VHost)
	}
	off := false // with delays on, its delays module serves tools (the cases of n1)
	bare := File{Node: "n3", AMQPURL: "amqp://mesh-n3@broker/", Delays: &off, Modules: []Module{{Name: "mail"}}}.Permissions("", nil)
	if bare.VHost != "/" {
		t.Errorf("vhost %q, want /", bare.VHost)
	}
	op := OperatorPermissions("ops", "prod", "")
	server := "amq.gen-JzTY20BRgKO-HjmUJj0wLg"
	for _, c := range []struct {
		what, re string
		yes, no  []string
	}{
		{"node configure", node.Configure,
			[]string{wire.ExchangeEvents, wire.ExchangeRPC, wire.ExchangeDead, wire.ExchangeUnrouted, wire.QueueDead, wire.QueueUnrouted,
				"mesh.node.n1.lock", "n1.shop.events", "n1.mail.dead", "serve.shop.price", "group.eu.mail.events", server,
				"group.books.ledger", "group.books.ledger.intake", "group.books.ledger.p003"},
			[]string{"mesh.node.n2.lock", "n2.shop.events", "n1.billing.events", "serve.billing.charge", "serve.shop.price.x", "amq.default",
				"orders.incoming", "n1.shop.events.x", "xn1.shop.events", "group.eu.shop.events", "group.us.mail.events",
				"group.books.ledger.events", "group.books.ledger.p003.x", "group.books.ledgers", "group.books.other.p000"}},
		{"node write", node.Write,
			[]string{wire.ExchangeEvents, wire.ExchangeRPC, wire.ExchangeDead, wire.ExchangeUnrouted, wire.QueueDead, wire.QueueUnrouted,
				"n1.shop.events", "n1.mail.dead", "serve.shop.price", server, "amq.default", "group.eu.mail.events"},
			[]string{"mesh.node.n1.lock", "n2.shop.events", "serve.billing.charge", "orders.incoming", "group.eu.shop.events"}},
		{"node read", node.Read,
			[]string{wire.ExchangeEvents, wire.ExchangeRPC, wire.ExchangeDead, wire.ExchangeUnrouted, "n1.shop.events", "n1.mail.dead",
				"serve.shop.price", server, "orders.incoming", "group.eu.mail.events"},
			[]string{"group.eu.shop.events", wire.QueueDead, wire.QueueUnrouted, "mesh.node.n1.lock", "n2.shop.events", "serve.billing.charge", "amq.default"}},
		{"read of a node that serves nothing", bare.Read, []string{wire.ExchangeEvents, "n3.mail.events"}, []string{wire.ExchangeRPC}},
		{"operator configure", op.Configure,
			[]string{wire.ExchangeEvents, wire.ExchangeRPC, wire.ExchangeDead, wire.ExchangeUnrouted, wire.QueueDead, wire.QueueUnrouted, server},
			[]string{"mesh.node.n1.lock", "n1.shop.events", "n1.shop.dead", "serve.shop.price", "amq.default"}},
		{"operator write", op.Write,
			[]string{wire.ExchangeEvents, wire.ExchangeRPC, wire.ExchangeUnrouted, wire.QueueDead, wire.QueueUnrouted, server, "amq.default"},
			[]string{wire.ExchangeDead, "n1.shop.events", "serve.shop.price", "mesh.node.n1.lock"}},
		{"operator read", op.Read,
			[]string{wire.ExchangeEvents, wire.ExchangeDead, wire.ExchangeUnrouted, wire.QueueDead, wire.QueueUnrouted, server},
			[]string{wire.ExchangeRPC, "n1.shop.events", "n1.shop.dead", "serve.shop.price", "mesh.node.n1.lock", "amq.default"}},
	} {
		re := regexp.MustCompile(c.re)
		for _, name := range c.yes {
			if !re.MatchString(name) {
				t.Errorf("%s %s does not match %s", c.what, c.re, name)
			}
		}
		for _, name := range c.no {
			if re.MatchString(name) {
				t.Errorf("%s %s matches %s", c.what, c.re, name)
			}
		}
	}
	topics := func(p Permissions) map[string]TopicPermission {
		m := map[string]TopicPermission{}
		for _, tp := range p.Topics {
			m[tp.Exchange] = tp
		}
		return m
	}
	nt, ot := topics(node), topics(op)
	for _, c := range []struct {
		what, re string
		yes, no  []string
	}{
		{"node publishes on mesh.events", nt[wire.ExchangeEvents].Write,
			[]string{"node.n1.joined", "node.n2.unreachable", "module.shop.order.placed", "module.mail.sent"},
			[]string{"node.n2.joined", "module.billing.paid", "mesh.ops.x"}},
		{"node binds on mesh.rpc", nt[wire.ExchangeRPC].Read, []string{"shop.price"}, []string{"billing.charge", "shop.price.x"}},
		{"operator publishes on mesh.events", ot[wire.ExchangeEvents].Write, []string{"mesh.ops.x", "module.shop.order.placed", "node.n1.joined"}, nil},
		{"operator binds on mesh.events", ot[wire.ExchangeEvents].Read, []string{"#", "module.shop.#"}, nil},
		{"operator publishes on mesh.rpc", ot[wire.ExchangeRPC].Write, []string{"audit.query", "shop.price"}, nil},
		{"operator binds on mesh.rpc", ot[wire.ExchangeRPC].Read, nil, []string{"audit.query", "#"}},
	} {
		re := regexp.MustCompile(c.re)
		for _, key := range c.yes {
			if !re.MatchString(key) {
				t.Errorf("%s: %s does not match %s", c.what, c.re, key)
			}
		}
		for _, key := range c.no {
			if re.MatchString(key) {
				t.Errorf("%s: %s matches %s", c.what, c.re, key)
			}
		}
	}
	if op.User != "ops" || op.VHost != "prod" || OperatorPermissions("ops", "", "").VHost != "/" {
		t.Errorf("operator %q on %q", op.User, op.VHost)
	}
}

// TestBrokerAccount: the user and virtual host of a broker URL.
func TestBrokerAccount(t *testing.T) {
	for _, c := range []struct{ url, user, vhost string }{
		{"amqp://u:p@h:5672/prod", "u", "prod"},
		{"amqps://u@h/", "u", "/"},
		{"amqp://h:5672", "", "/"},
		{"amqp://u:p@h/%2f", "u", "/"},
		{"amqp://u:p@h/a%2Fb", "u", "a/b"},
		{"::", "", "/"},
	} {
		if user, vhost := BrokerAccount(c.url); user != c.user || vhost != c.vhost {
			t.Errorf("BrokerAccount(%q) = %q, %q; want %q, %q", c.url, user, vhost, c.user, c.vhost)
		}
	}
}
