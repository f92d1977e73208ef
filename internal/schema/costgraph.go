package schema

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The cost model of a compiled schema (bounds.go has the bounds and the
// units). costGraph is the compiled *jsonschema.Schema graph, read through
// its exported fields, with what applying each subschema costs. A state is
// a multiset of subschemas applied to one value of a body ("entries": the
// subschemas its parent's applicators apply to it; "expansion": those and
// everything they apply in place, with how many times each). Compile
// explores the states every body could reach, down to MaxFanOutDepth
// (costGraph.check); Validate follows the states of the body it has
// (meter.walk). Both are upper bounds of the library's work: every
// subschema that may apply is counted (both branches of an if, every
// anyOf's alternative, every patternProperties for a name that matches
// nothing named, unevaluated* as if nothing were evaluated, every
// candidate of a $recursiveRef).

// jtype is a JSON type of a body's value.
type jtype uint8

const (
	jNull jtype = iota
	jBool
	jNumber
	jString
	jArray
	jObject
	nJTypes
)

// jtypes is a set of jtypes.
type jtypes uint8

const allJTypes jtypes = 1<<nJTypes - 1

func (s jtypes) has(t jtype) bool { return s&(1<<t) != 0 }

func jtypeOf(v any) jtype {
	switch v.(type) {
	case nil:
		return jNull
	case bool:
		return jBool
	case string:
		return jString
	case []any:
		return jArray
	case map[string]any:
		return jObject
	default: // json.Number: Validate's decoder reads every number as one
		return jNumber
	}
}

// costEdge is an in-place applicator: the subschema to applies to the
// same value, by keyword kw.
type costEdge struct {
	to int32
	kw string
}

// costPattern is a patternProperties entry.
type costPattern struct {
	re jsonschema.Regexp
	to int32
}

// costNode is one subschema. -1 is no subschema.
type costNode struct {
	loc     string
	types   jtypes // what it checks further; a value of another type stops at its "type"
	rank    int32  // its place in a topological order of the in-place applicators
	f0      uint64 // subschemas one value is checked against when it applies (any type)
	inPlace []costEdge

	// Applied to an object's members: properties, patternProperties,
	// additionalProperties, unevaluatedProperties, and to each member's
	// name, propertyNames.
	props                     map[string]int32
	patterns                  []costPattern
	addl, unevalProps, pNames int32
	addlAny                   bool // additionalProperties, a schema or a boolean: it evaluates every other name
	// Applied to an array's items: prefixItems (or an items array before
	// 2020-12), then items (or additionalItems), contains,
	// unevaluatedItems.
	prefix                              []int32
	rest, contains, unevalItems         int32
	fixed                               [nJTypes]uint64 // ticks of applying it to a value of each type, besides the value's size
	strRate, keyRate, memRate, itemRate uint64          // ticks per byte of a string, byte of a name, member, item
	fmtRegex, unique                    bool
}

func (n *costNode) objects() bool {
	return len(n.props) > 0 || len(n.patterns) > 0 || n.addl >= 0 || n.unevalProps >= 0
}

func (n *costNode) arrays() bool {
	return len(n.prefix) > 0 || n.rest >= 0 || n.contains >= 0 || n.unevalItems >= 0
}

// costGraph is a compiled schema's cost model. It is read-only once
// built, and safe for concurrent use; its engines are pooled.
type costGraph struct {
	nodes   []costNode
	root    int32
	engines chan *costEngine
}

// buildGraph reads the compiled schema root. It refuses (ErrSchema) a
// cycle of in-place applicators, which would check one value forever (the
// library stops it with an error), and what it cannot bound: a
// $dynamicRef or $recursiveRef whose target depends on the dynamic scope
// in a schema of more than one resource.
func buildGraph(root *jsonschema.Schema, pats *patterns) (*costGraph, error) {
	b := &graphBuilder{idx: map[*jsonschema.Schema]int32{}, doc: docOf(root.Location)}
	b.id(root)
	for i := 0; i < len(b.schemas); i++ {
		for _, c := range schemaChildren(b.schemas[i]) {
			b.id(c)
		}
	}
	multi := false
	var names []int32 // the propertyNames subschemas: the bottom of their own dynamic scope
	for i, s := range b.schemas {
		if (i > 0 && s.ID != "") || docOf(s.Location) != b.doc {
			multi = true
		}
		if s.PropertyNames != nil {
			names = append(names, b.idx[s.PropertyNames])
		}
		if s.ContentSchema != nil { // only with AssertContent, which Compile does not set
			return nil, fmt.Errorf("%w: contentSchema at %s: not supported", ErrSchema, b.loc(s))
		}
	}
	unevalProps, unevalItems := false, false
	for _, s := range b.schemas {
		unevalProps = unevalProps || s.UnevaluatedProperties != nil
		unevalItems = unevalItems || s.UnevaluatedItems != nil
	}
	g := &costGraph{nodes: make([]costNode, len(b.schemas)), root: 0, engines: make(chan *costEngine, 4)}
	for i, s := range b.schemas {
		n := &g.nodes[i]
		n.loc = b.loc(s)
		if err := b.fill(n, s, multi, names); err != nil {
			return nil, err
		}
		n.costs(s, pats, unevalProps, unevalItems)
	}
	if err := g.order(); err != nil {
		return nil, err
	}
	return g, nil
}

type graphBuilder struct {
	idx     map[*jsonschema.Schema]int32
	schemas []*jsonschema.Schema
	doc     string
}

func (b *graphBuilder) id(s *jsonschema.Schema) int32 {
	if s == nil {
		return -1
	}
	if i, ok := b.idx[s]; ok {
		return i
	}
	i := int32(len(b.schemas))
	b.idx[s] = i
	b.schemas = append(b.schemas, s)
	return i
}

// docOf is the document of a location (a URL and a fragment).
func docOf(loc string) string {
	doc, _, _ := strings.Cut(loc, "#")
	return doc
}

// loc is s's location for a message: its JSON pointer in the declared
// document ("/" for its root), its URL elsewhere (a meta-schema).
func (b *graphBuilder) loc(s *jsonschema.Schema) string {
	doc, ptr, _ := strings.Cut(s.Location, "#")
	if doc != b.doc {
		return s.Location
	}
	if p, err := url.PathUnescape(ptr); err == nil { // the library escapes it as a URL's fragment
		ptr = p
	}
	return pointerOrRoot(ptr)
}

// schemaChildren are every subschema s refers to.
func schemaChildren(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else, s.PropertyNames,
		s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema}
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(out, s.AllOf...)
	out = append(out, s.AnyOf...)
	out = append(out, s.OneOf...)
	out = append(out, s.PrefixItems...)
	for _, k := range sortedKeys(s.Properties) {
		out = append(out, s.Properties[k])
	}
	for _, c := range s.PatternProperties {
		out = append(out, c)
	}
	for _, k := range sortedKeys(s.DependentSchemas) {
		out = append(out, s.DependentSchemas[k])
	}
	for _, k := range sortedKeys(s.Dependencies) {
		if c, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			out = append(out, c)
		}
	}
	for _, v := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch v := v.(type) {
		case *jsonschema.Schema:
			out = append(out, v)
		case []*jsonschema.Schema:
			out = append(out, v...)
		}
	}
	return out
}

