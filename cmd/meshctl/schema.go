package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// errUndecided is what a schema check matches when it could not decide
// (a keyword the checker does not decide, a document not found): exit 2,
// apart from a compatible 0 and an incompatible 1.
var errUndecided = errors.New("undecided")

// schemaCommand is `meshctl schema`: the mesh's declared body schemas
// (ADR 34), from the nodes' heartbeats (who declares which version, who
// reads it) and the audit log (the documents, from node.*.schemas).
func schemaCommand() *cli.Command {
	timeout := auditTimeoutFlag()
	asJSON := &cli.BoolFlag{Name: "json", Usage: "print one JSON object"}
	return &cli.Command{
		Name:  "schema",
		Usage: "the mesh's body schemas: every type with its versions, who emits and who reads each; show, diff and check them",
		Subcommands: []*cli.Command{
			{
				Name:   "ls",
				Usage:  "list every emitted event type with its declared schema versions (from the heartbeats), who declares and who consumes each",
				Flags:  append(waitFlags(), asJSON),
				Action: schemaLs,
			},
			{
				Name:      "show",
				Usage:     "print the schema of a type's version (the current one by default), from the audit log's node.*.schemas",
				ArgsUsage: "TYPE",
				Flags:     append(waitFlags(), &cli.StringFlag{Name: "version", Usage: "the version (default: the one emitted now)"}, timeout),
				Action:    schemaShow,
			},
			{
				Name:      "diff",
				Usage:     "compare two schemas, each a file or TYPE@VERSION: can each read the other's bodies, and where not",
				ArgsUsage: "OLD NEW",
				Flags:     append(waitFlags(), asJSON, timeout),
				Action:    schemaDiff,
			},
			{
				Name: "check",
				Usage: "check a new schema (a file, with --type and --version) or a module binary's declared schemas against the live mesh: " +
					"the compatibility rule against the declared versions, and every live consumer of the type; " +
					"exit 0 compatible, 1 incompatible (naming what breaks), 2 undecided",
				ArgsUsage: "FILE|BINARY",
				Flags: append(waitFlags(),
					&cli.StringFlag{Name: "type", Usage: "the full event type FILE is a schema of"},
					&cli.StringFlag{Name: "version", Usage: "the version FILE would be declared as"},
					&cli.StringFlag{Name: "rule", Value: string(schema.RuleBackward), Usage: "none, backward, forward, full, or their _transitive variants (Confluent's definitions)"},
					&cli.IntFlag{Name: "sample", Usage: "also validate the oldest N bodies of the type the audit log holds (at most 1000) against the new schema"},
					&cli.StringFlag{Name: "settings", Usage: "a module binary's settings (JSON), as its node config's config: would hand them"},
					&cli.BoolFlag{Name: "offline", Usage: "check a module binary against the earlier versions it declares itself, without the mesh (no consumers, no audit log)"},
					asJSON, timeout,
				),
				Action: schemaCheck,
			},
		},
	}
}

// schemaVersion is one declared version of a type, as the heartbeats say.
type schemaVersion struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Current says some module emits it now.
	Current bool `json:"current,omitempty"`
	// DeclaredBy are the node/module pairs that declare it.
	DeclaredBy []string `json:"declared_by"`
}

// schemaConsumer is a live module whose subscription matches a type.
type schemaConsumer struct {
	Node    string `json:"node"`
	Module  string `json:"module"`
	Pattern string `json:"pattern"`
	// Reads are the versions its handler declares it reads ("*": any);
	// none when it declares nothing, which schema check takes as reading
	// what is emitted now.
	Reads []string `json:"reads,omitempty"`
}

// schemaType is an emitted type with its versions and its consumers.
type schemaType struct {
	Type      string           `json:"type"`
	Versions  []schemaVersion  `json:"versions"`
	Emitters  []string         `json:"emitters,omitempty"`
	Consumers []schemaConsumer `json:"consumers,omitempty"`
}

// version is the entry of v, or nil.
func (t *schemaType) version(v string) *schemaVersion {
	for i := range t.Versions {
		if t.Versions[i].Version == v {
			return &t.Versions[i]
		}
	}
	return nil
}

// current is the version emitted now, or nil.
func (t *schemaType) current() *schemaVersion {
	for i := len(t.Versions) - 1; i >= 0; i-- {
		if t.Versions[i].Current {
			return &t.Versions[i]
		}
	}
	return nil
}

