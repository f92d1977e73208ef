// Package exists asks a broker whether a queue or an exchange exists. A
// passive declare of a missing one closes the channel it is asked on (404
// NOT_FOUND), so each question gets a channel of its own.
package exists

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue says whether queue exists on conn's virtual host.
func Queue(conn *amqp.Connection, queue string) (bool, error) {
	return ask(conn, "queue "+queue, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
}

// Exchange says whether exchange exists on conn's virtual host.
func Exchange(conn *amqp.Connection, exchange string) (bool, error) {
	return ask(conn, "exchange "+exchange, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(exchange, amqp.ExchangeFanout, true, false, false, false, nil)
	})
}

// ask runs declare on a channel of its own: false for 404, an error for
// any other failure.
func ask(conn *amqp.Connection, what string, declare func(*amqp.Channel) error) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := declare(ch); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return false, nil
		}
		return false, fmt.Errorf("look for %s: %w", what, err)
	}
	return true, nil
}
