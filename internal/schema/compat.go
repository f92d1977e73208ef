package schema

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Rule is a compatibility rule, as Confluent Schema Registry defines them.
type Rule string

// The rules. BACKWARD: a reader using the new schema reads data written
// with the previous one. FORWARD: a reader using the previous schema reads
// data written with the new one. FULL: both. The TRANSITIVE variants check
// against every earlier version, not only the last. NONE checks nothing.
const (
	RuleNone               Rule = "none"
	RuleBackward           Rule = "backward"
	RuleBackwardTransitive Rule = "backward_transitive"
	RuleForward            Rule = "forward"
	RuleForwardTransitive  Rule = "forward_transitive"
	RuleFull               Rule = "full"
	RuleFullTransitive     Rule = "full_transitive"
)

var rules = []Rule{RuleNone, RuleBackward, RuleBackwardTransitive, RuleForward, RuleForwardTransitive, RuleFull, RuleFullTransitive}

// ParseRule reads a rule in lower or upper case, with "-" or "_"
// ("BACKWARD_TRANSITIVE", "full-transitive").
func ParseRule(s string) (Rule, error) {
	r := Rule(strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_"))
	if slices.Contains(rules, r) {
		return r, nil
	}
	return "", errRule(s)
}

func errRule(s string) error {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = string(r)
	}
	return fmt.Errorf("compatibility rule %q: want one of %s", s, strings.Join(names, ", "))
}

// Verdict is the answer to "can this reader read that writer's bodies".
type Verdict string

// The verdicts. Unknown is what the checker answers where a schema uses a
// keyword it does not decide; it never guesses.
const (
	VerdictCompatible   Verdict = "compatible"
	VerdictIncompatible Verdict = "incompatible"
	VerdictUnknown      Verdict = "unknown"
)

