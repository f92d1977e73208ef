// Package grant holds the checks of a module's grants that every host
// makes the same way, and their words, written once: meshd (runtime) and
// the test mesh (sdk/meshtest) refuse with them, so a module's unit tests
// read what its node will say. The grants themselves are a module's entry
// in meshd's config (calls:, dead_letters:, history:); the consumes: check
// is internal/setup's, the emit checks internal/wire's.
package grant

import (
	"fmt"

	"github.com/meshkit/mesh/internal/wire"
)

// Call refuses a call of tool by module unless a pattern of grants (its
// calls:) matches it; nil grants place no limit. The error is
// wire.ErrForbidden and names the key to add; for a key against the
// naming rules, which no grant could name, it is wire.ErrInvalid, as a
// module process's sdk says before it asks its node.
func Call(module, tool string, grants []string) error {
	if err := wire.ValidateToolKey(tool); err != nil {
		return fmt.Errorf("call: %w", err) // no grant could name it
	}
	if grants == nil {
		return nil
	}
	for _, g := range grants {
		if wire.MatchPattern(g, tool) {
			return nil
		}
	}
	return fmt.Errorf("call %s: %w: module %s's entry in mesh.yaml does not grant it (%s): add %q to its calls:",
		tool, wire.ErrForbidden, module, wire.GrantsHave("calls", grants), tool)
}

// DeadLetters are the patterns of event types module's DeadLetters
// handler receives: its grants (dead_letters:), every type ("#") for nil
// grants, and an error (wire.ErrForbidden) for an empty list.
func DeadLetters(module string, grants []string) ([]string, error) {
	if grants == nil {
		return []string{"#"}, nil
	}
	if len(grants) == 0 {
		return nil, fmt.Errorf("%w: module %s has a DeadLetters handler, and its entry in mesh.yaml grants it no dead letters: "+
			"add the event type patterns it may receive, e.g. \"module.billing.#\" or \"#\", to its dead_letters:", wire.ErrForbidden, module)
	}
	return grants, nil
}

// History refuses module a History handler its entry does not grant.
func History(module string) error {
	return fmt.Errorf("module %s: %w: it reads the mesh's history, and its entry in mesh.yaml does not grant it: set history: true in its entry", module, wire.ErrForbidden)
}
