package runtime

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/meshkit/mesh/internal/grant"
	"github.com/meshkit/mesh/internal/wire"
)

// Grants are checked by the host, never by the sdk in a module's process
// (docs/security.md): what a module may emit (EmitGrants), serve
// (ToolGrants), call (CallGrants), consume (ConsumeGrants) and receive as
// dead letters (DeadLetterGrants), and who may call what it serves
// (Callers). This file holds the checks that are not the emit path's.

// ValidateCallerPattern checks one entry of a tool's callers: "MODULE"
// (the module of that name on any node), "NODE/MODULE" (either part may be
// "*"), or "user:USER" (the broker user the request's user-id names, which
// the broker verified). "meshctl" is the operator's meshctl.
func ValidateCallerPattern(p string) error {
	if user, ok := strings.CutPrefix(p, "user:"); ok {
		if user == "" || strings.ContainsFunc(user, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("%w: caller %q: a user: pattern names one broker user, without spaces or control characters", wire.ErrInvalid, p)
		}
		return nil
	}
	node, module, hasNode := strings.Cut(p, "/")
	if !hasNode {
		node, module = "*", p
	}
	if strings.Contains(module, "/") {
		return fmt.Errorf("%w: caller %q: one / at most (NODE/MODULE)", wire.ErrInvalid, p)
	}
	for _, part := range []struct{ what, v string }{{"node", node}, {"module", module}} {
		if part.v == "*" {
			continue
		}
		if err := wire.ValidateWord(part.what+" name", part.v); err != nil {
			return fmt.Errorf("caller %q (MODULE, NODE/MODULE with * for any, or user:USER): %w", p, err)
		}
	}
	return nil
}

// Caller is who sent a tool request: the module (x-source) on the node
// (x-node) its node stamped, and the broker user the broker verified
// (user-id), "" when the request carries none.
type Caller struct {
	Node, Module, User string
}

// matches reports whether c is what the caller pattern p allows.
func (c Caller) matches(p string) bool {
	if user, ok := strings.CutPrefix(p, "user:"); ok {
		return c.User != "" && c.User == user
	}
	node, module, hasNode := strings.Cut(p, "/")
	if !hasNode {
		node, module = "*", p
	}
	return (node == "*" || node == c.Node) && (module == "*" || module == c.Module)
}

// String is the caller as a caller pattern names it, with its user.
func (c Caller) String() string {
	s := c.Node + "/" + c.Module
	if c.User != "" {
		s += " (user " + c.User + ")"
	}
	return s
}

// errCallerRefused is what a refused caller gets: the permanent tool
// error code "forbidden".
var errCallerRefused = errors.New("caller refused")

// callersOf are the caller patterns that may call tool: the first entry of
// the node config's callers whose tool pattern matches, else the module's
// own default (sdk.Module.Callers), else nil (anyone).
func callersOf(tool string, configured, defaults map[string][]string) (patterns []string, limited bool) {
	for _, m := range []map[string][]string{configured, defaults} {
		for _, k := range sortedKeys(m) {
			if wire.MatchPattern(k, tool) {
				return m[k], true
			}
		}
	}
	return nil, false
}

// checkCaller refuses a request to tool whose caller its patterns do not
// allow. A limited tool takes only requests whose user-id the broker
// verified: without one, nothing says which node sent it.
func (m *Module) checkCaller(tool string, c Caller) error {
	patterns, limited := callersOf(tool, m.cfg.Callers, m.def.Callers)
	if !limited {
		return nil
	}
	if c.User == "" {
		return fmt.Errorf("%w: %s takes only requests whose sender the broker verified (user-id), and this one has none", errCallerRefused, tool)
	}
	for _, p := range patterns {
		if c.matches(p) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s may not call %s (its callers are %q: add the caller to callers: of module %s's entry in its node's mesh.yaml)",
		errCallerRefused, c, tool, patterns, m.def.Name)
}

// checkCallGrant refuses a call the module is not granted.
func (m *Module) checkCallGrant(tool string) error {
	err := grant.Call(m.def.Name, tool, m.cfg.CallGrants)
	if errors.Is(err, wire.ErrForbidden) { // not a key against the naming rules
		m.log.Warn("call of a tool the node config does not grant refused", "tool", tool)
	}
	return err
}

// deadLetterPatterns are the patterns the module's dead-letter queue is
// bound with, or an error when the module has a DeadLetters handler but
// no grant.
func (m *Module) deadLetterPatterns() ([]string, error) {
	return grant.DeadLetters(m.def.Name, m.cfg.DeadLetterGrants)
}

func sortedKeys(m map[string][]string) []string {
	// Longest first, then by text: a specific entry ("audit.replayed")
	// wins over a wider one ("audit.*") whatever the map's order.
	return slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b))
	})
}
