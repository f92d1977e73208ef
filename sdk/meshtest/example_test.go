package meshtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/meshtest"
)

// A unit test of a module: load it, emit what it consumes, Settle, and
// read what it emitted and what was dead-lettered. Retries take no time:
// Settle moves the mesh's clock to each one.
func ExampleMesh() {
	greeter := sdk.Module{Name: "greeter", Emits: []string{"greeted"}, Setup: func(m sdk.Mesh) error {
		return m.On("node.*.joined", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			if ev.Attempt == 1 {
				return errors.New("the greeting service is warming up")
			}
			_, err := m.Emit(ctx, "greeted", map[string]string{"node": ev.Source})
			return err
		}))
	}}
	mt := meshtest.New(meshtest.Config{})
	defer mt.Close()
	if err := mt.Load(greeter, meshtest.ModuleConfig{}); err != nil {
		fmt.Println(err)
		return
	}
	start := mt.Now()
	joined, _ := mt.Emit(context.Background(), "anchor", "node.anchor.joined", map[string]string{})
	mt.Settle()
	for _, ev := range mt.Emitted() {
		fmt.Println(ev.Type, string(ev.Body), ev.CausationID == joined)
	}
	fmt.Println("dead letters:", len(mt.DeadLetters()), "clock moved:", mt.Now().Sub(start))
	// Output:
	// node.anchor.joined {} false
	// module.greeter.greeted {"node":"anchor"} true
	// dead letters: 0 clock moved: 200ms
}
