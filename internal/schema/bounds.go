package schema

import (
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The bounds on what a declared schema may cost meshd (issue 47). A
// module's schema is untrusted, and so are the bodies checked against it
// (the module emits them; a caller sends a tool's requests). The library
// that validates has no budget of its own: a 1 KB schema of nested anyOf
// can check one value against millions of subschemas. So Compile refuses
// a schema whose fan-out is too large, and Validate estimates, before
// validating, what checking the body would cost, and refuses a body over
// its budget without checking it.
//
// Costs are counted in steps. A step is one subschema applied to one value
// (about a microsecond on today's hardware, or less); a value's size adds
// steps where the library's work grows with it: the bytes of a string
// scanned by each pattern (by the pattern's size: Go's regexp is linear in
// the text, times the program), the members or items of an object or
// array walked by each subschema applied to it, what uniqueItems hashes,
// the values of an enum or a const compared, the depth at which an error
// is made (the library copies its location).
const (
	// MaxFanOut bounds how many subschemas one value of a body may be
	// checked against, through in-place applicators (allOf, anyOf, oneOf,
	// not, if/then/else, dependentSchemas, $ref) and, for a value below
	// the body's top, through the applicators that led to it (properties,
	// patternProperties, items, ...). Compile refuses a schema that allows
	// more, at any depth down to MaxFanOutDepth, naming where it fans out.
	// Real schemas check a value against tens of subschemas, a few hundred
	// for a large oneOf of variants built with allOf; 10,000 is about
	// 10 ms of checking one value at worst, and leaves a body of ten such
	// values within MaxSteps.
	MaxFanOut = 10_000
	// MaxFanOutDepth is how deep below a body's top Compile follows a
	// schema's applicators for MaxFanOut: fan-out that compounds level by
	// level (two subschemas per level of a body doubles) passes
	// MaxFanOut within 14 levels; what grows slower is left to the budget
	// of each body (MaxSteps).
	MaxFanOutDepth = 64
	// MaxSteps is the budget of checking a body of up to
	// MaxSteps/StepsPerByte bytes (about 49 KiB), in steps; a larger body
	// may take StepsPerByte for each of its bytes. Validate refuses a
	// body whose estimate exceeds its budget, without checking it, with
	// an error wrapping ErrBody that gives the numbers. The worst cases of
	// each part of the estimate take 0.1 to 1.3 µs of CPU a step and
	// allocate up to 450 bytes a step (the library's errors, kept until
	// it returns; BenchmarkCostModel): 100,000 steps are at most about
	// 0.13 s and 45 MB. An event of a few kilobytes checked against a
	// real schema takes tens to a few thousand steps.
	MaxSteps = 100_000
	// StepsPerByte is the budget of a large body per byte: a body of the
	// default limit, 1 MiB, may take 2 million steps (2.6 s and 900 MB
	// at worst, where the library alone takes 200 MB for a megabyte of
	// values that each break their schema). An array of objects checked
	// against a generated schema (a $ref per item, a few properties with
	// numbers and patterns) takes about a third of a step per byte; an
	// array of small numbers, each against its items' $ref and its
	// target, about one.
	StepsPerByte = 2
	// MaxNumberLen bounds a number's text in a body or a schema, in
	// characters: a 256-bit integer has 78 digits. A longer one is
	// refused (RFC 8259 §6 lets a reader limit numbers): the library
	// reads every number as an exact fraction, at a cost that grows
	// faster than its length.
	MaxNumberLen = 100
	// MaxNumberExponent bounds a number's decimal exponent, net of its
	// fraction's digits (1.5e10 has 9), either way: a float64 is within
	// ±324. The library computes 10 to that power exactly: 1e999999 takes
	// 40 ms, and beyond a million it panics.
	MaxNumberExponent = 400
	// MaxSubschemas bounds the objects and booleans of a schema's
	// document, each a subschema or a part of one: the library's
	// compiling takes time in the square of the subschemas it compiles
	// (80,000 empty ones, 240 KB, take 45 s; 19,000 about 2 s). A
	// generated schema of 600 types of 8 properties each has about 7,000.
	MaxSubschemas = 20_000
	// MaxPatternSize bounds a schema's regular expression (pattern,
	// patternProperties), in the instructions Go's regexp compiles it to
	// ("[a-z]{1,100}" is about 200): matching takes time in the size of
	// the text times that of the program, and compiling grows with it.
	MaxPatternSize = 10_000
	// MaxPatternsSize bounds the sum of a schema's regular expressions'
	// sizes (each distinct expression once).
	MaxPatternsSize = 100_000
)

// Ticks are the unit the estimate is computed in: 1/1024 of a step, about
// a nanosecond.
const (
	stepTicks = 1024
	// evalTicks is one subschema applied to one value.
	evalTicks = stepTicks
	// ratTicks is one number read as an exact fraction (minimum,
	// multipleOf, an enum's number compared, a number hashed).
	ratTicks = stepTicks
	// depthTicks is one level of a location the library copies into its
	// errors, per subschema applied.
	depthTicks = 64
	// regexByteTicks is a byte of text, per instruction of a regexp
	// matching it.
	regexByteTicks = 16
	// nameTicks is one name looked up in an object (required,
	// dependentRequired, dependencies).
	nameTicks = 16
	// memberTicks and itemTicks are one member of an object or item of an
	// array, per subschema applied to it: what the library does for it
	// even when no subschema of it applies; unevaluated* makes it copy
	// each name or index.
	memberTicks, unevalMemberTicks = 64, 256
	itemTicks, unevalItemTicks     = 64, 768
	// patternCallTicks is one patternProperties regexp run on a name,
	// besides its bytes.
	patternCallTicks = 64
	// formatTicks and formatByteTicks are a format assertion (in drafts
	// before 2019-09, or by the format-assertion vocabulary) of a string.
	formatTicks, formatByteTicks = stepTicks, 24
	// bodyPatternSize bounds a string of a body that "format": "regex"
	// compiles, and regexCompileTicks is the cost of compiling one
	// instruction; regexParseTicks is the cost of parsing a byte.
	bodyPatternSize   = 1_000
	regexCompileTicks = 512
	regexParseTicks   = 64
)

// satMax is where the estimate's arithmetic saturates: it never overflows.
const satMax = 1 << 62

func satAdd(a, b uint64) uint64 {
	if s := a + b; s < satMax {
		return s
	}
	return satMax
}

func satMul(a, b uint64) uint64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > satMax/b {
		return satMax
	}
	return a * b
}

