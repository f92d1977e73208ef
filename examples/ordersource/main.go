// Command ordersource plays an outside system that knows nothing of the
// mesh: with raw amqp091-go it declares its own queue (shop.orders, a
// durable classic queue) and publishes orders into it, each with a ULID
// message id and a JSON body. The dispatcher's trigger "orders" consumes
// that queue as it is (examples/mesh.yaml).
//
//	ordersource [-url amqp://...] [-n 3] [-declare-only]
//
// The broker is -url, else MESH_AMQP_URL (as for meshd and meshctl), else
// the local broker's default virtual host.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	def := os.Getenv("MESH_AMQP_URL")
	if def == "" {
		def = "amqp://guest:guest@127.0.0.1:5672/"
	}
	url := flag.String("url", def, "broker URL, with its virtual host (default MESH_AMQP_URL or the local broker's /)")
	n := flag.Int("n", 3, "orders to publish")
	declareOnly := flag.Bool("declare-only", false, "declare the queue and publish nothing")
	flag.Parse()
	if err := run(*url, *n, *declareOnly); err != nil {
		fmt.Fprintln(os.Stderr, "ordersource:", err)
		os.Exit(1)
	}
}

func run(url string, n int, declareOnly bool) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare("shop.orders", true, false, false, false, nil); err != nil {
		return err
	}
	if declareOnly {
		return nil
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		id := ulid.Make().String()
		body := fmt.Sprintf(`{"order":"%s","customer":"c-%d","cents":%d}`, id, 100+i, 1000*(i+1))
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "shop.orders", false, false, amqp.Publishing{
			MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: []byte(body)})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			return fmt.Errorf("order %s not confirmed: %v", id, err)
		}
		fmt.Printf("published order %s into shop.orders: %s\n", id, body)
	}
	return nil
}