// worse is the verdict of two checks together.
func worse(a, b Verdict) Verdict {
	rank := map[Verdict]int{VerdictCompatible: 0, VerdictUnknown: 1, VerdictIncompatible: 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// Finding is one reason a reader may not read a writer's bodies.
type Finding struct {
	// Pointer is the JSON pointer of the schema concerned, as the two
	// schemas share it ("/properties/price"), "" for the root. Where a
	// $ref leads elsewhere, Problem names where.
	Pointer string `json:"pointer"`
	// Problem says what breaks ("the reader requires \"price\", which the
	// writer may omit").
	Problem string `json:"problem"`
	// Verdict is incompatible or unknown.
	Verdict Verdict `json:"verdict"`
}

// The directions of an Against.
const (
	// DirectionBackward: the new schema reads the earlier one's bodies.
	DirectionBackward = "backward"
	// DirectionForward: the earlier schema reads the new one's bodies.
	DirectionForward = "forward"
)

// Earlier is an earlier version of a schema.
type Earlier struct {
	Version string
	JSON    []byte
}

// Against is the check of the new schema against one earlier version in
// one direction.
type Against struct {
	Version string `json:"version"`
	// Direction is DirectionBackward or DirectionForward.
	Direction string    `json:"direction"`
	Verdict   Verdict   `json:"verdict"`
	Findings  []Finding `json:"findings,omitempty"`
}

// Result is the outcome of Check: incompatible if any Against is, else
// unknown if any is, else compatible.
type Result struct {
	Rule    Rule      `json:"rule"`
	Verdict Verdict   `json:"verdict"`
	Against []Against `json:"against"`
}

// Check checks next against the earlier versions (oldest first) under
// rule: the plain rules against the last earlier one, the transitive ones
// against each. NONE, or no earlier version, is compatible. The error is
// for an unknown rule or a document that is not a schema (it wraps
// ErrSchema).
func Check(rule Rule, next []byte, earlier []Earlier) (Result, error) {
	var backward, forward, transitive bool
	switch rule {
	case RuleNone:
	case RuleBackward, RuleBackwardTransitive:
		backward = true
	case RuleForward, RuleForwardTransitive:
		forward = true
	case RuleFull, RuleFullTransitive:
		backward, forward = true, true
	default:
		return Result{}, errRule(string(rule))
	}
	transitive = strings.HasSuffix(string(rule), "_transitive")
	n, err := decode(next)
	if err != nil {
		return Result{}, fmt.Errorf("check the new schema: %w", err)
	}
	res := Result{Rule: rule, Verdict: VerdictCompatible, Against: []Against{}}
	if rule == RuleNone || len(earlier) == 0 {
		return res, nil
	}
	if !transitive {
		earlier = earlier[len(earlier)-1:]
	}
	for _, e := range earlier {
		old, err := decode(e.JSON)
		if err != nil {
			return Result{}, fmt.Errorf("check against version %s: %w", e.Version, err)
		}
		add := func(dir string, r, w *document) {
			v, fs := compare(r, w, true)
			res.Against = append(res.Against, Against{Version: e.Version, Direction: dir, Verdict: v, Findings: fs})
			res.Verdict = worse(res.Verdict, v)
		}
		if backward {
			add(DirectionBackward, n, old)
		}
		if forward {
			add(DirectionForward, old, n)
		}
	}
	return res, nil
}

// CanRead reports whether a reader holding schema reader reads every body
// written under writer: compatible, incompatible (with the findings that
// say why) or unknown (with the keywords it could not decide).
//
// It decides draft 2020-12 schemas structurally, on type, properties,
// required, additionalProperties, enum, const, items, the numeric, length
// and item-count bounds, multipleOf (one a multiple of the other),
// uniqueItems, pattern (equal, or none in the reader), format (none in the
// reader, or equal), local $ref and a single-element allOf; annotations are
// ignored, and a subschema identical in both (without $ref) is compatible
// whatever it uses. Any other constraint is unknown.
//
// Objects follow the open content model as Confluent's and Avro's users
// expect: a property the writer does not declare (and does not require) is
// taken as absent from its bodies, even where its additionalProperties is
// absent or true. A reader's additionalProperties false refuses the
// writer's declared properties it lacks; a schema there must read them.
//
// The error is for a document that is not JSON or not a schema (an object
// or a boolean); it wraps ErrSchema.
func CanRead(reader, writer []byte) (Verdict, []Finding, error) {
	return canRead(reader, writer, true)
}

func canRead(reader, writer []byte, shortcut bool) (Verdict, []Finding, error) {
	r, err := decode(reader)
	if err != nil {
		return VerdictUnknown, nil, fmt.Errorf("reader: %w", err)
	}
	w, err := decode(writer)
	if err != nil {
		return VerdictUnknown, nil, fmt.Errorf("writer: %w", err)
	}
	v, fs := compare(r, w, shortcut)
	return v, fs, nil
}

// document is a decoded schema. nestedID: a subschema sets its own $id,
// so a $ref may resolve against it, which the checker does not follow.
type document struct {
	root     any
	nestedID bool
}

func decode(b []byte) (*document, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrSchema, len(b), MaxSize)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%w: not JSON: %w", ErrSchema, err)
	}
	d := &document{root: v}
	switch m := v.(type) {
	case bool:
	case map[string]any:
		for k, c := range m {
			d.nestedID = d.nestedID || k != "$id" && hasID(c)
		}
	default:
		return nil, fmt.Errorf("%w: a schema is an object or a boolean", ErrSchema)
	}
	return d, nil
}

func hasID(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := x["$id"]; ok {
			return true
		}
		for _, c := range x {
			if hasID(c) {
				return true
			}
		}
	case []any:
		return slices.ContainsFunc(x, hasID)
	}
	return false
}

// pointer resolves a $ref into d: a JSON pointer fragment ("#/$defs/a").
func (d *document) pointer(ref string) (node, bool) {
	if d.nestedID || !strings.HasPrefix(ref, "#") {
		return node{}, false
	}
	frag, err := url.PathUnescape(ref[1:])
	if err != nil || frag != "" && frag[0] != '/' {
		return node{}, false
	}
	n := node{v: d.root}
	if frag == "" {
		return n, true
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := n.v.(type) {
		case map[string]any:
			v, ok := x[tok]
			if !ok {
				return node{}, false
			}
			n = node{v, n.ptr + "/" + escape(tok)}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return node{}, false
			}
			n = node{x[i], n.ptr + "/" + strconv.Itoa(i)}
		default:
			return node{}, false
		}
	}
	return n, true
}

