package runtime

import (
	"errors"
	"strings"
	"testing"
)

// TestIdentityRule: the identity rule as a table, for node berlin that
// connects as mesh-berlin.
func TestIdentityRule(t *testing.T) {
	users := map[string]string{"berlin": "mesh-berlin", "paris": "mesh-paris"}
	for _, c := range []struct {
		name       string
		rule       IdentityConfig
		node, user string
		want       string // "" for none; else words the error has
	}{
		{"off checks nothing", IdentityConfig{Users: users}, "berlin", "mesh-paris", ""},
		{"off by name", IdentityConfig{Mode: IdentityOff, Users: users}, "berlin", "mesh-paris", ""},
		{"mapped, its user", IdentityConfig{Mode: IdentityEnforce, Users: users}, "paris", "mesh-paris", ""},
		{"mapped, another user", IdentityConfig{Mode: IdentityEnforce, Users: users}, "berlin", "mesh-paris",
			"x-node berlin published by broker user mesh-paris; identity.users says berlin is mesh-berlin"},
		{"mapped, no user-id", IdentityConfig{Mode: IdentityWarn, Users: users}, "paris", "",
			"x-node paris published by no verified broker user (no user-id); identity.users says paris is mesh-paris"},
		{"warn says the same", IdentityConfig{Mode: IdentityWarn, Users: users}, "paris", "mesh-berlin", "identity.users says paris is mesh-paris"},
		{"unmapped", IdentityConfig{Mode: IdentityEnforce, Users: users}, "lyon", "mesh-lyon", "identity.users names no user for lyon"},
		{"unmapped in warn mode", IdentityConfig{Mode: IdentityWarn, Users: users}, "lyon", "mesh-lyon", "identity.users names no user for lyon"},
		{"by the pattern", IdentityConfig{Mode: IdentityEnforce, UserPattern: "mesh-{node}"}, "lyon", "mesh-lyon", ""},
		{"against the pattern", IdentityConfig{Mode: IdentityEnforce, UserPattern: "mesh-{node}"}, "lyon", "mesh-paris",
			"identity.user_pattern says lyon is mesh-lyon"},
		{"users before the pattern", IdentityConfig{Mode: IdentityEnforce, Users: map[string]string{"lyon": "ops-lyon"}, UserPattern: "mesh-{node}"}, "lyon", "ops-lyon", ""},
		{"the node itself, unnamed", IdentityConfig{Mode: IdentityEnforce}, "berlin", "mesh-berlin", ""},
		{"the node itself, by another", IdentityConfig{Mode: IdentityEnforce}, "berlin", "mesh-paris", "this node's amqp_url says berlin is mesh-berlin"},
		{"an operator as any node", IdentityConfig{Mode: IdentityEnforce, Users: users, Operators: []string{"ops"}}, "berlin", "ops", ""},
		{"an operator as meshctl", IdentityConfig{Mode: IdentityEnforce, Users: users, Operators: []string{"ops"}}, "meshctl-host", "ops", ""},
	} {
		err := c.rule.check("berlin", "mesh-berlin", c.node, c.user)
		var ie *IdentityError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want none", c.name, err)
		case c.want != "" && (!errors.As(err, &ie) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an IdentityError saying %q", c.name, err, c.want)
		}
	}
}

// TestIdentityValidate: the rule's keys are checked, each error naming
// its key; on, the node's own user must be known and the one the rule
// names for it.
func TestIdentityValidate(t *testing.T) {
	for _, c := range []struct {
		rule IdentityConfig
		url  string
		want string // "" for valid
	}{
		{IdentityConfig{}, "amqp://guest:guest@localhost/", ""},
		{IdentityConfig{Mode: IdentityEnforce, Users: map[string]string{"berlin": "mesh-berlin"}}, "amqp://mesh-berlin:x@localhost/", ""},
		{IdentityConfig{Mode: IdentityWarn, UserPattern: "mesh-{node}"}, "amqp://mesh-berlin:x@localhost/", ""},
		{IdentityConfig{Mode: "strict"}, "amqp://guest:guest@localhost/", "identity.mode"},
		{IdentityConfig{Users: map[string]string{"a.b": "x"}}, "amqp://guest:guest@localhost/", `identity.users["a.b"]`},
		{IdentityConfig{Users: map[string]string{"a": ""}}, "amqp://guest:guest@localhost/", `identity.users["a"]`},
		{IdentityConfig{UserPattern: "mesh"}, "amqp://guest:guest@localhost/", "identity.user_pattern"},
		{IdentityConfig{UserPattern: "{user}-{node}"}, "amqp://guest:guest@localhost/", "identity.user_pattern"},
		{IdentityConfig{Operators: []string{"ops", ""}}, "amqp://guest:guest@localhost/", "identity.operators[1]"},
		{IdentityConfig{Mode: IdentityEnforce, Users: map[string]string{"berlin": "mesh-berlin"}}, "amqp://guest:guest@localhost/",
			`identity.users: says node berlin is broker user "mesh-berlin", but this node connects as "guest"`},
		{IdentityConfig{Mode: IdentityEnforce, UserPattern: "mesh-{node}"}, "amqp://guest:guest@localhost/", "identity.user_pattern: says node berlin"},
	} {
		err := Config{Node: "berlin", AMQPURL: c.url, Identity: c.rule}.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.rule, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want an error with %q", c.rule, err, c.want)
		}
	}
}