// schemaTypes gathers, from heartbeats, every type some module emits or
// declares a schema for, with its versions in declaration order (a
// version declared with two digests is listed twice: a conflict), and the
// modules whose patterns match it.
func schemaTypes(beats []runtime.Heartbeat) []*schemaType {
	slices.SortFunc(beats, func(a, b runtime.Heartbeat) int { return strings.Compare(a.Node, b.Node) })
	types := map[string]*schemaType{}
	get := func(t string) *schemaType {
		if types[t] == nil {
			types[t] = &schemaType{Type: t}
		}
		return types[t]
	}
	for _, hb := range beats {
		for _, m := range hb.Modules {
			who := hb.Node + "/" + m.Name
			for _, e := range m.Emits {
				st := get(e)
				st.Emitters = append(st.Emitters, who)
			}
			for _, d := range m.Schemas {
				st := get(d.Type)
				i := slices.IndexFunc(st.Versions, func(v schemaVersion) bool { return v.Version == d.Version && v.Digest == d.Digest })
				if i < 0 {
					st.Versions = append(st.Versions, schemaVersion{Version: d.Version, Digest: d.Digest})
					i = len(st.Versions) - 1
				}
				st.Versions[i].Current = st.Versions[i].Current || d.Current
				if !slices.Contains(st.Versions[i].DeclaredBy, who) {
					st.Versions[i].DeclaredBy = append(st.Versions[i].DeclaredBy, who)
				}
			}
		}
	}
	for _, hb := range beats {
		for _, m := range hb.Modules {
			for _, p := range m.Patterns {
				for t, st := range types {
					if !wire.MatchPattern(p, t) {
						continue
					}
					st.Consumers = append(st.Consumers, schemaConsumer{Node: hb.Node, Module: m.Name, Pattern: p, Reads: m.Reads[p]})
				}
			}
		}
	}
	out := make([]*schemaType, 0, len(types))
	for _, st := range types {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}

// liveSchemaTypes listens to the heartbeats for --wait.
func liveSchemaTypes(c *cli.Context) ([]*schemaType, error) {
	heard, err := listenHeartbeats(c)
	if err != nil {
		return nil, err
	}
	var beats []runtime.Heartbeat
	for _, h := range heard {
		beats = append(beats, h.Heartbeat)
	}
	return schemaTypes(beats), nil
}

func schemaLs(c *cli.Context) error {
	if c.NArg() > 0 {
		return usagef("schema ls takes no arguments, got %q", c.Args().Slice())
	}
	types, err := liveSchemaTypes(c)
	if err != nil {
		return err
	}
	w := c.App.Writer
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{w}).Encode(map[string]any{"types": types})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tVERSION\tDIGEST\tDECLARED BY\tREAD BY\t")
	for _, st := range types {
		var readers []string
		for _, r := range st.Consumers {
			readers = append(readers, fmt.Sprintf("%s/%s %s", r.Node, r.Module, readsText(r.Reads)))
		}
		if len(st.Versions) == 0 {
			fmt.Fprintf(tw, "%s\t-\t\t%s\t%s\t\n", escape(st.Type), escape(strings.Join(st.Emitters, " ")), escape(strings.Join(readers, "; ")))
			continue
		}
		for i, v := range st.Versions {
			name, read := "", ""
			if i == 0 {
				name, read = st.Type, strings.Join(readers, "; ")
			}
			version := v.Version
			if v.Current {
				version += " (current)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", escape(name), escape(version), v.Digest[:min(12, len(v.Digest))], escape(strings.Join(v.DeclaredBy, " ")), escape(read))
		}
	}
	return tw.Flush()
}

// schemaDocsOf connects to the audit logger and reads its schema
// documents (schemaDocs).
func schemaDocsOf(c *cli.Context) (map[string][]byte, error) {
	a, err := newAuditCaller(c)
	if err != nil {
		return nil, err
	}
	defer a.close()
	return schemaDocs(a)
}