var escaper = strings.NewReplacer("~", "~0", "/", "~1")

func escape(tok string) string { return escaper.Replace(tok) }

// node is a schema and its JSON pointer in its own document (or where it
// would be, for one the document leaves out).
type node struct {
	v   any
	ptr string
}

// visit is a pair of subschemas under check; weak: keywords the checker
// does not decide, above them, may rule out what breaks (see add).
type visit struct {
	r, w string
	weak bool
}

// The schemas are untrusted: maxVisits bounds the pairs of subschemas one
// comparison checks (each pair once; $refs can pair many with many), and
// maxDepth how deeply it descends (a ring of $refs can lead deep before a
// pair repeats).
var (
	maxVisits = 1 << 15
	maxDepth  = 256
)

type checker struct {
	r, w     *document
	shortcut bool
	seen     map[visit]bool
	depth    int
	stopped  bool // at maxVisits or maxDepth
	regexps  map[string]*regexp.Regexp
	findings []Finding
}

func compare(r, w *document, shortcut bool) (Verdict, []Finding) {
	c := &checker{r: r, w: w, shortcut: shortcut, seen: map[visit]bool{}, regexps: map[string]*regexp.Regexp{}}
	c.check(node{v: r.root}, node{v: w.root}, "", false)
	sort.SliceStable(c.findings, func(i, j int) bool {
		a, b := c.findings[i], c.findings[j]
		if a.Pointer != b.Pointer {
			return a.Pointer < b.Pointer
		}
		return a.Problem < b.Problem
	})
	fs := slices.Compact(c.findings)
	v := VerdictCompatible
	for _, f := range fs {
		v = worse(v, f.Verdict)
	}
	return v, fs
}

// add records a finding. weak turns an incompatibility into unknown:
// keywords the checker does not decide may rule out what breaks (the
// writer's may keep it from writing it; the reader's patternProperties or
// prefixItems may accept it).
func (c *checker) add(path string, v Verdict, weak bool, format string, args ...any) {
	p := fmt.Sprintf(format, args...)
	if v == VerdictIncompatible && weak {
		v, p = VerdictUnknown, p+", unless keywords the checker does not decide rule it out"
	}
	c.findings = append(c.findings, Finding{Pointer: path, Problem: p, Verdict: v})
}

// at names a side, and where its schema is when a $ref led elsewhere.
func at(side string, n node, path string) string {
	if n.ptr == path {
		return side
	}
	return fmt.Sprintf("%s (at %q)", side, n.ptr)
}

// annotation says a keyword constrains nothing.
func annotation(k string) bool {
	switch k {
	case "description", "title", "examples", "default", "$schema", "$id", "$comment", "$defs", "definitions",
		"readOnly", "writeOnly", "deprecated", "$anchor", "$dynamicAnchor", "$vocabulary",
		"contentMediaType", "contentEncoding", "contentSchema":
		return true
	}
	return strings.HasPrefix(k, "x-")
}

// constraining is the first keyword of m, other than except, that is not
// an annotation, or "".
func constraining(m map[string]any, except string) string {
	for _, k := range sortedKeys(m) {
		if k != except && !annotation(k) {
			return k
		}
	}
	return ""
}

// resolve follows n's local $ref and single-element allOf to a boolean or
// an object. Where it cannot, it records why and returns false.
func (c *checker) resolve(n node, d *document, side, path string) (node, bool) {
	seen := map[string]bool{}
	for {
		m, ok := n.v.(map[string]any)
		if !ok {
			if _, ok := n.v.(bool); ok {
				return n, true
			}
			c.add(path, VerdictUnknown, false, "%s has a schema that is neither an object nor a boolean", at(side, n, path))
			return n, false
		}
		if seen[n.ptr] {
			c.add(path, VerdictUnknown, false, "%s has a $ref that loops without reaching a schema", at(side, n, path))
			return n, false
		}
		seen[n.ptr] = true
		if ref, ok := m["$ref"]; ok {
			if k := constraining(m, "$ref"); k != "" {
				c.add(path, VerdictUnknown, false, "%s uses $ref beside %s, which the checker does not decide", at(side, n, path), k)
				return n, false
			}
			s, _ := ref.(string)
			target, ok := d.pointer(s)
			if !ok {
				c.add(path, VerdictUnknown, false, "%s uses $ref %q, which the checker does not follow (only a JSON pointer into the same document)", at(side, n, path), s)
				return n, false
			}
			n = target
			continue
		}
		if all, ok := m["allOf"].([]any); ok && len(all) == 1 && constraining(m, "allOf") == "" {
			n = node{all[0], n.ptr + "/allOf/0"}
			continue
		}
		return n, true
	}
}

