package runtime

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/wire"
)

// Answerer is who answered a tool call: the node and the module its reply
// names (x-node, x-source, as the serving node stamped them). When several
// modules serve a tool, each call goes to one of them; a caller that must
// know which (meshctl's audit commands, when several audit loggers serve)
// passes one in the call's context (WithAnswerer).
type Answerer struct {
	Node, Module string
}

type answererKey struct{}

// WithAnswerer is ctx with a, which Node.Call fills from the reply it
// gets.
func WithAnswerer(ctx context.Context, a *Answerer) context.Context {
	return context.WithValue(ctx, answererKey{}, a)
}

// noteAnswerer fills the Answerer of ctx, if any, from reply d.
func noteAnswerer(ctx context.Context, d amqp.Delivery) {
	a, _ := ctx.Value(answererKey{}).(*Answerer)
	if a == nil {
		return
	}
	a.Node, _ = d.Headers[wire.HeaderNode].(string)
	a.Module, _ = d.Headers[wire.HeaderSource].(string)
}

// Servers is how many consumers take the requests of tool now: one per
// module serving it on a live node (0 with no error when none does).
func (n *Node) Servers(ctx context.Context, tool string) (int, error) {
	if err := wire.ValidateToolKey(tool); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s := n.session()
	if s == nil {
		return 0, fmt.Errorf("servers of %s: %w", tool, wire.ErrConnectionLost)
	}
	ch, err := s.subConn.Channel()
	if err != nil {
		return 0, fmt.Errorf("servers of %s: %w: %v", tool, wire.ErrConnectionLost, err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(wire.ServeQueue(tool), true, false, false, false, nil)
	if isAMQPCode(err, amqp.NotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("servers of %s: %w", tool, err)
	}
	return q.Consumers, nil
}
