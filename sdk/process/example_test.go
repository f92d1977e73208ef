package process_test

import (
	"context"
	"fmt"

	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/process"
)

// Run is the whole main of a module binary. meshd starts the binary and
// supervises it; started any other way, Run says so and returns.
func ExampleRun() {
	notifier := sdk.Module{Name: "notifier", Setup: func(m sdk.Mesh) error {
		return m.On("module.umami.site.created", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			m.Logger().Info("new site", "event_id", ev.ID)
			return nil
		}))
	}}
	if err := process.Run(notifier); err != nil {
		fmt.Println(err)
	}
	// Output: this is a mesh module: meshd starts it (meshd run --config ...); it does not run on its own
}