// supported keywords, and whether a value of theirs is well formed.
var supported = map[string]func(any) bool{
	"type":                 func(v any) bool { _, ok := typeMask(v); return ok },
	"properties":           func(v any) bool { _, ok := v.(map[string]any); return ok },
	"required":             func(v any) bool { _, ok := names(v); return ok },
	"additionalProperties": isSchema,
	"items":                isSchema,
	"enum":                 func(v any) bool { _, ok := v.([]any); return ok },
	"const":                func(any) bool { return true },
	"minimum":              isNumber,
	"maximum":              isNumber,
	"exclusiveMinimum":     isNumber,
	"exclusiveMaximum":     isNumber,
	"multipleOf":           func(v any) bool { f, ok := v.(float64); return ok && f > 0 },
	"minLength":            isCount,
	"maxLength":            isCount,
	"minItems":             isCount,
	"maxItems":             isCount,
	"uniqueItems":          func(v any) bool { _, ok := v.(bool); return ok },
	"pattern":              func(v any) bool { _, ok := v.(string); return ok },
	"format":               func(v any) bool { _, ok := v.(string); return ok },
}

func isSchema(v any) bool {
	switch v.(type) {
	case bool, map[string]any:
		return true
	}
	return false
}

func isNumber(v any) bool { _, ok := v.(float64); return ok }

func isCount(v any) bool { f, ok := v.(float64); return ok && f >= 0 && f == math.Trunc(f) }

// scan records the keywords of m the checker does not decide or that are
// malformed, and reports whether there were any.
func (c *checker) scan(m map[string]any, n node, side, path string) bool {
	found := false
	for _, k := range sortedKeys(m) {
		if annotation(k) {
			continue
		}
		wellFormed, ok := supported[k]
		switch {
		case !ok:
			c.add(path, VerdictUnknown, false, "%s uses %s, which the checker does not decide", at(side, n, path), k)
		case !wellFormed(m[k]):
			c.add(path, VerdictUnknown, false, "%s has a malformed %s", at(side, n, path), k)
		default:
			continue
		}
		found = true
	}
	return found
}