// checkNumber refuses a number whose text exceeds MaxNumberLen or whose
// exponent exceeds MaxNumberExponent.
func checkNumber(n string) error {
	if len(n) > MaxNumberLen {
		return fmt.Errorf("%s is out of bounds: %d characters, at most %d (MaxNumberLen)", abbreviate(n), len(n), MaxNumberLen)
	}
	mant, exp, _ := strings.Cut(strings.ToLower(n), "e")
	e, err := strconv.Atoi(cmp.Or(exp, "0"))
	if _, frac, ok := strings.Cut(mant, "."); ok && err == nil {
		e -= len(frac)
	}
	if err != nil || e > MaxNumberExponent || e < -MaxNumberExponent { // err: more digits than an int holds
		return fmt.Errorf("%s is out of bounds: its exponent, net of its fraction's digits, is beyond ±%d (MaxNumberExponent)", n, MaxNumberExponent)
	}
	return nil
}

// abbreviate cuts s to 24 bytes for a message.
func abbreviate(s string) string {
	if len(s) <= 24 {
		return s
	}
	return strings.ToValidUTF8(s[:24], "") + "…"
}

// shorten cuts a JSON pointer to 80 bytes for a message.
func shorten(ptr string) string {
	if len(ptr) <= 80 {
		return ptr
	}
	return strings.ToValidUTF8(ptr[:80], "") + "…"
}

// levels is "1 level", "2 levels".
func levels(n int) string {
	if n == 1 {
		return "1 level"
	}
	return printer.Sprintf("%d levels", n)
}

