package brokertest

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ChannelError runs do on a fresh channel of conn and returns the AMQP
// error the broker answered with: do's own, or the one the broker closed
// the channel with afterwards (an unconfirmed publish refused, say),
// waiting for it up to limit. nil: the broker refused nothing.
func ChannelError(t testing.TB, conn *amqp.Connection, limit time.Duration, do func(ch *amqp.Channel) error) *amqp.Error {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = do(ch)
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae
	}
	select {
	case ae = <-closed:
	case <-time.After(limit):
	}
	return ae
}