// check records why reader r may not read writer w's bodies, at path.
func (c *checker) check(r, w node, path string, weak bool) {
	var ok bool
	if r, ok = c.resolve(r, c.r, "the reader", path); !ok {
		return
	}
	if w, ok = c.resolve(w, c.w, "the writer", path); !ok {
		return
	}
	key := visit{r.ptr, w.ptr, weak}
	if c.seen[key] {
		return // under check already, or checked: each pass descends into a smaller body
	}
	if len(c.seen) >= maxVisits || c.depth >= maxDepth {
		if !c.stopped {
			c.stopped = true
			c.add(path, VerdictUnknown, false, "the schemas pair more than %d subschemas or nest deeper than %d; the checker stopped here", maxVisits, maxDepth)
		}
		return
	}
	c.depth++
	defer func() { c.depth-- }()
	c.seen[key] = true
	if c.shortcut && sameWithoutRef(r.v, w.v) {
		return
	}
	if b, ok := w.v.(bool); ok && !b {
		return // the writer writes nothing here
	}
	if b, ok := r.v.(bool); ok {
		if !b {
			c.add(path, VerdictIncompatible, weak, "%s accepts nothing here (false)", at("the reader", r, path))
		}
		return
	}
	rm := r.v.(map[string]any)
	wm, _ := w.v.(map[string]any) // nil for true
	weak = c.scan(wm, w, "the writer", path) || weak
	c.scan(rm, r, "the reader", path)
	wt := types(wm)

	if vals, finite := c.writes(wm, wt); finite {
		strs := false
		for _, v := range vals {
			_, isStr := v.(string)
			strs = strs || isStr
			switch verdict, why := c.accepts(rm, v); verdict {
			case VerdictIncompatible:
				c.add(path, verdict, weak, "the writer may write %s, which the reader does not accept (%s)", text(v), why)
			case VerdictUnknown:
				c.add(path, verdict, weak, "the writer may write %s; the checker cannot tell whether the reader accepts it (%s)", text(v), why)
			}
		}
		if rf, ok := rm["format"].(string); ok && strs && wm["format"] != rf {
			c.add(path, VerdictUnknown, weak, "the reader needs format %q; the checker does not check formats of the writer's enum or const", rf)
		}
		return
	}

	rt := types(rm)
	if missing := wt &^ rt; missing != 0 {
		c.add(path, VerdictIncompatible, weak, "the writer may write %s, which the reader does not accept (its type is %s)", missing, rt)
	}
	if _, ok := rm["const"]; ok {
		c.add(path, VerdictIncompatible, weak, "the reader accepts only its const, and the writer may write other values")
	} else if _, ok := rm["enum"].([]any); ok {
		c.add(path, VerdictIncompatible, weak, "the reader accepts only the values of its enum, and the writer may write others")
	}
	if wt&(tInt|tFrac) != 0 {
		integers := wt&tFrac == 0
		c.bounds(rm, wm, path, weak, integers)
		if mr, ok := rm["multipleOf"].(float64); ok && mr > 0 && !(integers && mr == 1) {
			mw, _ := wm["multipleOf"].(float64)
			if q := mw / mr; mw <= 0 || q != math.Trunc(q) {
				c.add(path, VerdictUnknown, weak, "the reader needs multiples of %v and the writer's are not multiples of it; the checker decides multipleOf only then", mr)
			}
		}
	}
	if wt&tString != 0 {
		c.counts(rm, wm, "minLength", "maxLength", "characters", path, weak)
		if rp, ok := rm["pattern"].(string); ok {
			if wp, ok := wm["pattern"].(string); !ok {
				c.add(path, VerdictUnknown, weak, "the reader needs pattern %q and the writer has none; the checker does not compare patterns", rp)
			} else if wp != rp {
				c.add(path, VerdictUnknown, weak, "the reader needs pattern %q and the writer's is %q; the checker does not compare patterns", rp, wp)
			}
		}
		if rf, ok := rm["format"].(string); ok {
			if wf, ok := wm["format"].(string); !ok {
				c.add(path, VerdictIncompatible, weak, "the reader needs format %q and the writer's strings have none", rf)
			} else if wf != rf {
				c.add(path, VerdictIncompatible, weak, "the reader needs format %q and the writer's strings have format %q", rf, wf)
			}
		}
	}
	if wt&tArray != 0 {
		c.counts(rm, wm, "minItems", "maxItems", "items", path, weak)
		if u, _ := rm["uniqueItems"].(bool); u {
			wu, _ := wm["uniqueItems"].(bool)
			if wmax, ok := wm["maxItems"].(float64); !wu && !(ok && wmax <= 1) {
				c.add(path, VerdictIncompatible, weak, "the reader needs unique items and the writer may repeat one")
			}
		}
		if ri, ok := rm["items"]; ok && isSchema(ri) && wm["maxItems"] != 0.0 {
			wi := node{true, w.ptr + "/items"}
			if v, ok := wm["items"]; ok && isSchema(v) {
				wi.v = v
			}
			_, prefix := rm["prefixItems"] // items reads only the items after it
			c.check(node{ri, r.ptr + "/items"}, wi, path+"/items", weak || prefix)
		}
	}
	if wt&tObject != 0 {
		c.object(r, w, rm, wm, path, weak)
	}
}

