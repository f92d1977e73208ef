package runtime

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// The identity rule (Config.Identity; docs/security.md): the broker checks
// that a message's user-id is its publisher's, and nothing else, so a
// node's broker user can write any x-node and x-source. With the rule on,
// a node holds the x-node of every event its modules take from their
// queues, and of every tool request they serve, to the broker user the
// rule names for that node, read from the verified user-id as owned.go
// reads it (the original publisher's on the node's own retry copy).

// Modes of the identity rule (IdentityConfig.Mode).
const (
	// IdentityOff checks nothing (the default, as v0.1.0).
	IdentityOff = "off"
	// IdentityWarn delivers an event whose x-node another broker user
	// published (or one the rule names no user for), logs a warning within
	// a budget and counts it: what enforce would refuse.
	IdentityWarn = "warn"
	// IdentityEnforce dead-letters such an event with reason identity
	// (wire.DeadReasonIdentity) and refuses such a tool request as
	// forbidden; the handler never runs.
	IdentityEnforce = "enforce"
)

// nodePlaceholder stands for the node's name in IdentityConfig.UserPattern.
const nodePlaceholder = "{node}"

// IdentityConfig ties each node of the mesh (the x-node its events and
// requests carry) to the broker user it publishes as (their user-id, which
// the broker verifies).
type IdentityConfig struct {
	// Mode is IdentityOff (or empty), IdentityWarn or IdentityEnforce.
	Mode string
	// Users names each node's broker user: node name → user.
	Users map[string]string
	// UserPattern names the broker user of a node Users does not name,
	// {node} standing for its name ("mesh-{node}"); empty: none. A node
	// neither names is this node itself (its own broker user), or, in
	// enforce mode, refused.
	UserPattern string
	// Operators are broker users that may publish as any node: meshctl's,
	// whose emits carry x-node meshctl-HOST and whose replays keep the
	// original event's x-node (a replay is published as the replaying
	// user).
	Operators []string
}

// on reports whether the rule checks anything.
func (c IdentityConfig) on() bool {
	return c.Mode == IdentityWarn || c.Mode == IdentityEnforce
}

// userOf is the broker user the rule names for node, and which part of
// the rule names it ("identity.users", "identity.user_pattern"); "" if
// none does.
func (c IdentityConfig) userOf(node string) (user, by string) {
	if u, ok := c.Users[node]; ok {
		return u, "identity.users"
	}
	if c.UserPattern != "" {
		return strings.ReplaceAll(c.UserPattern, nodePlaceholder, node), "identity.user_pattern"
	}
	return "", ""
}

// validate checks the rule for a node named self that publishes as
// selfUser (its broker URL's user), naming the key of mesh.yaml.
func (c IdentityConfig) validate(self, selfUser string) error {
	var errs []error
	switch c.Mode {
	case "", IdentityOff, IdentityWarn, IdentityEnforce:
	default:
		errs = append(errs, fmt.Errorf("identity.mode: %q is not %s, %s or %s", c.Mode, IdentityOff, IdentityWarn, IdentityEnforce))
	}
	bad := func(s string) bool {
		return s == "" || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
	}
	for _, node := range slices.Sorted(maps.Keys(c.Users)) {
		if err := wire.ValidateWord("node name", node); err != nil {
			errs = append(errs, fmt.Errorf("identity.users[%q]: %w", node, err))
		}
		if bad(c.Users[node]) {
			errs = append(errs, fmt.Errorf("identity.users[%q]: %q is not a broker user name", node, c.Users[node]))
		}
	}
	if p := c.UserPattern; p != "" {
		rest := strings.ReplaceAll(p, nodePlaceholder, "")
		if !strings.Contains(p, nodePlaceholder) || strings.ContainsAny(rest, "{}") || bad(rest) {
			errs = append(errs, fmt.Errorf("identity.user_pattern: %q is not a user name with %s for the node's name (mesh-%s)", p, nodePlaceholder, nodePlaceholder))
		}
	}
	for i, u := range c.Operators {
		if bad(u) {
			errs = append(errs, fmt.Errorf("identity.operators[%d]: %q is not a broker user name", i, u))
		}
	}
	if c.on() && self != "" {
		want, by := c.userOf(self)
		switch {
		case selfUser == "":
			errs = append(errs, fmt.Errorf("identity.mode: %s needs the node's broker user in its amqp_url: its events carry that user as their user-id, which the rule checks", c.Mode))
		case want != "" && want != selfUser:
			errs = append(errs, fmt.Errorf("%s: says node %s is broker user %q, but this node connects as %q: the mesh would refuse its own events", by, self, want, selfUser))
		}
	}
	return errors.Join(errs...)
}

// IdentityError is why a delivery breaks the identity rule: its x-node
// was published by another broker user than the rule names for that node,
// by no verified user, or, in enforce mode, the rule names no user for it.
type IdentityError struct {
	Node string // the x-node it carries
	User string // the broker user that published it (its verified user-id; "" for none)
	Want string // the user the rule names for Node; "" for none
	By   string // the part of the rule that names Want (identity.users, identity.user_pattern, or the node itself)
}

// Error names the node, the publisher and, if any, the user the rule
// names for the node.
func (e *IdentityError) Error() string {
	who := "broker user " + e.User
	if e.User == "" {
		who = "no verified broker user (no user-id)"
	}
	if e.Want == "" {
		return fmt.Sprintf("x-node %s published by %s; identity.users names no user for %s (identity.mode enforce refuses a node it does not name)",
			e.Node, who, e.Node)
	}
	return fmt.Sprintf("x-node %s published by %s; %s says %s is %s", e.Node, who, e.By, e.Node, e.Want)
}

// check holds an x-node of node, published by user (the verified user-id,
// as originOf reads it), to the rule of a node named self that publishes
// as selfUser: nil if it keeps it, else the *IdentityError.
func (c IdentityConfig) check(self, selfUser, node, user string) error {
	if !c.on() {
		return nil
	}
	if user != "" && slices.Contains(c.Operators, user) {
		return nil // the operator's: its emits, and its replays of any node's events
	}
	want, by := c.userOf(node)
	if want == "" && node == self {
		want, by = selfUser, "this node's amqp_url"
	}
	if want == "" || user != want {
		return &IdentityError{Node: node, User: user, Want: want, By: by}
	}
	return nil
}

// identity holds a delivery d to module m (an event of its queue, or a
// request for one of its tools) that claims x-node node and was published
// by user (its verified publisher) to the node's identity rule. In
// enforce mode a breach is the error to refuse d with; in warn mode it is
// logged within a budget (what is the delivery: "event" or "request",
// with its id and type) and nil. Either way it is counted
// (mesh.identity.mismatches).
func (m *Module) identity(d amqp.Delivery, what, id, typ, node, user string) error {
	rule := m.node.cfg.Identity
	err := rule.check(m.node.cfg.Node, m.node.userID, node, user)
	if err == nil {
		return nil
	}
	m.from(d).identity.Add(1)
	if rule.Mode == IdentityEnforce {
		return err
	}
	ok, suppressed := m.identityWarns.take(time.Now())
	if !ok {
		return nil
	}
	attrs := []any{"what", what, "id", id, "type", typ, "x_node", node, "user_id", user, "err", err}
	if suppressed > 0 {
		attrs = append(attrs, "warnings_not_logged", suppressed)
	}
	m.log.Warn("identity: "+what+" delivered although its x-node is not its publisher's (identity.mode warn; enforce would refuse it)", attrs...)
	return nil
}