// fill sets n's applicators from s's.
func (b *graphBuilder) fill(n *costNode, s *jsonschema.Schema, multi bool, names []int32) error {
	n.addl, n.unevalProps, n.pNames, n.rest, n.contains, n.unevalItems = -1, -1, -1, -1, -1, -1
	n.types = allJTypes
	if s.Types != nil && !s.Types.IsEmpty() {
		n.types = 0
		for _, t := range s.Types.ToStrings() {
			switch t {
			case "null":
				n.types |= 1 << jNull
			case "boolean":
				n.types |= 1 << jBool
			case "number", "integer":
				n.types |= 1 << jNumber
			case "string":
				n.types |= 1 << jString
			case "array":
				n.types |= 1 << jArray
			case "object":
				n.types |= 1 << jObject
			}
		}
	}
	if s.Bool != nil {
		return nil
	}
	edge := func(c *jsonschema.Schema, kw string) {
		if c != nil {
			n.inPlace = append(n.inPlace, costEdge{b.idx[c], kw})
		}
	}
	edge(s.Ref, "$ref")
	if s.Ref != nil && s.DraftVersion < 2019 { // $ref alone counts: the library ignores its siblings
		return nil
	}
	if r := s.RecursiveRef; r != nil {
		if !r.RecursiveAnchor {
			edge(r, "$recursiveRef")
		} else if multi {
			return fmt.Errorf("%w: $recursiveRef at %s: its target depends on the dynamic scope, in a schema of more than one resource: not supported (use $ref)", ErrSchema, n.loc)
		} else { // the outermost scope: the root, or a propertyNames subschema
			edge(b.schemas[0], "$recursiveRef")
			for _, c := range names {
				n.inPlace = append(n.inPlace, costEdge{c, "$recursiveRef"})
			}
		}
	}
	if d := s.DynamicRef; d != nil {
		if multi && d.Anchor != "" && d.Ref.DynamicAnchor == d.Anchor {
			return fmt.Errorf("%w: $dynamicRef at %s: its target depends on the dynamic scope, in a schema of more than one resource: not supported (use $ref)", ErrSchema, n.loc)
		}
		edge(d.Ref, "$dynamicRef") // one resource: its own anchor, the outermost too
	}
	for _, c := range s.AllOf {
		edge(c, "allOf")
	}
	for _, c := range s.AnyOf {
		edge(c, "anyOf")
	}
	for _, c := range s.OneOf {
		edge(c, "oneOf")
	}
	edge(s.Not, "not")
	edge(s.If, "if")
	edge(s.Then, "then")
	edge(s.Else, "else")
	for _, k := range sortedKeys(s.DependentSchemas) {
		edge(s.DependentSchemas[k], "dependentSchemas")
	}
	for _, k := range sortedKeys(s.Dependencies) {
		if c, ok := s.Dependencies[k].(*jsonschema.Schema); ok {
			edge(c, "dependencies")
		}
	}

	id := func(c *jsonschema.Schema) int32 {
		if c == nil {
			return -1
		}
		return b.idx[c]
	}
	if len(s.Properties) > 0 {
		n.props = make(map[string]int32, len(s.Properties))
		for k, c := range s.Properties {
			n.props[k] = id(c)
		}
	}
	for re, c := range s.PatternProperties {
		n.patterns = append(n.patterns, costPattern{re, id(c)})
	}
	sort.Slice(n.patterns, func(i, j int) bool { return n.patterns[i].re.String() < n.patterns[j].re.String() })
	if c, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		n.addl = id(c)
	}
	n.addlAny = s.AdditionalProperties != nil
	n.unevalProps, n.pNames = id(s.UnevaluatedProperties), id(s.PropertyNames)
	if s.DraftVersion < 2020 {
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			n.rest = id(items)
		case []*jsonschema.Schema:
			for _, c := range items {
				n.prefix = append(n.prefix, id(c))
			}
		}
		if c, ok := s.AdditionalItems.(*jsonschema.Schema); ok && n.rest < 0 {
			n.rest = id(c)
		}
	} else {
		for _, c := range s.PrefixItems {
			n.prefix = append(n.prefix, id(c))
		}
		n.rest = id(s.Items2020)
	}
	n.contains, n.unevalItems = id(s.Contains), id(s.UnevaluatedItems)
	return nil
}