// object checks properties, required and additionalProperties.
func (c *checker) object(r, w node, rm, wm map[string]any, path string, weak bool) {
	rProps, _ := rm["properties"].(map[string]any)
	wProps, _ := wm["properties"].(map[string]any)
	rReq, _ := names(rm["required"])
	wReq, _ := names(wm["required"])
	rExtra, rOpen := extra(r, rm)
	wExtra, wOpen := extra(w, wm)
	_, patterns := rm["patternProperties"] // what it matches is not the reader's additionalProperties
	for _, p := range sortedKeys(rReq) {
		if !wReq[p] {
			c.add(path+"/properties/"+escape(p), VerdictIncompatible, weak, "the reader requires %q, which the writer may omit", p)
		}
	}
	all := map[string]bool{}
	for _, m := range []map[string]any{rProps, wProps} {
		for p := range m {
			all[p] = true
		}
	}
	for p := range wReq {
		all[p] = true
	}
	for _, p := range sortedKeys(all) {
		pp := path + "/properties/" + escape(p)
		wn := node{wProps[p], w.ptr + "/properties/" + escape(p)}
		if _, declared := wProps[p]; !declared {
			if wOpen && !wReq[p] {
				continue // taken as absent from the writer's bodies
			}
			wn = wExtra
		}
		if b, ok := wn.v.(bool); ok && !b {
			continue
		}
		rn, soft := node{rProps[p], r.ptr + "/properties/" + escape(p)}, false
		if _, ok := rProps[p]; !ok {
			if rOpen {
				continue
			}
			if b, ok := rExtra.v.(bool); ok && !b {
				c.add(pp, VerdictIncompatible, weak || patterns, "the writer may write %q, which the reader does not allow (additionalProperties: false)", p)
				continue
			}
			rn, soft = rExtra, patterns
		}
		c.check(rn, wn, pp, weak || soft)
	}
	if b, ok := wExtra.v.(bool); wOpen || ok && !b {
		return
	}
	if b, ok := rExtra.v.(bool); ok && !b {
		c.add(path+"/additionalProperties", VerdictIncompatible, weak || patterns, "the writer allows properties it does not declare, which the reader does not (additionalProperties: false)")
	} else if !rOpen {
		c.check(rExtra, wExtra, path+"/additionalProperties", weak || patterns)
	}
}

// extra is a schema's additionalProperties, and whether it is open
// (absent, true, or a schema that constrains nothing).
func extra(n node, m map[string]any) (node, bool) {
	e := node{true, n.ptr + "/additionalProperties"}
	v, ok := m["additionalProperties"]
	if !ok || !isSchema(v) || v == true {
		return e, true
	}
	if o, ok := v.(map[string]any); ok && constraining(o, "") == "" {
		return e, true
	}
	e.v = v
	return e, false
}

// writes is the values the writer may write, when they are few: its const
// or enum, or what a type of only null and boolean allows.
func (c *checker) writes(wm map[string]any, wt mask) ([]any, bool) {
	var vals []any
	if v, ok := wm["const"]; ok {
		vals = []any{v}
	} else if e, ok := wm["enum"].([]any); ok {
		vals = e
	} else if wt&^(tNull|tBool) == 0 {
		if wt&tNull != 0 {
			vals = append(vals, nil)
		}
		if wt&tBool != 0 {
			vals = append(vals, false, true)
		}
	} else {
		return nil, false
	}
	var keep []any
	for _, v := range vals {
		if verdict, _ := c.accepts(wm, v); verdict != VerdictIncompatible {
			keep = append(keep, v)
		}
	}
	return keep, true
}

