//go:build shipped

package shipped

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

// TestOperatorSchedulesAreDelivered (issue 60, defect 1): under a meshd of
// the release with a module in its config (the audit logger, as the
// package's mesh.yaml has it) and delays on by default, five events the
// operator schedules with meshctl emit --after --via NODE all reach
// mesh.events when due, with their ids, as raw amqp091-go reads them; and
// the node neither drops nor dead-letters any of them. (Before the fix the
// mover dropped each: "module meshctl is no longer in node NODE's
// configuration".)
func TestOperatorSchedulesAreDelivered(t *testing.T) {
	url := brokertest.VHost(t)
	name := uniqueName("later")
	n := startNode(t, url, name, "  - name: audit-logger\n    path: "+binary("modules/audit-logger")+"\n    tools: [\"audit.*\"]\n    dead_letters: [\"#\"]\n")
	events := brokertest.Tap(t, url, wire.ExchangeEvents, "mesh.x.later")
	dead := brokertest.Tap(t, url, wire.ExchangeDead, "#")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	want := map[string]bool{}
	for i := range 5 {
		out, err := meshctl(ctx, url, "emit", "--after", "3s", "--via", name, "mesh.x.later", `{"n":`+string(rune('0'+i))+`}`)
		if err != nil {
			t.Fatal(err)
		}
		want[strings.TrimSpace(out)] = true
	}
	for len(want) > 0 {
		select {
		case d := <-events:
			if !want[d.MessageId] {
				t.Errorf("delivered %s (%s), not one of the schedules %v", d.MessageId, d.RoutingKey, want)
			}
			delete(want, d.MessageId)
		case d := <-dead:
			t.Fatalf("an operator's schedule was dead-lettered: %s %s: %v", d.MessageId, d.RoutingKey, d.Headers)
		case <-ctx.Done():
			t.Fatalf("%d of the operator's 5 schedules never came: %v; meshd's log:\n%s", len(want), want, n.log.String())
		}
	}
	if strings.Contains(n.log.String(), "dropped") {
		t.Errorf("meshd says it dropped something:\n%s", n.log.String())
	}
}