// costs sets what applying n costs, besides its subschemas.
func (n *costNode) costs(s *jsonschema.Schema, pats *patterns, unevalProps, unevalItems bool) {
	common := uint64(evalTicks)
	if s.Const != nil {
		common = satAdd(common, valueTicks(*s.Const))
	}
	if s.Enum != nil {
		for _, v := range s.Enum.Values {
			common = satAdd(common, valueTicks(v))
		}
	}
	for t := range nJTypes {
		n.fixed[t] = common
	}
	names := len(s.Required) + len(s.Dependencies) + len(s.DependentSchemas) + len(s.DependentRequired)
	for _, r := range s.DependentRequired {
		names += len(r)
	}
	n.fixed[jObject] = satAdd(n.fixed[jObject], satMul(uint64(names), nameTicks))
	if s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil || s.MultipleOf != nil {
		n.fixed[jNumber] = satAdd(n.fixed[jNumber], 2*ratTicks) // read, and an error's numbers
	}
	if s.MultipleOf != nil { // a quotient of fractions
		n.fixed[jNumber] = satAdd(n.fixed[jNumber], 4*ratTicks)
	}
	if s.Types != nil && slices.Contains(s.Types.ToStrings(), "integer") {
		n.fixed[jNumber] = satAdd(n.fixed[jNumber], ratTicks)
	}
	n.strRate = 1 // the library copies a string's bytes for each subschema applied to it
	if s.Format != nil {
		if s.Format.Name == "regex" {
			n.fmtRegex = true
		} else {
			n.fixed[jString] = satAdd(n.fixed[jString], formatTicks)
			n.strRate += formatByteTicks
		}
	}
	if s.Pattern != nil {
		n.strRate = satAdd(n.strRate, satMul(pats.size(s.Pattern.String()), regexByteTicks))
	}
	n.memRate = memberTicks
	if unevalProps {
		n.memRate = unevalMemberTicks
	}
	for _, p := range n.patterns {
		n.memRate = satAdd(n.memRate, patternCallTicks)
		n.keyRate = satAdd(n.keyRate, satMul(pats.size(p.re.String()), regexByteTicks))
	}
	n.itemRate = itemTicks
	if unevalItems {
		n.itemRate = unevalItemTicks
	}
	n.unique = s.UniqueItems
}

// valueTicks is what comparing a value with an enum's or a const's v costs
// at most.
func valueTicks(v any) uint64 {
	switch v := v.(type) {
	case string:
		return 8 + uint64(len(v))/8
	case map[string]any:
		t := uint64(64)
		for k, c := range v {
			t = satAdd(t, satAdd(nameTicks+uint64(len(k))/8, valueTicks(c)))
		}
		return t
	case []any:
		t := uint64(64)
		for _, c := range v {
			t = satAdd(t, valueTicks(c))
		}
		return t
	case nil, bool:
		return 8
	default: // a number: the library reads both as fractions
		return 2 * ratTicks
	}
}

