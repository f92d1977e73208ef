package main

import (
	"strings"
	"testing"

	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/runtime"
)

const (
	siteV1 = `{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "name": {"type": "string"}}}`
	// siteV2 adds an optional field: compatible both ways.
	siteV2 = `{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "name": {"type": "string"}, "plan": {"type": "string"}}}`
	// siteV3 retypes id: compatible with nothing.
	siteV3 = `{"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}`
)

func declared(t, v, doc string, current bool) schema.Declared {
	return schema.Declared{Type: t, Version: v, Digest: schema.Digest([]byte(doc)), Current: current}
}

// liveSites is a mesh where umami emits site.created version 2 (having
// declared 1 before), billing reads 1 and 2 and the notifier any version.
func liveSites() ([]*schemaType, map[string][]byte) {
	const typ = "module.umami.site.created"
	beats := []runtime.Heartbeat{
		{Node: "web", Modules: []runtime.ModuleSummary{{Name: "umami", Emits: []string{typ},
			Schemas: []schema.Declared{declared(typ, "1", siteV1, false), declared(typ, "2", siteV2, true)}}}},
		{Node: "back", Modules: []runtime.ModuleSummary{
			{Name: "billing", Patterns: []string{typ}, Reads: map[string][]string{typ: {"1", "2"}}},
			{Name: "notifier", Patterns: []string{"module.umami.#"}},
		}},
	}
	docs := map[string][]byte{}
	for _, d := range []string{siteV1, siteV2} {
		docs[schema.Digest([]byte(d))] = []byte(d)
	}
	return schemaTypes(beats), docs
}

// TestSchemaTypes: the heartbeats give each type its versions in
// declaration order, the current one, and every consumer with what it
// reads ("*" for one that declares nothing).
func TestSchemaTypes(t *testing.T) {
	types, _ := liveSites()
	if len(types) != 1 {
		t.Fatalf("types %+v", types)
	}
	st := types[0]
	if len(st.Versions) != 2 || st.current().Version != "2" || st.Versions[0].DeclaredBy[0] != "web/umami" {
		t.Errorf("versions %+v", st.Versions)
	}
	if len(st.Consumers) != 2 || strings.Join(st.Consumers[0].Reads, ",") != "1,2" || st.Consumers[1].Reads != nil {
		t.Errorf("consumers %+v", st.Consumers)
	}
}

// TestCheckCandidate: a compatible version 3 passes the rule but breaks
// billing, which does not list it; an incompatible one fails the rule
// and the notifier, which reads it as version 2; the transitive rule
// checks version 1 too; a version declared already with another schema
// is refused; a document missing from the audit log leaves it undecided.
func TestCheckCandidate(t *testing.T) {
	types, docs := liveSites()
	const typ = "module.umami.site.created"
	check := func(rule schema.Rule, version, doc string, docs map[string][]byte) schemaCheckResult {
		t.Helper()
		res, err := checkCandidate(candidate{Type: typ, Version: version, JSON: []byte(doc)}, rule, types, docs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	consumer := func(res schemaCheckResult, module string) consumerCheck {
		for _, c := range res.Consumers {
			if c.Module == module {
				return c
			}
		}
		t.Fatalf("no consumer %s in %+v", module, res.Consumers)
		return consumerCheck{}
	}

	res := check(schema.RuleFull, "3", siteV2, docs)
	if res.Rule.Verdict != schema.VerdictCompatible || res.Verdict != schema.VerdictIncompatible {
		t.Errorf("an unchanged body as version 3: %+v", res)
	}
	if b := consumer(res, "billing"); b.Verdict != schema.VerdictIncompatible || !strings.Contains(b.Problem, "would be dead-lettered") {
		t.Errorf("billing: %+v", b)
	}
	if n := consumer(res, "notifier"); n.Verdict != schema.VerdictCompatible {
		t.Errorf("notifier: %+v", n)
	}

	res = check(schema.RuleBackward, "3", siteV3, docs)
	if res.Rule.Verdict != schema.VerdictIncompatible || len(res.Rule.Against) != 1 || res.Rule.Against[0].Version != "2" {
		t.Errorf("a retyped id, backward: %+v", res.Rule)
	}
	if n := consumer(res, "notifier"); n.Verdict != schema.VerdictIncompatible || !strings.Contains(n.Problem, "/properties/id") {
		t.Errorf("notifier of a retyped id: %+v", n)
	}
	if res = check(schema.RuleBackwardTransitive, "3", siteV3, docs); len(res.Rule.Against) != 2 {
		t.Errorf("transitive: checked against %+v, want 1 and 2", res.Rule.Against)
	}

	if res = check(schema.RuleNone, "2", siteV3, docs); res.Verdict != schema.VerdictIncompatible || !strings.Contains(res.Rule.Against[0].Findings[0].Problem, "needs a new version") {
		t.Errorf("version 2 changed in place: %+v", res)
	}

	res = check(schema.RuleBackwardTransitive, "3", siteV2, map[string][]byte{schema.Digest([]byte(siteV2)): []byte(siteV2)})
	if len(res.Missing) != 1 || res.Missing[0] != "1" {
		t.Errorf("missing %+v", res.Missing)
	}
}