// checkDoc refuses a schema document holding more than MaxSubschemas
// objects and booleans (what may be a subschema), or a number checkNumber
// refuses, naming its pointer.
func checkDoc(doc any) error {
	n := 0
	var walk func(v any, ptr string) error
	walk = func(v any, ptr string) error {
		switch v := v.(type) {
		case json.Number:
			if err := checkNumber(string(v)); err != nil {
				return fmt.Errorf("%s: number %w", pointerOrRoot(ptr), err)
			}
		case bool:
			n++
		case map[string]any:
			n++
			for _, k := range sortedKeys(v) {
				if err := walk(v[k], ptr+"/"+escape(k)); err != nil {
					return err
				}
			}
		case []any:
			for i, c := range v {
				if err := walk(c, ptr+"/"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(doc, ""); err != nil {
		return err
	}
	if n > MaxSubschemas {
		return fmt.Errorf("%s objects and booleans (subschemas), at most %s (MaxSubschemas)", printer.Sprint(n), printer.Sprint(MaxSubschemas))
	}
	return nil
}

func pointerOrRoot(ptr string) string {
	if ptr == "" {
		return "/"
	}
	return ptr
}

// patterns is the regexp engine of one schema: Go's regexp, which matches
// in linear time, behind a bound on each expression's size and, while the
// schema compiles, on their sum. After Compile it compiles the strings of
// bodies that "format": "regex" asserts, bounded by bodyPatternSize.
type patterns struct {
	mu        sync.Mutex
	sizes     map[string]uint64 // a schema's expressions, by their text
	total     uint64
	compiling atomic.Bool
}

func newPatterns() *patterns {
	p := &patterns{sizes: map[string]uint64{}}
	p.compiling.Store(true)
	return p
}

// compile is the jsonschema.RegexpEngine.
func (p *patterns) compile(expr string) (jsonschema.Regexp, error) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, err
	}
	size := progSize(re)
	if !p.compiling.Load() {
		if size > bodyPatternSize {
			return nil, fmt.Errorf("compiles to about %d instructions, at most %d", size, bodyPatternSize)
		}
		return regexp.Compile(expr)
	}
	if size > MaxPatternSize {
		return nil, fmt.Errorf("compiles to about %s instructions, at most %s (MaxPatternSize)", printer.Sprint(size), printer.Sprint(MaxPatternSize))
	}
	p.mu.Lock()
	if _, ok := p.sizes[expr]; !ok {
		p.sizes[expr] = size
		p.total += size
	}
	total := p.total
	p.mu.Unlock()
	if total > MaxPatternsSize {
		return nil, fmt.Errorf("the schema's regular expressions compile to more than %s instructions (MaxPatternsSize)", printer.Sprint(MaxPatternsSize))
	}
	return regexp.Compile(expr)
}

// size is the size of a schema's expression, as compile measured it.
func (p *patterns) size(expr string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.sizes[expr]; ok {
		return s
	}
	return MaxPatternSize
}

// progSize estimates the instructions re compiles to, without compiling
// it: a repetition counts its subexpression as many times as it may
// repeat. Saturates.
func progSize(re *syntax.Regexp) uint64 {
	switch re.Op {
	case syntax.OpLiteral:
		return uint64(max(len(re.Rune), 1))
	case syntax.OpCapture:
		return satAdd(progSize(re.Sub[0]), 2)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		return satAdd(progSize(re.Sub[0]), 1)
	case syntax.OpRepeat:
		n := re.Max
		if n < 0 {
			n = re.Min + 1
		}
		n = max(n, 1)
		return satAdd(satMul(progSize(re.Sub[0]), uint64(n)), uint64(n))
	case syntax.OpConcat, syntax.OpAlternate:
		s := uint64(len(re.Sub))
		for _, sub := range re.Sub {
			s = satAdd(s, progSize(sub))
		}
		return s
	default:
		return 1
	}
}

// regexFormatTicks is what "format": "regex" costs on a string of n bytes:
// parsing it and compiling it (up to bodyPatternSize instructions; an
// expression compiles to at most about 150 instructions a byte).
func regexFormatTicks(n int) uint64 {
	insts := min(satMul(uint64(n), 150), bodyPatternSize)
	return satAdd(satMul(uint64(n), regexParseTicks), satMul(insts, regexCompileTicks))
}