// order refuses a cycle of in-place applicators and ranks the nodes in a
// topological order of them (a node before those it applies in place),
// then computes each node's f0.
func (g *costGraph) order() error {
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, len(g.nodes))
	post := make([]int32, 0, len(g.nodes))
	type frame struct {
		n int32
		e int
	}
	var stack []frame
	for start := range g.nodes {
		if color[start] != white {
			continue
		}
		color[start] = grey
		stack = append(stack[:0], frame{int32(start), 0})
		for len(stack) > 0 {
			f := &stack[len(stack)-1]
			n := &g.nodes[f.n]
			if f.e == len(n.inPlace) {
				color[f.n] = black
				post = append(post, f.n)
				stack = stack[:len(stack)-1]
				continue
			}
			e := n.inPlace[f.e]
			f.e++
			switch color[e.to] {
			case grey:
				return fmt.Errorf("%w: %s at %s leads back to %s, to check the same value again: a cycle", ErrSchema, e.kw, n.loc, g.nodes[e.to].loc)
			case white:
				color[e.to] = grey
				stack = append(stack, frame{e.to, 0})
			}
		}
	}
	for i, n := range post { // children first
		nd := &g.nodes[n]
		nd.rank = int32(len(post) - 1 - i)
		nd.f0 = 1
		for _, e := range nd.inPlace {
			nd.f0 = satAdd(nd.f0, g.nodes[e.to].f0)
		}
	}
	return nil
}

// entry is a subschema of a state, applied m times.
type entry struct {
	n int32
	m uint64
}

// expansion is what applying a state's subschemas to one value of a type
// costs, and what they apply to its members or items.
type expansion struct {
	evals    uint64  // subschemas applied, in place included
	ticks    uint64  // their cost, besides the value's size
	strRate  uint64  // ticks per byte of a string
	fmtRegex uint64  // "format": "regex" assertions of a string
	memRate  uint64  // ticks per member of an object
	keyRate  uint64  // ticks per byte of a member's name
	itemRate uint64  // ticks per item of an array
	unique   uint64  // uniqueItems assertions
	desc     []entry // the subschemas applied that apply others to members or items
	names    int32   // the state applied to each member's name (propertyNames)
	prefix   int     // the longest prefixItems of desc
}

type expKey struct {
	st int32
	t  jtype
}

type keyStep struct {
	st  int32
	key string
}

type itemStep struct {
	st int32
	i  int // -1: every index past the prefixes
}

// costEngine interns states and memoizes their expansions and steps to a
// member or an item. One goroutine uses it at a time.
type costEngine struct {
	g          *costGraph
	ids        map[string]int32
	states     [][]entry
	exps       map[expKey]*expansion
	keys       map[keyStep]int32
	otherSteps map[int32][]int32
	items      map[itemStep]int32

	root     int32 // the state of the schema's root alone
	keyBytes int   // of the names in keys
	gen      uint32
	mark     []uint32
	mult     []uint64
	stack    []int32
	reach    []int32
	buf      []byte
	tmp      []entry
	work     uint64 // subschemas visited and entries stepped, for a bound on the engine's own work
}

var noExpansion = &expansion{names: 0}

// engine takes an engine of the pool, or makes one. Its states,
// expansions and steps depend on the graph alone: they are kept from one
// use to the next, which makes the estimate of a body like the last ones
// a walk of lookups.
func (g *costGraph) engine() *costEngine {
	select {
	case e := <-g.engines:
		return e
	default:
	}
	e := &costEngine{g: g, mark: make([]uint32, len(g.nodes)), mult: make([]uint64, len(g.nodes)),
		ids: map[string]int32{"": 0}, states: [][]entry{nil}, exps: map[expKey]*expansion{},
		keys: map[keyStep]int32{}, otherSteps: map[int32][]int32{}, items: map[itemStep]int32{}}
	e.root = e.intern([]entry{{g.root, 1}})
	return e
}

// release returns e to the pool, unless it grew large (a body of many
// names, or of long ones, which its steps would keep).
func (g *costGraph) release(e *costEngine) {
	e.work = 0
	if len(e.states) > 4096 || len(e.keys) > 4096 || len(e.items) > 4096 || e.keyBytes > 1<<16 {
		return
	}
	select {
	case g.engines <- e:
	default:
	}
}