// schemaDocs reads every schema document the audit log holds (the
// nodes' node.*.schemas announcements), by digest.
func schemaDocs(a *auditCaller) (map[string][]byte, error) {
	docs := map[string][]byte{}
	req := auditlogger.QueryRequest{Filter: store.Filter{Types: []string{"node.*.schemas"}}, Page: store.Page{Limit: 500}}
	for {
		var page auditlogger.QueryResponse
		if err := a.call(auditlogger.ToolQuery, req, &page); err != nil {
			return nil, err
		}
		for _, ev := range page.Events {
			var an runtime.SchemasAnnouncement
			if json.Unmarshal(ev.Body, &an) != nil {
				continue
			}
			for _, s := range an.Schemas {
				if schema.Digest(s.Schema) == s.Digest { // an announcement's own word is checked
					docs[s.Digest] = s.Schema
				}
			}
		}
		if page.Next == 0 {
			return docs, nil
		}
		req.Page.After = page.Next
	}
}

// findType is the live type t, or an error naming the types there are.
func findType(types []*schemaType, t string) (*schemaType, error) {
	for _, st := range types {
		if st.Type == t {
			return st, nil
		}
	}
	return nil, fmt.Errorf("no live module emits or declares %q (meshctl schema ls lists what the heartbeats say)", t)
}

func schemaShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("schema show wants one TYPE, got %d arguments", c.NArg())
	}
	types, err := liveSchemaTypes(c)
	if err != nil {
		return err
	}
	st, err := findType(types, c.Args().First())
	if err != nil {
		return err
	}
	v := st.current()
	if want := c.String("version"); want != "" {
		v = st.version(want)
	}
	if v == nil {
		return fmt.Errorf("%s has no declared version %q (versions: %s)", st.Type, c.String("version"), versionList(st))
	}
	docs, err := schemaDocsOf(c)
	if err != nil {
		return err
	}
	doc, ok := docs[v.Digest]
	if !ok {
		return fmt.Errorf("%s version %s (digest %s): %w: no node.*.schemas in the audit log holds it (was the audit logger running when its module started?)", st.Type, v.Version, v.Digest, errUndecided)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, doc, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = c.App.Writer.Write(out.Bytes())
	return err
}

func versionList(st *schemaType) string {
	var vs []string
	for _, v := range st.Versions {
		vs = append(vs, v.Version)
	}
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// schemaRef reads a diff argument: a file, or TYPE@VERSION from the mesh.
func schemaRef(c *cli.Context, arg string, types *[]*schemaType, docs *map[string][]byte) ([]byte, error) {
	if b, err := os.ReadFile(arg); err == nil {
		return b, nil
	} else if !strings.Contains(arg, "@") {
		return nil, err
	}
	t, v, _ := strings.Cut(arg, "@")
	if *types == nil {
		var err error
		if *types, err = liveSchemaTypes(c); err != nil {
			return nil, err
		}
	}
	st, err := findType(*types, t)
	if err != nil {
		return nil, err
	}
	sv := st.version(v)
	if sv == nil {
		return nil, fmt.Errorf("%s has no declared version %q (versions: %s)", t, v, versionList(st))
	}
	if *docs == nil {
		if *docs, err = schemaDocsOf(c); err != nil {
			return nil, err
		}
	}
	doc, ok := (*docs)[sv.Digest]
	if !ok {
		return nil, fmt.Errorf("%s: %w: its document is not in the audit log", arg, errUndecided)
	}
	return doc, nil
}

// schemaDiffResult is what schema diff says.
type schemaDiffResult struct {
	// Backward: NEW reads OLD's bodies; Forward: OLD reads NEW's.
	Backward schemaDirection `json:"backward"`
	Forward  schemaDirection `json:"forward"`
}

type schemaDirection struct {
	Verdict  schema.Verdict   `json:"verdict"`
	Findings []schema.Finding `json:"findings,omitempty"`
}

func schemaDiff(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("schema diff wants OLD and NEW, got %d arguments", c.NArg())
	}
	var types []*schemaType
	var docs map[string][]byte
	old, err := schemaRef(c, c.Args().Get(0), &types, &docs)
	if err != nil {
		return err
	}
	next, err := schemaRef(c, c.Args().Get(1), &types, &docs)
	if err != nil {
		return err
	}
	var res schemaDiffResult
	if res.Backward.Verdict, res.Backward.Findings, err = schema.CanRead(next, old); err != nil {
		return fmt.Errorf("%s: %w", c.Args().Get(1), err)
	}
	if res.Forward.Verdict, res.Forward.Findings, err = schema.CanRead(old, next); err != nil {
		return fmt.Errorf("%s: %w", c.Args().Get(0), err)
	}
	w := c.App.Writer
	if c.Bool("json") {
		return json.NewEncoder(jsonWriter{w}).Encode(res)
	}
	printDirection(w, "NEW reads OLD's bodies (backward)", res.Backward)
	printDirection(w, "OLD reads NEW's bodies (forward)", res.Forward)
	return nil
}

