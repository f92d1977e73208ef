// Package countmodule is the module the benchmark runs both in-process and
// as a module process: it decodes every mesh.bench.* event and, when it has
// handled the number it expects, emits module.count.done, and again at each
// multiple of that number (so one process can count several batches).
// Expecting 0, it answers every event: module.count.done carries the
// event's seq.
package countmodule

import (
	"context"
	"sync/atomic"

	"github.com/meshkit/mesh/sdk"
)

// Module returns the module "count", expecting expect events.
func Module(expect int64) sdk.Module { return Named("count", expect) }

// Named returns the module under another name, so that several can run on
// one node.
func Named(name string, expect int64) sdk.Module {
	var handled atomic.Int64
	var mesh sdk.Mesh
	return sdk.Module{
		Name:  name,
		Emits: []string{"done"},
		Setup: func(m sdk.Mesh) error {
			mesh = m
			return m.On("mesh.bench.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				var body struct {
					SentNanos int64 `json:"sent_ns"`
					Seq       int   `json:"seq"`
				}
				if err := ev.Decode(&body); err != nil {
					return sdk.Permanent(err)
				}
				if expect == 0 {
					_, err := mesh.Emit(ctx, "done", map[string]int{"seq": body.Seq})
					return err
				}
				if n := handled.Add(1); n%expect == 0 {
					_, err := mesh.Emit(ctx, "done", map[string]int64{"handled": n})
					return err
				}
				return nil
			}))
		},
	}
}
