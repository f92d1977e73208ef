package deadletters_test

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// List the dead letters the billing module gave up on in the last day, then
// send them back to billing's queue. (Needs a broker, so it is compiled but
// not run.)
func ExampleReplay() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()

	f := deadletters.Filter{Module: "billing", NewerThan: 24 * time.Hour}
	msgs, err := deadletters.List(ctx, conn, wire.QueueDead, f)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range msgs {
		fmt.Println(m.ID, m.Type, m.Reason, m.Attempts, m.Error)
	}

	res, err := deadletters.Replay(ctx, conn, wire.QueueDead, f)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("replayed %d of %d\n", res.Done, res.Matched)
	for _, l := range res.Left {
		fmt.Println("left", l.ID, l.Err) // e.g. queue gone: the module no longer runs there
	}
}

// Delete the unrouted events of a type nobody will ever consume, after a
// dry run says how many.
func ExamplePurge() {
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()

	f := deadletters.Filter{Type: "module.legacy.#"}
	dry, err := deadletters.Purge(ctx, conn, wire.QueueUnrouted, f, deadletters.DryRun())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("would purge", dry.Done)
	if _, err := deadletters.Purge(ctx, conn, wire.QueueUnrouted, f); err != nil {
		fmt.Println(err)
	}
}