func printDirection(w io.Writer, what string, d schemaDirection) {
	fmt.Fprintf(w, "%s: %s\n", what, d.Verdict)
	for _, f := range d.Findings {
		p := f.Pointer
		if p == "" {
			p = "/"
		}
		fmt.Fprintf(w, "  %s %s: %s\n", f.Verdict, escape(p), escape(f.Problem))
	}
}

// schemaCheckResult is what schema check says of one new version.
type schemaCheckResult struct {
	Type    string         `json:"type"`
	Version string         `json:"version"`
	Verdict schema.Verdict `json:"verdict"`
	// Rule is the compatibility rule's check against the declared
	// versions whose documents were found.
	Rule schema.Result `json:"rule"`
	// Consumers are the live consumers of the type, each with what the
	// new version does to it.
	Consumers []consumerCheck `json:"consumers,omitempty"`
	// Missing are the declared versions whose documents the audit log
	// does not hold: the rule could not be checked against them.
	Missing []string `json:"missing,omitempty"`
	// Samples are the bodies of the audit log validated, and those the
	// new schema refuses.
	Samples *sampleCheck `json:"samples,omitempty"`
}

type consumerCheck struct {
	schemaConsumer
	Verdict schema.Verdict `json:"verdict"`
	Problem string         `json:"problem,omitempty"`
}

type sampleCheck struct {
	Checked int           `json:"checked"`
	Refused []sampleError `json:"refused,omitempty"`
}

type sampleError struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// candidate is one new schema version to check.
type candidate struct {
	Type, Version string
	JSON          []byte
	// Earlier are the versions the candidate's own module declares
	// before it (a binary's history), oldest first.
	Earlier []schema.Earlier
}

func schemaCheck(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("schema check wants one FILE or module BINARY, got %d arguments", c.NArg())
	}
	rule, err := schema.ParseRule(c.String("rule"))
	if err != nil {
		return usagef("--rule: %v", err)
	}
	if c.Bool("offline") && c.Int("sample") > 0 {
		return usagef("--sample reads the audit log: not with --offline")
	}
	cands, err := candidates(c, c.Args().First())
	if err != nil {
		return err
	}
	var types []*schemaType
	docs := map[string][]byte{}
	var a *auditCaller // one connection for the documents and the samples
	if !c.Bool("offline") {
		if types, err = liveSchemaTypes(c); err != nil {
			return err
		}
		if a, err = newAuditCaller(c); err != nil {
			return err
		}
		defer a.close()
		if docs, err = schemaDocs(a); err != nil {
			return err
		}
	}
	var results []schemaCheckResult
	for _, cand := range cands {
		res, err := checkCandidate(cand, rule, types, docs)
		if err != nil {
			return err
		}
		if n := c.Int("sample"); n > 0 {
			if res.Samples, err = sampleBodies(a, cand, n); err != nil {
				return err
			}
			if len(res.Samples.Refused) > 0 && rule != schema.RuleNone {
				res.Verdict = schema.VerdictIncompatible
			}
		}
		results = append(results, res)
	}
	w := c.App.Writer
	if c.Bool("json") {
		if err := json.NewEncoder(jsonWriter{w}).Encode(map[string]any{"rule": rule, "results": results}); err != nil {
			return err
		}
	} else {
		printChecks(w, rule, results)
	}
	worst := schema.VerdictCompatible
	for _, r := range results {
		if r.Verdict == schema.VerdictIncompatible || worst == schema.VerdictCompatible {
			worst = r.Verdict
		}
	}
	switch worst {
	case schema.VerdictIncompatible:
		return errors.New("incompatible: see above")
	case schema.VerdictUnknown:
		return fmt.Errorf("%w: the checker could not decide everything: see above", errUndecided)
	}
	return nil
}

