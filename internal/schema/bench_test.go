package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const benchSchema = `{"type": "object", "required": ["sent_ns", "seq", "pad"], "additionalProperties": false,
  "properties": {"sent_ns": {"type": "integer", "minimum": 0}, "seq": {"type": "integer", "minimum": 0}, "pad": {"type": "string", "maxLength": 8192}}}`

func benchBody(size int) []byte {
	b, _ := json.Marshal(map[string]any{"sent_ns": 1764000000000000000, "seq": 42, "pad": strings.Repeat("x", size-60)})
	return b
}

// BenchmarkValidate is the cost of one emit's validation, of a 256-byte
// and a 4 KiB body (ADR 34; make bench measures the emit path around it).
func BenchmarkValidate(b *testing.B) {
	c, err := Compile("1", []byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{256, 4096} {
		body := benchBody(size)
		b.Run(map[int]string{256: "256B", 4096: "4KiB"}[size], func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := c.Validate(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func allOfN(n int, sub string) string {
	return `{"allOf":[` + strings.TrimSuffix(strings.Repeat(sub+",", n), ",") + `]}`
}

func arrayOf(n int, item func(i int) string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item(i))
	}
	b.WriteByte(']')
	return b.String()
}

func objectOf(n int, val string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%s`, i, val)
	}
	b.WriteByte('}')
	return b.String()
}

type calibCase struct{ name, schema, body string }

func calibCases() []calibCase {
	enum := arrayOf(5000, func(i int) string { return fmt.Sprint(i) })
	return []calibCase{
		{"anyOf chain 11 on 1", chain(11, "anyOf", `{"type":"string"}`), `1`},
		{"allOf 2000 type fail", allOfN(2000, `{"type":"string"}`), `1`},
		{"allOf 2000 minimum fail", allOfN(2000, `{"minimum":2}`), `1`},
		{"items integer on 20k strings", `{"items":{"type":"integer"}}`, arrayOf(20000, func(int) string { return `"x"` })},
		{"items $ref integer on 20k ints", `{"items":{"$ref":"#/$defs/i"},"$defs":{"i":{"type":"integer","minimum":0}}}`, arrayOf(20000, func(i int) string { return fmt.Sprint(i) })},
		{"deep minItems 3000", `{"minItems":1,"items":{"$ref":"#"}}`, strings.Repeat("[", 3000) + strings.Repeat("]", 3000)},
		{"uniqueItems chain 300", `{"uniqueItems":true,"items":{"$ref":"#"}}`, strings.Repeat("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,", 300) + "0" + strings.Repeat("]", 300)},
		{"uniqueItems 5k numbers", `{"uniqueItems":true}`, arrayOf(5000, func(i int) string { return fmt.Sprint(i) })},
		{"pattern 1000 on 2KB", `{"pattern":"[a-z]{1000}b"}`, `"` + strings.Repeat("a", 2000) + `"`},
		{"pattern small on 1MB", `{"pattern":"^a*$"}`, `"` + strings.Repeat("a", 1<<20) + `"`},
		{"patternProperties 20 on 5k keys", `{"patternProperties":{` + strings.TrimSuffix(strings.Repeat(`"^z[0-9]+$":true,`, 1), ",") + `,` + func() string {
			var b []string
			for i := range 19 {
				b = append(b, fmt.Sprintf(`"^y%d":true`, i))
			}
			return strings.Join(b, ",")
		}() + `}}`, objectOf(5000, "0")},
		{"uneval allOf 20 on 5k keys", `{"unevaluatedProperties":false,"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"properties":{"a":true}},`, 20), ",") + `]}`, objectOf(5000, "0")},
		{"uneval items allOf 20 on 5k", `{"unevaluatedItems":false,"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"prefixItems":[true]},`, 20), ",") + `]}`, arrayOf(5000, func(int) string { return "0" })},
		{"enum 5000 numbers miss x 8", `{"$defs":{"e":{"enum":` + enum + `}},"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/e"},`, 8), ",") + `]}`, `-1`},
		{"propertyNames pattern on 5k keys", `{"propertyNames":{"pattern":"^[a-z]{1,50}$"}}`, objectOf(5000, "0")},
		{"format regex draft7 100 strings", `{"$schema":"http://json-schema.org/draft-07/schema#","items":{"format":"regex"}}`, arrayOf(100, func(int) string { return `"[a-z]{1,100}[a-z]{1,100}[a-z]{1,100}[a-z]{1,100}"` })},
		{"linear A/C deep 200", `{"$ref":"#/$defs/A","$defs":{"A":{"allOf":[{"$ref":"#/$defs/C"}],"properties":{"x":{"$ref":"#/$defs/A"}}},"C":{"properties":{"x":{"$ref":"#/$defs/C"}},"type":"object","required":["y"]}}}`, strings.Repeat(`{"x":`, 200) + `{}` + strings.Repeat(`}`, 200)},
		{"contains string on 20k ints", `{"contains":{"type":"string"}}`, arrayOf(20000, func(i int) string { return fmt.Sprint(i) })},
		{"const 2k-key object x 20", `{"$defs":{"c":{"const":` + objectOf(2000, "0") + `}},"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/c"},`, 20), ",") + `]}`, strings.TrimSuffix(objectOf(2000, "0"), "0}") + "1}"},
		{"format email draft7 on 1MB", `{"$schema":"http://json-schema.org/draft-07/schema#","allOf":[{"format":"email"},{"format":"hostname"},{"format":"date-time"},{"format":"uri"}]}`, `"` + strings.Repeat("a", 1<<20) + `"`},
		{"multipleOf 1e-300 on 1e300 x 1000", allOfN(1000, `{"multipleOf":1e-300}`), `1.5e300`},
		{"bench 4KiB", benchSchema, string(benchBody(4096))},
		{"order", order, `{"id":"o-1","price":2.5,"status":"new","tags":["a"],"ship":{"city":"Oslo"}}`},
	}
}