// intern returns the state of entries (sorted and merged here).
func (e *costEngine) intern(entries []entry) int32 {
	if len(entries) == 0 {
		return 0
	}
	slices.SortFunc(entries, func(a, b entry) int { return int(a.n) - int(b.n) })
	out := entries[:1]
	for _, en := range entries[1:] {
		if last := &out[len(out)-1]; last.n == en.n {
			last.m = satAdd(last.m, en.m)
		} else {
			out = append(out, en)
		}
	}
	e.buf = e.buf[:0]
	for _, en := range out {
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(en.n))
		e.buf = binary.LittleEndian.AppendUint64(e.buf, en.m)
	}
	if id, ok := e.ids[string(e.buf)]; ok {
		return id
	}
	id := int32(len(e.states))
	e.ids[string(e.buf)] = id
	e.states = append(e.states, slices.Clone(out))
	return id
}

// expand is the expansion of state st for a value of type t.
func (e *costEngine) expand(st int32, t jtype) *expansion {
	if st == 0 {
		return noExpansion
	}
	k := expKey{st, t}
	if x, ok := e.exps[k]; ok {
		return x
	}
	g := e.g
	if e.gen++; e.gen == 0 { // wrapped: no mark may look current
		clear(e.mark)
		e.gen = 1
	}
	e.reach, e.stack = e.reach[:0], e.stack[:0]
	for _, en := range e.states[st] {
		e.stack = append(e.stack, en.n)
	}
	for len(e.stack) > 0 {
		n := e.stack[len(e.stack)-1]
		e.stack = e.stack[:len(e.stack)-1]
		if e.mark[n] == e.gen {
			continue
		}
		e.mark[n], e.mult[n] = e.gen, 0
		e.reach = append(e.reach, n)
		if nd := &g.nodes[n]; nd.types.has(t) {
			for _, ed := range nd.inPlace {
				if e.mark[ed.to] != e.gen {
					e.stack = append(e.stack, ed.to)
				}
			}
		}
	}
	e.work += uint64(len(e.reach))
	slices.SortFunc(e.reach, func(a, b int32) int { return int(g.nodes[a].rank) - int(g.nodes[b].rank) })
	for _, en := range e.states[st] {
		e.mult[en.n] = satAdd(e.mult[en.n], en.m)
	}
	x := &expansion{}
	var names []entry
	for _, n := range e.reach {
		m, nd := e.mult[n], &g.nodes[n]
		x.evals = satAdd(x.evals, m)
		if !nd.types.has(t) {
			x.ticks = satAdd(x.ticks, satMul(m, evalTicks))
			continue
		}
		x.ticks = satAdd(x.ticks, satMul(m, nd.fixed[t]))
		for _, ed := range nd.inPlace {
			e.mult[ed.to] = satAdd(e.mult[ed.to], m)
		}
		switch t {
		case jString:
			x.strRate = satAdd(x.strRate, satMul(m, nd.strRate))
			if nd.fmtRegex {
				x.fmtRegex = satAdd(x.fmtRegex, m)
			}
		case jObject:
			x.memRate = satAdd(x.memRate, satMul(m, nd.memRate))
			x.keyRate = satAdd(x.keyRate, satMul(m, nd.keyRate))
			if nd.objects() {
				x.desc = append(x.desc, entry{n, m})
			}
			if nd.pNames >= 0 {
				names = append(names, entry{nd.pNames, m})
			}
		case jArray:
			x.itemRate = satAdd(x.itemRate, satMul(m, nd.itemRate))
			if nd.unique {
				x.unique = satAdd(x.unique, m)
			}
			if nd.arrays() {
				x.desc = append(x.desc, entry{n, m})
				x.prefix = max(x.prefix, len(nd.prefix))
			}
		}
	}
	x.names = e.intern(names)
	e.exps[k] = x
	return x
}

// member is the state of an object's member named key when st applies to
// the object, x its expansion for objects. Of each subschema t of x, it
// takes what the library applies: t's properties of the name, the
// patternProperties matching it, additionalProperties if neither, and
// unevaluatedProperties if t evaluates the name by none of those (what t
// applies in place may evaluate it too: not counted, an upper bound).
func (e *costEngine) member(st int32, x *expansion, key string) int32 {
	if len(x.desc) == 0 {
		return 0
	}
	if id, ok := e.keys[keyStep{st, key}]; ok {
		return id
	}
	e.tmp = e.tmp[:0]
	for _, en := range x.desc {
		nd := &e.g.nodes[en.n]
		e.work += 1 + uint64(len(nd.patterns))
		c, named := nd.props[key]
		if named {
			e.tmp = append(e.tmp, entry{c, en.m})
		}
		matched := false
		for _, p := range nd.patterns {
			if p.re.MatchString(key) {
				e.tmp = append(e.tmp, entry{p.to, en.m})
				matched = true
			}
		}
		e.unmatched(nd, en.m, named || matched)
	}
	id := e.intern(e.tmp)
	e.keys[keyStep{st, key}] = id
	e.keyBytes += len(key)
	return id
}