// candidates reads what schema check checks: a schema file (with --type
// and --version) or a module binary's current version of each type it
// declares.
func candidates(c *cli.Context, path string) ([]candidate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if trimmed := bytes.TrimSpace(b); len(trimmed) > 0 && (trimmed[0] == '{' || bytes.Equal(trimmed, []byte("true")) || bytes.Equal(trimmed, []byte("false"))) {
		t, v := c.String("type"), c.String("version")
		if t == "" || v == "" {
			return nil, usagef("a schema file needs --type (the full event type) and --version")
		}
		if _, err := schema.Compile(v, b); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return []candidate{{Type: t, Version: v, JSON: b}}, nil
	}
	var settings []byte
	if s := c.String("settings"); s != "" {
		if !json.Valid([]byte(s)) {
			return nil, usagef("--settings is not JSON")
		}
		settings = []byte(s)
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	def, _, err := runtime.Describe(ctx, path, nil, settings, nil)
	if err != nil {
		return nil, err
	}
	byType := map[string]*candidate{}
	var order []string
	for _, s := range def.Schemas {
		if s.Tool != "" {
			continue // a served tool's: schema check checks events' bodies
		}
		t := wire.ModuleEventType(def.Name, s.Event)
		if _, err := schema.Compile(s.Version, s.JSON); err != nil {
			return nil, fmt.Errorf("%s: %s version %s: %w", path, t, s.Version, err)
		}
		cand := byType[t]
		if cand == nil {
			cand = &candidate{Type: t}
			byType[t] = cand
			order = append(order, t)
		} else {
			cand.Earlier = append(cand.Earlier, schema.Earlier{Version: cand.Version, JSON: cand.JSON})
		}
		cand.Version, cand.JSON = s.Version, s.JSON
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("module %s (%s) declares no schema", def.Name, path)
	}
	out := make([]candidate, 0, len(order))
	for _, t := range order {
		out = append(out, *byType[t])
	}
	return out, nil
}

// checkCandidate checks one new version against the live declarations of
// its type and its live consumers.
func checkCandidate(cand candidate, rule schema.Rule, types []*schemaType, docs map[string][]byte) (schemaCheckResult, error) {
	res := schemaCheckResult{Type: cand.Type, Version: cand.Version}
	st, err := findType(types, cand.Type)
	if err != nil {
		st = &schemaType{Type: cand.Type} // a new type: nothing to break
	}
	newDigest := schema.Digest(cand.JSON)
	// The module's own history first, then what the mesh declares beyond
	// it, so that the last earlier version is the latest live one.
	earlier := slices.Clone(cand.Earlier)
	seen := map[string]bool{}
	for _, e := range earlier {
		seen[e.Version] = true
	}
	for _, v := range st.Versions {
		if v.Version == cand.Version {
			if v.Digest != newDigest {
				res.Verdict = schema.VerdictIncompatible
				res.Rule = schema.Result{Rule: rule, Verdict: schema.VerdictIncompatible}
				return withProblem(res, fmt.Sprintf("version %s is declared already, by %s, with another schema (digest %s): a changed schema needs a new version", v.Version, strings.Join(v.DeclaredBy, " "), v.Digest[:12])), nil
			}
			continue // the same document: it is not earlier than itself
		}
		if seen[v.Version] {
			continue
		}
		seen[v.Version] = true
		doc, ok := docs[v.Digest]
		if !ok {
			res.Missing = append(res.Missing, v.Version)
			continue
		}
		earlier = append(earlier, schema.Earlier{Version: v.Version, JSON: doc})
	}
	if res.Rule, err = schema.Check(rule, cand.JSON, earlier); err != nil {
		return res, fmt.Errorf("%s version %s: %w", cand.Type, cand.Version, err)
	}
	res.Verdict = res.Rule.Verdict
	if len(res.Missing) > 0 && rule != schema.RuleNone && res.Verdict == schema.VerdictCompatible {
		res.Verdict = schema.VerdictUnknown
	}
	// The live consumers: one that does not list the new version
	// dead-letters it; one that declares any ("*") takes any; one that
	// declares nothing reads it with what it reads now (the current
	// version's schema).
	var currentDoc []byte
	if cur := st.current(); cur != nil && cur.Version != cand.Version {
		currentDoc = docs[cur.Digest]
	}
	for _, r := range st.Consumers {
		cc := consumerCheck{schemaConsumer: r, Verdict: schema.VerdictCompatible}
		switch {
		case slices.Contains(r.Reads, cand.Version), slices.Contains(r.Reads, schema.AnyVersion):
		case r.Reads != nil:
			cc.Verdict = schema.VerdictIncompatible
			cc.Problem = fmt.Sprintf("it reads versions %s: version %s would be dead-lettered (reason schema)", strings.Join(quoteAll(r.Reads), ", "), cand.Version)
		case st.current() == nil || st.current().Version == cand.Version:
		case currentDoc == nil:
			cc.Verdict = schema.VerdictUnknown
			cc.Problem = fmt.Sprintf("it declares no version it reads, and the document of the current version %s is not in the audit log", st.current().Version)
		default:
			v, findings, err := schema.CanRead(currentDoc, cand.JSON)
			if err != nil {
				return res, err
			}
			cc.Verdict = v
			if v != schema.VerdictCompatible {
				var ps []string
				for _, f := range findings {
					ps = append(ps, f.Pointer+": "+f.Problem)
				}
				cc.Problem = fmt.Sprintf("it declares no version it reads, so it reads as version %s, which does not read version %s: %s", st.current().Version, cand.Version, strings.Join(ps, "; "))
			}
		}
		if cc.Verdict == schema.VerdictIncompatible || (cc.Verdict == schema.VerdictUnknown && res.Verdict == schema.VerdictCompatible) {
			res.Verdict = cc.Verdict
		}
		res.Consumers = append(res.Consumers, cc)
	}
	return res, nil
}

func withProblem(res schemaCheckResult, problem string) schemaCheckResult {
	res.Rule.Against = []schema.Against{{Version: res.Version, Verdict: schema.VerdictIncompatible, Findings: []schema.Finding{{Problem: problem, Verdict: schema.VerdictIncompatible}}}}
	return res
}

func quoteAll(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		if v == "" {
			v = "(none)"
		}
		out[i] = v
	}
	return out
}