// BenchmarkCostModel measures the library's validation of a worst case of
// each part of the cost model (not bounded: the library alone) against
// the estimate of its cost: ns/step and cpu-ns/step (the process's CPU
// time, GC included, which other load on the machine does not inflate)
// should stay around or below 1,000, a step being about a microsecond,
// and B/step is the memory the library allocates per step.
func BenchmarkCostModel(b *testing.B) {
	for _, tc := range calibCases() {
		b.Run(tc.name, func(b *testing.B) {
			c, err := Compile("1", []byte(tc.schema))
			if err != nil {
				b.Fatal(err)
			}
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(tc.body)))
			if err != nil {
				b.Fatal(err)
			}
			used, _, _, _, err := c.cost.estimate(v, satMax)
			if err != nil {
				b.Fatal(err)
			}
			steps := float64(used) / stepTicks
			var before, after syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.ReportAllocs()
			for b.Loop() {
				if err := c.sch.Validate(v); err != nil {
					if ve, ok := err.(*jsonschema.ValidationError); ok {
						firstViolation(ve)
					}
				}
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			b.ReportMetric(steps, "steps")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/steps, "ns/step")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/steps, "cpu-ns/step")
			b.ReportMetric(steps/float64(len(tc.body)), "steps/B")
		})
	}
}

// BenchmarkEstimate is what the estimate adds to BenchmarkValidate's
// validations: the walk of the decoded body through the schema's states.
func BenchmarkEstimate(b *testing.B) {
	c, err := Compile("1", []byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{256, 4096} {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(benchBody(size)))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(map[int]string{256: "256B", 4096: "4KiB"}[size], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, over, _, _, err := c.cost.estimate(v, budget(size)); over || err != nil {
					b.Fatal(over, err)
				}
			}
		})
	}
}

// BenchmarkRefusedBody is what Validate spends on a body its budget
// refuses (decoding it, and the estimate up to the budget): a body 3,000
// levels deep under a schema whose fan-out grows by level (the library
// alone: minutes), nested arrays under uniqueItems, a long string under a
// large pattern.
func BenchmarkRefusedBody(b *testing.B) {
	for _, tc := range []struct{ name, schema, body string }{
		{"deep", linear, nest(3000, "x", `{}`)},
		{"uniqueItems", `{"uniqueItems":true,"items":{"$ref":"#"}}`, nest2(1000)},
		{"pattern", `{"pattern":"[a-z]{1000}b"}`, `"` + strings.Repeat("a", 1<<16) + `"`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := Compile("1", []byte(tc.schema))
			if err != nil {
				b.Fatal(err)
			}
			body := []byte(tc.body)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := c.Validate(body); err == nil || !strings.Contains(err.Error(), "too costly") {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCompileFanOut is Compile of the schema of issue 47 at 18
// levels, which it refuses, beside the library's compiling of it alone
// (what Compile did before the bound).
func BenchmarkCompileFanOut(b *testing.B) {
	doc := []byte(chain(18, "anyOf", `{"type":"string"}`))
	b.Run("Compile", func(b *testing.B) {
		for b.Loop() {
			if _, err := Compile("1", doc); err == nil {
				b.Fatal("compiled")
			}
		}
	})
	b.Run("library", func(b *testing.B) {
		for b.Loop() {
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
			if err != nil {
				b.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			if err := c.AddResource("mesh:///schema.json", v); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Compile("mesh:///schema.json"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
