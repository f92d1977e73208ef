package schema

import (
	"encoding/json"
	"strings"
	"testing"
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