// sampleBodies validates the first n bodies of the type the audit log
// holds (its oldest, the data a backward rule is about) against the
// candidate.
func sampleBodies(a *auditCaller, cand candidate, n int) (*sampleCheck, error) {
	comp, err := schema.Compile(cand.Version, cand.JSON)
	if err != nil {
		return nil, err
	}
	req := auditlogger.QueryRequest{Filter: store.Filter{Types: []string{cand.Type}}, Page: store.Page{Limit: min(n, store.MaxPage)}}
	var page auditlogger.QueryResponse
	if err := a.call(auditlogger.ToolQuery, req, &page); err != nil {
		return nil, err
	}
	out := &sampleCheck{}
	for _, ev := range page.Events {
		out.Checked++
		if err := comp.Validate(ev.Body); err != nil {
			out.Refused = append(out.Refused, sampleError{ID: ev.ID, Error: err.Error()})
		}
	}
	return out, nil
}

func printChecks(w io.Writer, rule schema.Rule, results []schemaCheckResult) {
	for _, r := range results {
		fmt.Fprintf(w, "%s version %s, rule %s: %s\n", escape(r.Type), escape(r.Version), rule, strings.ToUpper(string(r.Verdict)))
		for _, a := range r.Rule.Against {
			what := "against " + a.Version
			if a.Direction != "" {
				what += " (" + a.Direction + ")"
			}
			printDirection(w, "  "+escape(what), schemaDirection{Verdict: a.Verdict, Findings: a.Findings})
		}
		for _, v := range r.Missing {
			fmt.Fprintf(w, "  version %s: its document is not in the audit log: not checked\n", escape(v))
		}
		for _, cc := range r.Consumers {
			line := fmt.Sprintf("  consumer %s/%s (%s) reads %s: %s", cc.Node, cc.Module, cc.Pattern, readsText(cc.Reads), cc.Verdict)
			if cc.Problem != "" {
				line += ": " + cc.Problem
			}
			fmt.Fprintln(w, escape(line))
		}
		if s := r.Samples; s != nil {
			fmt.Fprintf(w, "  audit log sample: %d bodies, %d refused\n", s.Checked, len(s.Refused))
			for _, e := range s.Refused[:min(5, len(s.Refused))] {
				fmt.Fprintf(w, "    %s: %s\n", escape(e.ID), escape(e.Error))
			}
		}
	}
}

// readsText is a consumer's declared reads for people.
func readsText(reads []string) string {
	if reads == nil {
		return "(undeclared)"
	}
	return strings.Join(quoteAll(reads), ",")
}