// unmatched appends to e.tmp what n applies, m times, to a member that its
// properties and patternProperties do not name (evaluated: that they do).
func (e *costEngine) unmatched(n *costNode, m uint64, evaluated bool) {
	if !evaluated && n.addl >= 0 {
		e.tmp = append(e.tmp, entry{n.addl, m})
	}
	if !evaluated && !n.addlAny && n.unevalProps >= 0 {
		e.tmp = append(e.tmp, entry{n.unevalProps, m})
	}
}

// maxOtherChoices bounds the classes others makes: past it, a member of
// another name takes both choices of every subschema at once.
const maxOtherChoices = 4

// others are the states of a member that no subschema of x names, for
// Compile's exploration: of each subschema with patternProperties, the
// name may match some (all of them are counted) or none (then its
// additionalProperties or unevaluatedProperties applies); one state for
// each combination of these choices, or, past maxOtherChoices subschemas
// with patternProperties, one of all of them.
func (e *costEngine) others(st int32, x *expansion) []int32 {
	if len(x.desc) == 0 {
		return nil
	}
	if ids, ok := e.otherSteps[st]; ok {
		return ids
	}
	choices := 0
	for _, en := range x.desc {
		if len(e.g.nodes[en.n].patterns) > 0 {
			choices++
		}
	}
	var ids []int32
	for combo := range 1 << min(choices, maxOtherChoices) {
		e.tmp = e.tmp[:0]
		bit := 0
		for _, en := range x.desc {
			nd := &e.g.nodes[en.n]
			e.work += 1 + uint64(len(nd.patterns))
			match, none := false, true
			if len(nd.patterns) > 0 {
				if choices > maxOtherChoices {
					match = true
				} else {
					match, none = combo&(1<<bit) != 0, combo&(1<<bit) == 0
					bit++
				}
			}
			if match {
				for _, p := range nd.patterns {
					e.tmp = append(e.tmp, entry{p.to, en.m})
				}
			}
			if none {
				e.unmatched(nd, en.m, false)
			}
		}
		ids = append(ids, e.intern(e.tmp))
	}
	e.otherSteps[st] = ids
	return ids
}

// item is the state of an array's item i (-1: past every prefix) when st
// applies to the array, x its expansion for arrays.
func (e *costEngine) item(st int32, x *expansion, i int) int32 {
	if len(x.desc) == 0 {
		return 0
	}
	if i >= x.prefix {
		i = -1
	}
	if id, ok := e.items[itemStep{st, i}]; ok {
		return id
	}
	e.tmp = e.tmp[:0]
	for _, en := range x.desc {
		nd := &e.g.nodes[en.n]
		e.work++
		evaluated := true
		if i >= 0 && i < len(nd.prefix) {
			e.tmp = append(e.tmp, entry{nd.prefix[i], en.m})
		} else if nd.rest >= 0 {
			e.tmp = append(e.tmp, entry{nd.rest, en.m})
		} else {
			evaluated = false
		}
		if nd.contains >= 0 {
			e.tmp = append(e.tmp, entry{nd.contains, en.m})
		}
		if nd.unevalItems >= 0 && !evaluated { // what n's items and prefixItems evaluate, its unevaluatedItems does not
			e.tmp = append(e.tmp, entry{nd.unevalItems, en.m})
		}
	}
	id := e.intern(e.tmp)
	e.items[itemStep{st, i}] = id
	return id
}

// maxAnalysisWork bounds Compile's exploration of a schema's states, in
// subschemas visited and entries stepped (about 150 ns each): a
// discriminated union of 300 types (80 KB) takes about 110,000, a domain
// model of 600 types (190 KB) 80,000.
const maxAnalysisWork = 2_000_000

