package nodeconfig

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/meshkit/mesh/internal/wire"
)

// Permissions are the RabbitMQ permissions a node needs and no more: the
// regular expressions of `rabbitmqctl set_permissions` (on the names of
// exchanges and queues) and of `set_topic_permissions` (on routing keys).
type Permissions struct {
	// User is the broker user the node connects as; VHost its virtual
	// host.
	User  string `json:"user"`
	VHost string `json:"vhost"`
	// Configure, Write and Read match the names of the exchanges and
	// queues the node may declare, publish to (or bind a queue to), and
	// consume from (or bind from).
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
	// Topics narrow what the node may publish to (and bind from) the
	// mesh's topic exchanges by routing key.
	Topics []TopicPermission `json:"topics"`
}

// TopicPermission is what a user may publish to a topic exchange (Write,
// by routing key) and bind a queue to it with (Read, by binding key).
type TopicPermission struct {
	Exchange string `json:"exchange"`
	Write    string `json:"write"`
	Read     string `json:"read"`
}

// Permissions computes what node f.Node needs to run the modules of f:
//   - configure: the mesh's exchanges and keeper queues (every node
//     declares them, identically), its own lock queue, its modules' queues
//     (<node>.<module>.events and .dead), the serve queues of the tools
//     they are granted, and server-named reply queues (amq.gen-*);
//   - write: the exchanges it publishes to (mesh.events, mesh.rpc,
//     mesh.events.dead, and the default exchange for replies and classic
//     retries) and the queues it binds;
//   - read: the exchanges it binds from and the queues it consumes,
//     including consumed, existing queues the config cannot name (the
//     queues of Mesh.Consume, for example a dispatcher's triggers);
//   - on mesh.events it may publish only node.<node>. keys, its modules'
//     module.<module>. keys, and the full types their emit_grants allow;
//     on mesh.rpc it may bind only the tools its modules are granted.
//
// user is the broker user; empty takes the one of the first broker
// address (amqp_url, else the first of amqp_urls).
func (f File) Permissions(user string, consumed []string) Permissions {
	p := Permissions{User: user, VHost: "/"}
	if u, err := url.Parse(f.Runtime().Brokers()[0]); err == nil {
		if p.User == "" {
			p.User = u.User.Username()
		}
		if v := strings.TrimPrefix(u.Path, "/"); v != "" {
			if unescaped, err := url.PathUnescape(v); err == nil {
				p.VHost = unescaped
			}
		}
	}
	var modules, tools, emits []string
	for _, m := range f.Modules {
		modules = append(modules, regexp.QuoteMeta(m.Name))
		for _, t := range m.Tools {
			tools = append(tools, PatternRegexp(t))
		}
		for _, g := range m.EmitGrants {
			emits = append(emits, PatternRegexp(g))
		}
	}
	node := regexp.QuoteMeta(f.Node)
	q := regexp.QuoteMeta
	exchanges := []string{q(wire.ExchangeEvents), q(wire.ExchangeRPC), q(wire.ExchangeDead)}
	keepers := []string{q(wire.QueueUnrouted), q(wire.QueueDead)}
	lock := q(wire.NodeLockQueue(f.Node))
	var own []string
	if len(modules) > 0 {
		own = append(own, node+`\.(?:`+strings.Join(modules, "|")+`)\.(?:events|dead)`)
	}
	if len(tools) > 0 {
		own = append(own, `serve\.(?:`+strings.Join(tools, "|")+`)`)
	}
	reply := `amq\.gen-.*`
	var reads []string
	for _, c := range consumed {
		reads = append(reads, q(c))
	}
	// The alternate exchange needs write too, though the node publishes
	// nothing to it directly: RabbitMQ checks write on it when mesh.events
	// is declared with it (measured: 403 without).
	unrouted := q(wire.ExchangeUnrouted)
	p.Configure = anyOf(slices.Concat(exchanges, []string{unrouted}, keepers, []string{lock}, own, []string{reply}))
	p.Write = anyOf(slices.Concat(exchanges, []string{unrouted}, keepers, own, []string{q("amq.default")}))
	p.Read = anyOf(slices.Concat(exchanges, []string{unrouted}, keepers, own, []string{reply}, reads))

	// Its own node.<node>. events, and the reports of peers it finds
	// unreachable (membership).
	publish := []string{`node\.` + node + `\..*`, `node\.[^.]+\.unreachable`}
	if len(modules) > 0 {
		publish = append(publish, `module\.(?:`+strings.Join(modules, "|")+`)\..*`)
	}
	publish = append(publish, emits...)
	serve := `^$` // serves no tool
	if len(tools) > 0 {
		serve = anyOf(tools)
	}
	p.Topics = []TopicPermission{
		{Exchange: wire.ExchangeEvents, Write: anyOf(publish), Read: ".*"},
		{Exchange: wire.ExchangeRPC, Write: ".*", Read: serve},
	}
	return p
}

// anyOf is a regular expression matching a whole name that one of alts
// (regular expressions) matches.
func anyOf(alts []string) string {
	return "^(?:" + strings.Join(alts, "|") + ")$"
}

// PatternRegexp is a regular expression (without anchors) matching the
// routing keys an AMQP topic pattern matches: * is one word, # any number
// of words, zero included.
func PatternRegexp(pattern string) string {
	var words []string
	for _, w := range strings.Split(pattern, ".") {
		if w == "#" && len(words) > 0 && words[len(words)-1] == "#" {
			continue // #.# is #
		}
		words = append(words, w)
	}
	if len(words) == 1 && words[0] == "#" {
		return `.*`
	}
	var b strings.Builder
	for i, w := range words {
		switch {
		case w == "#" && i == 0:
			b.WriteString(`(?:[^.]+\.)*`) // the words before the next one
		case w == "#":
			b.WriteString(`(?:\.[^.]+)*`) // the words after the previous one
		default:
			if i > 0 && !(i == 1 && words[0] == "#") {
				b.WriteString(`\.`)
			}
			if w == "*" {
				b.WriteString(`[^.]+`)
			} else {
				b.WriteString(regexp.QuoteMeta(w))
			}
		}
	}
	return b.String()
}

// Commands are the rabbitmqctl commands that give p, one per line, with
// the user's creation first (its password left for the operator to set).
func (p Permissions) Commands() []string {
	sh := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	cmds := []string{
		fmt.Sprintf("rabbitmqctl add_user %s \"$PASSWORD\"   # skip if the user exists", sh(p.User)),
		fmt.Sprintf("rabbitmqctl set_permissions -p %s %s %s %s %s", sh(p.VHost), sh(p.User), sh(p.Configure), sh(p.Write), sh(p.Read)),
	}
	for _, t := range p.Topics {
		cmds = append(cmds, fmt.Sprintf("rabbitmqctl set_topic_permissions -p %s %s %s %s %s", sh(p.VHost), sh(p.User), sh(t.Exchange), sh(t.Write), sh(t.Read)))
	}
	return cmds
}