// accepts says whether m accepts the value v, and if not, why (format
// aside: the caller compares it).
func (c *checker) accepts(m map[string]any, v any) (Verdict, string) {
	if t := types(m); t&typeOf(v) == 0 {
		return VerdictIncompatible, fmt.Sprintf("its type is %s", t)
	}
	if cv, ok := m["const"]; ok && !reflect.DeepEqual(cv, v) {
		return VerdictIncompatible, "it is not its const"
	}
	if e, ok := m["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return reflect.DeepEqual(x, v) }) {
		return VerdictIncompatible, "it is not in its enum"
	}
	has := func(ks ...string) bool {
		return slices.ContainsFunc(ks, func(k string) bool { _, ok := m[k]; return ok })
	}
	switch x := v.(type) {
	case float64:
		if lo := lower(m, false); lo.set && (x < lo.v || x == lo.v && lo.excl) {
			return VerdictIncompatible, "it needs " + lo.describe(false)
		}
		if hi := upper(m, false); hi.set && (x > hi.v || x == hi.v && hi.excl) {
			return VerdictIncompatible, "it needs " + hi.describe(true)
		}
		if mo, ok := m["multipleOf"].(float64); ok && mo > 0 {
			if q := x / mo; q != math.Trunc(q) {
				if x == math.Trunc(x) && mo == math.Trunc(mo) {
					return VerdictIncompatible, fmt.Sprintf("it is not a multiple of %v", mo)
				}
				return VerdictUnknown, fmt.Sprintf("multipleOf %v of a fraction", mo)
			}
		}
	case string:
		n := float64(utf8.RuneCountInString(x))
		if lo, ok := m["minLength"].(float64); ok && n < lo {
			return VerdictIncompatible, fmt.Sprintf("it needs at least %v characters", lo)
		}
		if hi, ok := m["maxLength"].(float64); ok && n > hi {
			return VerdictIncompatible, fmt.Sprintf("it allows at most %v characters", hi)
		}
		if p, ok := m["pattern"].(string); ok {
			re := c.regexp(p)
			if re == nil || !printableASCII(x) {
				return VerdictUnknown, fmt.Sprintf("the checker evaluates pattern %q only where Go's regexp and ECMA 262 agree", p)
			}
			if !re.MatchString(x) {
				return VerdictIncompatible, fmt.Sprintf("it does not match its pattern %q", p)
			}
		}
	case []any:
		if has("items", "minItems", "maxItems", "uniqueItems") {
			return VerdictUnknown, "the checker does not evaluate an array value against items and their bounds"
		}
	case map[string]any:
		if has("properties", "required", "additionalProperties") {
			return VerdictUnknown, "the checker does not evaluate an object value against properties"
		}
	}
	return VerdictCompatible, ""
}