// check explores the states a body could reach, down to MaxFanOutDepth
// below its top, and refuses a schema that would check one value against
// more than MaxFanOut subschemas or more than MaxSteps' worth, naming
// where it fans out. Each state is explored once, where a body reaches it
// first: what it costs does not depend on how deep it is (but for the
// library's errors, which the budget of each body counts).
func (g *costGraph) check() error {
	e := g.engine()
	defer g.release(e)
	type visit struct {
		st     int32
		parent int32 // in trail; -1 for the top
		key    string
	}
	trail := []visit{{st: e.root, parent: -1}}
	frontier := []int32{0}
	// A state checked once is checked at every depth: what it costs does
	// not depend on it. States of the same subschemas are merged, each
	// applied as many times as in whichever applies it more (an upper
	// bound of both): one that applies none more than a state explored
	// is not explored again. Fan-out that grows by level makes a new
	// state each level, until MaxFanOut or MaxFanOutDepth.
	explored := map[string]int32{}
	var support []byte
	explored[string(binary.LittleEndian.AppendUint32(support, uint32(g.root)))] = trail[0].st
	for depth := 0; depth <= MaxFanOutDepth && len(frontier) > 0; depth++ {
		var next []int32
		push := func(from int32, st int32, key string) {
			if st == 0 {
				return
			}
			entries := e.states[st]
			e.work += uint64(len(entries))
			support = support[:0]
			for _, en := range entries {
				support = binary.LittleEndian.AppendUint32(support, uint32(en.n))
			}
			if prev, ok := explored[string(support)]; ok {
				if prev == st {
					return
				}
				merged, more := slices.Clone(e.states[prev]), false
				for i, en := range entries {
					if en.m > merged[i].m {
						merged[i].m, more = en.m, true
					}
				}
				if !more {
					return
				}
				st = e.intern(merged)
			}
			explored[string(support)] = st
			trail = append(trail, visit{st, from, key})
			next = append(next, int32(len(trail)-1))
		}
		for _, ti := range frontier {
			v := trail[ti]
			for t := range nJTypes {
				x := e.expand(v.st, t)
				if err := g.bounded(e, x, v.st, depth, func() []string {
					var path []string
					for i := ti; i > 0; i = trail[i].parent {
						path = append(path, trail[i].key)
					}
					slices.Reverse(path)
					return path
				}); err != nil {
					return err
				}
				switch t {
				case jObject:
					if x.names != 0 {
						if err := g.bounded(e, e.expand(x.names, jString), x.names, depth+1, func() []string { return []string{"(a name)"} }); err != nil {
							return err
						}
					}
					if len(x.desc) == 0 {
						continue
					}
					var keys []string
					for _, en := range x.desc {
						e.work += uint64(len(g.nodes[en.n].props))
						for k := range g.nodes[en.n].props {
							keys = append(keys, k)
						}
					}
					slices.Sort(keys)
					for _, k := range slices.Compact(keys) {
						push(ti, e.member(v.st, x, k), escape(k))
					}
					for _, o := range e.others(v.st, x) {
						push(ti, o, "*")
					}
				case jArray:
					for i := range x.prefix {
						push(ti, e.item(v.st, x, i), fmt.Sprint(i))
					}
					push(ti, e.item(v.st, x, -1), "*")
				}
			}
			if e.work > maxAnalysisWork {
				return fmt.Errorf("%w: its subschemas combine in too many ways to bound what a body may cost (the analysis stopped after %s subschemas visited)", ErrSchema, printer.Sprint(maxAnalysisWork))
			}
		}
		frontier = next
	}
	return nil
}

// bounded refuses x, the expansion of st for a value at depth (path, a
// function: made only for a message), if it checks the value against more
// than MaxFanOut subschemas or costs more than MaxSteps.
func (g *costGraph) bounded(e *costEngine, x *expansion, st int32, depth int, path func() []string) error {
	if x.evals <= MaxFanOut && x.ticks <= MaxSteps*stepTicks {
		return nil
	}
	where := "one value"
	if depth > 0 {
		where = fmt.Sprintf("a value at %s (%s deep)", shorten("/"+strings.Join(path(), "/")), levels(depth))
	}
	if x.evals > MaxFanOut {
		return fmt.Errorf("%w: %s would be checked against %s subschemas (%s), at most %s (MaxFanOut)",
			ErrSchema, where, printer.Sprint(x.evals), g.fanOut(e.states[st]), printer.Sprint(MaxFanOut))
	}
	return fmt.Errorf("%w: checking %s would take %s steps (%s), more than a whole body may (MaxSteps, %s)",
		ErrSchema, where, printer.Sprint(x.ticks/stepTicks), g.fanOut(e.states[st]), printer.Sprint(MaxSteps))
}

// fanOut names where the subschemas of a state's heaviest path fan out:
// from the heaviest entry, the heaviest subschema applied in place, and so
// on, each that applies several, and the entries' multiplicity (what the
// levels above applied several times).
func (g *costGraph) fanOut(entries []entry) string {
	best := entries[0]
	for _, en := range entries[1:] {
		if satMul(en.m, g.nodes[en.n].f0) > satMul(best.m, g.nodes[best.n].f0) {
			best = en
		}
	}
	var points []string
	if best.m > 1 {
		points = append(points, fmt.Sprintf("%s applied %s times by the levels above", g.nodes[best.n].loc, printer.Sprint(best.m)))
	}
	for n := best.n; ; {
		nd := &g.nodes[n]
		if len(nd.inPlace) == 0 {
			break
		}
		heavy := nd.inPlace[0]
		for _, ed := range nd.inPlace[1:] {
			if g.nodes[ed.to].f0 > g.nodes[heavy.to].f0 {
				heavy = ed
			}
		}
		if len(nd.inPlace) > 1 {
			if len(points) == 3 {
				points = append(points, "…")
				break
			}
			points = append(points, heavy.kw+" at "+nd.loc)
		}
		n = heavy.to
	}
	if len(points) == 0 {
		return "at " + g.nodes[best.n].loc
	}
	return strings.Join(points, ", ")
}

