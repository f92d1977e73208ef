package nodeconfig

import (
	"fmt"
	neturl "net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/meshkit/mesh/internal/delay"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// Permissions are the RabbitMQ permissions a node (File.Permissions) or
// the operator's meshctl (OperatorPermissions) needs and no more: the
// regular expressions of `rabbitmqctl set_permissions` (on the names of
// exchanges and queues) and of `set_topic_permissions` (on routing keys).
type Permissions struct {
	// User is the broker user the node (or meshctl) connects as; VHost
	// its virtual host.
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

// Permissions computes what node f.Node needs to run the modules of f, and
// no more. Each name is there for a broker check the node meets
// (docs/adr/0018-least-privilege.md lists them, operation by operation):
//   - configure: what it declares: the mesh's exchanges and keeper queues
//     (every node declares them, identically), its own lock queue, its
//     modules' queues (<node>.<module>.events and .dead, and the queue
//     group.<group>.<module>.events of a module in a group, or the
//     exchange group.<group>.<module>, its intake and its partitions
//     .pNNN for one that keeps order, and after a change of its count an
//     epoch's .eE, .eEpNNN and .eEcNNN), the serve queues
//     of the tools they are granted, and server-named queues (amq.gen-*:
//     reply queues, the membership queue);
//   - write: the exchanges it publishes to (mesh.events, mesh.rpc,
//     mesh.events.dead, and the default exchange, amq.default, for replies
//     and classic retries), the alternate and dead-letter exchanges named
//     by what it declares (the broker checks write on them), and the
//     queues it binds: the keepers, its own, its serve queues and its
//     server-named ones (the membership queue);
//   - read: the exchanges it binds from (mesh.rpc only if it serves
//     tools), and the queues it consumes: its own, its serve queues,
//     server-named ones, and existing queues the config cannot name (the
//     queues of Mesh.Consume, for example a dispatcher's triggers). Not the
//     keeper queues: a node never consumes them (meshctl does, as the
//     operator, OperatorPermissions), so it cannot take the mesh's dead
//     letters or unrouted events;
//   - with delays on (the default), the delay cascade (delayObjects), which
//     it declares, binds (write on each level's queue and exchange, and on
//     the exchange each dead-letters to; read on the exchanges it binds
//     from) and publishes to (mesh.delay), and its own due queue
//     mesh.node.<node>.due, which it declares, binds and consumes, and
//     the serve queues of its delays module's tools (delays.<node>.ls and
//     .cancel, which only meshctl may call). The
//     levels' queues have the names of their exchanges, so read on them
//     is read on the queues too: a node could take what waits there (what
//     it takes it cannot have delivered by another node's mover, which
//     publishes only its own user's schedules);
//   - on mesh.events it may publish only node.<node>. keys, the reports of
//     peers it finds unreachable, its modules' module.<module>. keys, and
//     the full types their emit_grants allow; on mesh.rpc it may publish
//     only the tools its modules may call (calls:) and bind only the tools
//     they are granted (tools:). The queues of consumes: are read.
//
// user is the broker user; empty takes the one of the first broker
// address (amqp_url, else the first of amqp_urls).
func (f File) Permissions(user string, consumed []string) Permissions {
	urlUser, vhost := BrokerAccount(f.Runtime().Brokers()[0])
	if user == "" {
		user = urlUser
	}
	p := Permissions{User: user, VHost: vhost}
	var modules, tools, emits, calls, consumes []string
	for _, m := range f.Modules {
		modules = append(modules, regexp.QuoteMeta(m.Name))
		for _, t := range m.Tools {
			tools = append(tools, PatternRegexp(t))
		}
		for _, c := range slices.Concat(f.Defaults.Calls, m.Calls) {
			calls = append(calls, PatternRegexp(c))
		}
		for _, c := range slices.Concat(f.Defaults.Consumes, m.Consumes) {
			consumes = append(consumes, PatternRegexp(c))
		}
		for _, g := range m.EmitGrants {
			emits = append(emits, PatternRegexp(g))
		}
	}
	node := regexp.QuoteMeta(f.Node)
	q := regexp.QuoteMeta
	delays := f.Runtime().Delays
	if delays { // its delays module serves delays.<node>.ls and .cancel
		tools = append(tools, PatternRegexp(runtime.DelayedTool(f.Node, "*")))
	}
	var own []string // the node's queues, which it declares, binds and consumes
	if len(modules) > 0 {
		own = append(own, node+`\.(?:`+strings.Join(modules, "|")+`)\.(?:events|dead)`)
	}
	for _, m := range f.Modules {
		switch {
		case m.Group != "" && m.Partitions > 0:
			// An ordered group's exchange, intake (exchange and queue) and
			// partitions, which every member declares, binds and consumes.
			// A change of its count (meshctl groups repartition) adds an
			// epoch's exchange .eE, partitions .eEpNNN and catch-up
			// queues .eEcNNN.
			own = append(own, q(wire.GroupExchange(m.Group, m.Name))+`(?:\.(?:intake|p[0-9]{3}|e[0-9]+(?:[pc][0-9]{3})?))?`)
		case m.Group != "": // the queue its group shares, which every member declares, binds and consumes
			own = append(own, q(wire.GroupQueue(m.Group, m.Name)))
		}
	}
	if len(tools) > 0 {
		own = append(own, `serve\.(?:`+strings.Join(tools, "|")+`)`)
	}
	reads := consumes // the queues its modules are granted (consumes:)
	for _, c := range consumed {
		reads = append(reads, q(c))
	}
	// Exchanges it binds from: mesh.rpc only to serve.
	from := []string{q(wire.ExchangeEvents), q(wire.ExchangeDead), q(wire.ExchangeUnrouted)}
	if len(tools) > 0 {
		from = append(from, q(wire.ExchangeRPC))
	}
	var cascade []string // the delay cascade and the node's due queue
	if delays {
		cascade = []string{delayObjects, q(delay.DueQueue(f.Node))}
	}
	// The history's stream, which every node declares and binds, and
	// reads if one of its modules is granted it.
	var history []string
	if stream := f.History.Stream; stream != "" {
		history = []string{q(stream)}
		if slices.ContainsFunc(f.Modules, func(m Module) bool { return m.History }) {
			reads = append(reads, q(stream))
		}
	}
	p.Configure = anyOf(slices.Concat(meshExchanges(), keeperQueues(), []string{q(wire.NodeLockQueue(f.Node))}, own, cascade, history, []string{serverNamed}))
	p.Write = anyOf(slices.Concat(meshExchanges(), keeperQueues(), own, cascade, history, []string{serverNamed, defaultExchange}))
	p.Read = anyOf(slices.Concat(from, own, cascade, []string{serverNamed}, reads))

	// Its own node.<node>. events, and the reports of peers it finds
	// unreachable (membership).
	publish := []string{`node\.` + node + `\..*`, `node\.[^.]+\.unreachable`}
	if len(modules) > 0 {
		publish = append(publish, `module\.(?:`+strings.Join(modules, "|")+`)\..*`)
	}
	publish = append(publish, emits...)
	serve := nothing // serves no tool
	if len(tools) > 0 {
		serve = anyOf(tools)
	}
	call := nothing // calls no tool
	if len(calls) > 0 {
		call = anyOf(calls)
	}
	p.Topics = []TopicPermission{
		{Exchange: wire.ExchangeEvents, Write: anyOf(publish), Read: ".*"},
		{Exchange: wire.ExchangeRPC, Write: call, Read: serve},
	}
	return p
}

// OperatorPermissions are what meshctl needs as the operator's broker user
// for its commands that talk to the mesh: emit, tail, call, nodes, graph,
// audit (query, count, get, trace, export, stats, replay), dispatcher, dlq
// and unrouted (ls, show, replay, purge). Each connects as an ephemeral
// node, or browses a keeper queue on a plain connection:
//   - configure: the mesh's exchanges and keeper queues (meshctl declares
//     the topology as any node does), the delay cascade (emit --after
//     declares it, as a node with delays on does, and publishes to
//     mesh.delay, for which it needs write and, to bind its levels, read
//     too), and server-named queues (amq.gen-*: its reply queues and
//     tail's queue). No node's or module's queue: the operator's user
//     cannot declare, and so delete, them;
//   - write: mesh.events (emit, replays) and mesh.rpc (call, and the audit
//     and dispatcher commands, which call tools), mesh.events.unrouted
//     (the alternate exchange of mesh.events), the keeper queues and
//     server-named ones (which it binds), and amq.default (dlq replay and
//     audit replay --target send to one module's queue by name);
//   - read: mesh.events, mesh.events.dead and mesh.events.unrouted (it binds
//     from them), the keeper queues (dlq and unrouted browse them), and
//     server-named queues (replies, tail). No module's queue: it consumes
//     none;
//   - on mesh.events it may publish and bind any key (emit takes any full
//     type, replays keep the events' own, tail any pattern); on mesh.rpc
//     it may publish any key (call any tool) and bind none (it serves none).
//
// topology check and topology print are not among them: check declares a
// node's own queues, so it runs as the node's user (Permissions) or an
// administrator.
func OperatorPermissions(user, vhost, history string) Permissions {
	if vhost == "" {
		vhost = "/"
	}
	q := regexp.QuoteMeta
	var stream []string // audit replay --history reads it, and writes its cutoff's marker into it
	if history != "" {
		stream = []string{q(history)}
	}
	return Permissions{
		User:      user,
		VHost:     vhost,
		Configure: anyOf(slices.Concat(meshExchanges(), keeperQueues(), []string{delayObjects, serverNamed})),
		Write: anyOf(slices.Concat([]string{q(wire.ExchangeEvents), q(wire.ExchangeRPC), q(wire.ExchangeUnrouted)}, keeperQueues(),
			[]string{delayObjects, serverNamed, defaultExchange}, stream)),
		Read: anyOf(slices.Concat([]string{q(wire.ExchangeEvents), q(wire.ExchangeDead), q(wire.ExchangeUnrouted)}, keeperQueues(),
			[]string{delayObjects, serverNamed}, stream)),
		Topics: []TopicPermission{
			{Exchange: wire.ExchangeEvents, Write: ".*", Read: ".*"},
			{Exchange: wire.ExchangeRPC, Write: ".*", Read: nothing},
		},
	}
}

const (
	// serverNamed matches the queues the broker names (queue.declare with
	// an empty name): reply queues, membership's and tail's. The mesh's
	// are exclusive, so another connection, even of the same user, can
	// neither consume nor bind them (405 RESOURCE_LOCKED); a client cannot
	// declare an amq. name itself (403).
	serverNamed = `amq\.gen-.*`
	// defaultExchange is the name RabbitMQ checks permissions on for the
	// default exchange ("").
	defaultExchange = `amq\.default`
	// nothing matches no name: a topic permission that allows no key.
	nothing = `^$`
)

// delayObjects matches the names of the delay cascade's exchanges and
// level queues (internal/delay): mesh.delay, mesh.delay.00 to
// mesh.delay.27 and mesh.delay.due.
const delayObjects = `mesh\.delay(?:\.[0-9]{2}|\.due)?`

// meshExchanges are the mesh's exchanges, as regular expressions. Every
// node declares them, and write on mesh.events.unrouted too, though nothing
// is published to it: RabbitMQ checks write on an alternate exchange when
// the exchange naming it is declared (measured: 403 without).
func meshExchanges() []string {
	q := regexp.QuoteMeta
	return []string{q(wire.ExchangeEvents), q(wire.ExchangeRPC), q(wire.ExchangeDead), q(wire.ExchangeUnrouted)}
}

// keeperQueues are the queues that keep dead letters and unrouted events,
// as regular expressions.
func keeperQueues() []string {
	return []string{regexp.QuoteMeta(wire.QueueUnrouted), regexp.QuoteMeta(wire.QueueDead)}
}

// BrokerAccount is the user and the virtual host ("/" if it names none) of
// a broker URL; the user is empty if the URL names none or does not parse.
func BrokerAccount(url string) (user, vhost string) {
	vhost = "/"
	u, err := neturl.Parse(url)
	if err != nil {
		return "", vhost
	}
	if v := strings.TrimPrefix(u.Path, "/"); v != "" {
		if unescaped, err := neturl.PathUnescape(v); err == nil {
			vhost = unescaped
		}
	}
	return u.User.Username(), vhost
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
