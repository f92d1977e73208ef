package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// payloadSchema is the declared schema of the benchmark's body (payload):
// every field typed and bounded, as an author would declare it.
const payloadSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["sent_ns", "seq", "pad"],
  "additionalProperties": false,
  "properties": {
    "sent_ns": {"type": "integer", "minimum": 0},
    "seq": {"type": "integer", "minimum": 0},
    "pad": {"type": "string", "maxLength": 1024}
  }
}`

// benchSchemas measures the event path (first queue type) of a module
// that declares no schema, one whose emits are validated against its
// declared schema, and one that declares it with skip_body_validation, in
// alternating rounds, and prints the ratios to the first (ADR 34).
func benchSchemas(url string, o options) error {
	qt := strings.Split(o.queueTypes, ",")[0]
	fmt.Printf("\n== declared schemas (%s queues) ==\n", qt)
	o.publishers = o.meshPublishers
	modes := []struct {
		name     string
		declared bool
		skip     bool
	}{{"none", false, false}, {"validated", true, false}, {"skipped", true, true}}
	tput := make([][]float64, len(modes))
	cpu := make([][]float64, len(modes))
	for r := 0; r < o.rounds; r++ {
		for i, m := range modes {
			var schemas []sdk.Schema
			if m.declared {
				schemas = []sdk.Schema{{Version: "1", JSON: []byte(payloadSchema)}}
			}
			tp, c, err := throughput(func(s *sink) (side, error) {
				return newMeshOf(url, qt, s, nil, schemas, runtime.ModuleConfig{SkipBodyValidation: m.skip})
			}, o)
			if err != nil {
				return err
			}
			us := float64(c) / float64(time.Microsecond)
			tput[i], cpu[i] = append(tput[i], tp), append(cpu[i], us)
			fmt.Printf("round %d schema %-9s  %8.0f events/s  client CPU %5.1f µs/event\n", r+1, m.name, tp, us)
		}
	}
	fmt.Printf("validated/none: throughput ratio %.2f, client CPU ratio %.2f (+%.1f µs/event); skipped/none: throughput %.2f, CPU %.2f\n",
		pairedRatio(tput[1], tput[0]), pairedRatio(cpu[1], cpu[0]), median(cpu[1])-median(cpu[0]),
		pairedRatio(tput[2], tput[0]), pairedRatio(cpu[2], cpu[0]))
	record("emit with its body validated / without a schema, client CPU", pairedRatio(cpu[1], cpu[0]), 1.10, false, "")
	return nil
}