// meter estimates what validating one body costs, following the states of
// its values (costEngine), and stops at its budget.
type meter struct {
	e     *costEngine
	used  uint64
	limit uint64
	path  []pathStep
	over  bool
}

// pathStep is a member's name or an item's index.
type pathStep struct {
	key string
	i   int // -1 for a member
}

// errNumber is a number of the body that checkNumber refuses, at path.
type errNumber struct {
	path string
	err  error
}

func (e *errNumber) Error() string { return e.path + ": number " + e.err.Error() }

// estimate walks body (decoded), the check of which may cost limit ticks,
// and returns what it would cost (more than limit: over budget, the walk
// stopped there, at the returned path), or an error for a number out of
// bounds.
func (g *costGraph) estimate(body any, limit uint64) (used uint64, over bool, at string, depth int, err error) {
	e := g.engine()
	defer g.release(e)
	m := &meter{e: e, limit: limit}
	if _, err := m.walk(body, e.root, 0); err != nil {
		return 0, false, "", 0, err
	}
	if m.over {
		return m.used, true, m.pointer(), len(m.path), nil
	}
	return m.used, false, "", 0, nil
}

func (m *meter) pointer() string {
	var b strings.Builder
	for _, s := range m.path {
		b.WriteByte('/')
		if s.i >= 0 {
			b.WriteString(fmt.Sprint(s.i))
		} else {
			b.WriteString(escape(s.key))
		}
	}
	return pointerOrRoot(b.String())
}

// charge adds t ticks; false once over the limit.
func (m *meter) charge(t uint64) bool {
	m.used = satAdd(m.used, t)
	if m.used > m.limit {
		m.over = true
	}
	return !m.over
}

// walk charges for v, to which state st applies, depth levels below the
// body's top, and returns what uniqueItems hashing v costs. It stops (with
// m.over) at the limit.
func (m *meter) walk(v any, st int32, depth int) (uint64, error) {
	t := jtypeOf(v)
	x := m.e.expand(st, t)
	if !m.charge(satAdd(x.ticks, satMul(x.evals, uint64(depth)*depthTicks))) {
		return 0, nil
	}
	switch v := v.(type) {
	case string:
		n := uint64(len(v))
		if !m.charge(satAdd(satMul(x.strRate, n), satMul(x.fmtRegex, regexFormatTicks(len(v))))) {
			return 0, nil
		}
		return 16 + n, nil
	case map[string]any:
		if !m.charge(satMul(x.memRate, uint64(len(v)))) {
			return 0, nil
		}
		var names *expansion
		if x.names != 0 {
			names = m.e.expand(x.names, jString)
		}
		hash := uint64(16)
		for k, c := range v {
			cost := satMul(x.keyRate, uint64(len(k)))
			if names != nil {
				cost = satAdd(cost, satAdd(names.ticks, satMul(names.strRate, uint64(len(k)))))
				cost = satAdd(cost, satMul(names.fmtRegex, regexFormatTicks(len(k))))
			}
			if !m.charge(cost) {
				return 0, nil
			}
			m.path = append(m.path, pathStep{k, -1})
			h, err := m.walk(c, m.e.member(st, x, k), depth+1)
			if err != nil || m.over {
				return 0, err
			}
			m.path = m.path[:len(m.path)-1]
			hash = satAdd(hash, satAdd(h, 64+uint64(len(k))))
		}
		return hash, nil
	case []any:
		if !m.charge(satMul(x.itemRate, uint64(len(v)))) {
			return 0, nil
		}
		hash := uint64(16)
		for i, c := range v {
			m.path = append(m.path, pathStep{i: i})
			h, err := m.walk(c, m.e.item(st, x, i), depth+1)
			if err != nil || m.over {
				return 0, err
			}
			m.path = m.path[:len(m.path)-1]
			hash = satAdd(hash, h)
		}
		if x.unique > 0 && len(v) > 1 {
			// up to 20 items, the library compares each pair; past 20, it
			// hashes each item once
			pairs := uint64(1)
			if len(v) <= 20 {
				pairs = 10
			}
			m.charge(satMul(satMul(x.unique, pairs), hash))
		}
		return hash, nil
	case json.Number:
		if err := checkNumber(string(v)); err != nil {
			return 0, &errNumber{m.pointer(), err}
		}
		return ratTicks, nil
	default:
		return 16, nil
	}
}