func (c *checker) regexp(p string) *regexp.Regexp {
	re, ok := c.regexps[p]
	if !ok {
		re, _ = regexp.Compile(p) // nil: not one Go reads
		c.regexps[p] = re
	}
	return re
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// bound is a numeric bound; set false for none.
type bound struct {
	v         float64
	excl, set bool
}

func (b bound) describe(upper bool) string {
	if !b.set {
		return "any number"
	}
	op := map[[2]bool]string{{false, false}: ">=", {false, true}: ">", {true, false}: "<=", {true, true}: "<"}[[2]bool{upper, b.excl}]
	return "numbers " + op + " " + strconv.FormatFloat(b.v, 'g', -1, 64)
}

// lower is m's tighter lower bound (minimum, exclusiveMinimum); for
// integers, as an inclusive bound on integers.
func lower(m map[string]any, integers bool) bound {
	return limit(m, "minimum", "exclusiveMinimum", 1, integers)
}

// upper is m's tighter upper bound, as lower.
func upper(m map[string]any, integers bool) bound {
	return limit(m, "maximum", "exclusiveMaximum", -1, integers)
}

// limit reads a bound; sign is 1 for a lower one, -1 for an upper one.
func limit(m map[string]any, incl, excl string, sign float64, integers bool) bound {
	var b bound
	if x, ok := m[incl].(float64); ok {
		b = bound{x, false, true}
	}
	if x, ok := m[excl].(float64); ok && (!b.set || sign*x >= sign*b.v) {
		b = bound{x, true, true}
	}
	if integers && b.set {
		// Lower: ceil(v), or floor(v)+1 if exclusive; upper: the mirror.
		v := sign * math.Ceil(sign*b.v)
		if b.excl {
			v = sign * (math.Floor(sign*b.v) + 1)
		}
		b = bound{v, false, true}
	}
	return b
}

// bounds checks that the writer's numeric bounds lie within the reader's.
func (c *checker) bounds(rm, wm map[string]any, path string, weak, integers bool) {
	if r, w := lower(rm, integers), lower(wm, integers); r.set && !(w.set && (w.v > r.v || w.v == r.v && (!r.excl || w.excl))) {
		c.add(path, VerdictIncompatible, weak, "the reader needs %s and the writer allows %s", r.describe(false), w.describe(false))
	}
	if r, w := upper(rm, integers), upper(wm, integers); r.set && !(w.set && (w.v < r.v || w.v == r.v && (!r.excl || w.excl))) {
		c.add(path, VerdictIncompatible, weak, "the reader needs %s and the writer allows %s", r.describe(true), w.describe(true))
	}
}

// counts checks a pair of length or item-count bounds.
func (c *checker) counts(rm, wm map[string]any, minK, maxK, what, path string, weak bool) {
	if r, ok := rm[minK].(float64); ok {
		if w, _ := wm[minK].(float64); w < r {
			c.add(path, VerdictIncompatible, weak, "the reader needs at least %v %s (%s) and the writer allows %v", r, what, minK, w)
		}
	}
	if r, ok := rm[maxK].(float64); ok {
		if w, ok := wm[maxK].(float64); !ok {
			c.add(path, VerdictIncompatible, weak, "the reader allows at most %v %s (%s) and the writer has no %s", r, what, maxK, maxK)
		} else if w > r {
			c.add(path, VerdictIncompatible, weak, "the reader allows at most %v %s (%s) and the writer allows %v", r, what, maxK, w)
		}
	}
}

// mask is a set of JSON types; number is integer and fraction.
type mask uint8

const (
	tNull mask = 1 << iota
	tBool
	tObject
	tArray
	tString
	tInt
	tFrac
	tAll = tNull | tBool | tObject | tArray | tString | tInt | tFrac
)

var typeMasks = map[string]mask{"null": tNull, "boolean": tBool, "object": tObject, "array": tArray, "string": tString, "integer": tInt, "number": tInt | tFrac}

// String names the types, "any" for all of them.
func (m mask) String() string {
	if m == tAll {
		return "any"
	}
	var out []string
	for _, n := range []string{"null", "boolean", "object", "array", "string", "number", "integer"} {
		if t := typeMasks[n]; m&t == t {
			out = append(out, n)
			m &^= t
		}
	}
	if m&tFrac != 0 {
		out = append(out, "non-integer number")
	}
	if len(out) < 2 {
		return strings.Join(out, "")
	}
	return strings.Join(out[:len(out)-1], ", ") + " or " + out[len(out)-1]
}

func typeMask(v any) (mask, bool) {
	list, ok := v.([]any)
	if !ok {
		list = []any{v}
	}
	var m mask
	for _, x := range list {
		s, _ := x.(string)
		t, ok := typeMasks[s]
		if !ok {
			return 0, false
		}
		m |= t
	}
	return m, true
}

// types is what m's type allows (all types without one).
func types(m map[string]any) mask {
	if v, ok := m["type"]; ok {
		if t, ok := typeMask(v); ok {
			return t
		}
	}
	return tAll
}

func typeOf(v any) mask {
	switch x := v.(type) {
	case nil:
		return tNull
	case bool:
		return tBool
	case map[string]any:
		return tObject
	case []any:
		return tArray
	case string:
		return tString
	case float64:
		if x == math.Trunc(x) {
			return tInt
		}
		return tFrac
	}
	return 0
}

// names reads a required list as a set.
func names(v any) (map[string]bool, bool) {
	list, ok := v.([]any)
	if !ok {
		return nil, false
	}
	set := map[string]bool{}
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, false
		}
		set[s] = true
	}
	return set, true
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// text is a value as JSON, cut short.
func text(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 60 {
		return string(b[:57]) + "..."
	}
	return string(b)
}

// sameWithoutRef says a and b are the same JSON without a $ref (which may
// resolve differently in each document), comparing at most 4096 values.
func sameWithoutRef(a, b any) bool {
	budget := 4096
	var same func(a, b any) bool
	same = func(a, b any) bool {
		if budget--; budget < 0 {
			return false
		}
		switch x := a.(type) {
		case map[string]any:
			y, ok := b.(map[string]any)
			if !ok || len(x) != len(y) {
				return false
			}
			for k, xv := range x {
				yv, ok := y[k]
				if k == "$ref" || k == "$dynamicRef" || !ok || !same(xv, yv) {
					return false
				}
			}
			return true
		case []any:
			y, ok := b.([]any)
			if !ok || len(x) != len(y) {
				return false
			}
			for i := range x {
				if !same(x[i], y[i]) {
					return false
				}
			}
			return true
		default:
			return a == b
		}
	}
	return same(a, b)
}
