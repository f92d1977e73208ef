package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/execute"
	"github.com/meshkit/mesh/internal/handlerlog"
	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// serveQueueArgs are the arguments of a serve.<key> queue: a durable
// classic queue, declared identically by every server of the key
// (docs/adr/0007-rpc-wire.md).
func serveQueueArgs() amqp.Table {
	return amqp.Table{"x-queue-type": QueueClassic}
}

// serve declares, binds and consumes the serve queue of each tool on one
// channel, with Prefetch requests in flight and as many workers per tool.
func (m *Module) serve(ctx context.Context, s *session, tools []tool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ch, err := s.subConn.Channel()
	if err != nil {
		return fmt.Errorf("open serve channel: %w", err)
	}
	// Every queue is declared and bound before anything consumes: a
	// declare the broker refuses (on a cluster, a serve queue whose home
	// node is down) closes the channel, and leaves nothing to tear down.
	if err := ch.Qos(m.cfg.Prefetch, 0, false); err != nil {
		ch.Close()
		return fmt.Errorf("set prefetch: %w", err)
	}
	for _, t := range tools {
		queue := wire.ServeQueue(t.key)
		if _, err := ch.QueueDeclare(queue, true, false, false, false, serveQueueArgs()); err != nil {
			ch.Close()
			return fmt.Errorf("declare queue %s: %w", queue, err)
		}
		if err := ch.QueueBind(queue, t.key, wire.ExchangeRPC, false, nil); err != nil {
			ch.Close()
			return fmt.Errorf("bind %s to %q: %w", queue, t.key, err)
		}
	}
	if err := m.track(ch); err != nil {
		return err
	}
	go m.watch(s, ch, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	for _, t := range tools {
		queue := wire.ServeQueue(t.key)
		tag := m.consumerTag(".serve." + t.key)
		deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consume %s: %w", queue, err)
		}
		m.addTag(ch, tag, queue)
		for range m.cfg.Prefetch {
			m.workers.Add(1)
			go func() {
				defer m.workers.Done()
				for d := range deliveries {
					m.answer(ch, t, d)
				}
			}()
		}
		m.log.Info("serving tool", "tool", t.key, "queue", queue)
	}
	return nil
}

// answer runs one request and replies on ch, then acks it. A request past
// its deadline is acked and dropped without running: its caller is gone.
// A request or a response that breaks the tool's declared schema (ADR 34)
// is answered with a permanent invalid_request or invalid_response.
func (m *Module) answer(ch *amqp.Channel, t tool, d amqp.Delivery) {
	meta, err := wire.DecodeMeta(d.Headers, d.ContentType, d.Body)
	if err != nil {
		m.log.Warn("malformed request refused", "tool", t.key, "err", err)
		m.reply(ch, d, nil, &sdk.ToolError{Code: wire.CodeInvalidRequest, Message: err.Error(), Permanent: true})
		return
	}
	deadline := time.Now().Add(m.node.cfg.CallTimeout)
	if s, ok := d.Headers[wire.HeaderDeadline].(string); ok {
		if dl, err := time.Parse(time.RFC3339Nano, s); err == nil {
			deadline = dl
		}
	}
	if !time.Now().Before(deadline) {
		m.log.Debug("request past its deadline dropped without running", "tool", t.key, "request_id", meta.ID)
		m.settle(d)
		return
	}
	// Its x-node against the broker user that published it (identity.go),
	// before the callers rule trusts the node it names.
	if err := m.identity(d, "request", meta.ID, t.key, meta.Node, d.UserId); err != nil {
		m.log.Warn("request refused: its x-node is not its publisher's (identity)", "tool", t.key, "request_id", meta.ID, "err", err)
		m.reply(ch, d, nil, &sdk.ToolError{Code: wire.CodeForbidden, Message: err.Error(), Permanent: true})
		return
	}
	if err := m.checkCaller(t.key, Caller{Node: meta.Node, Module: meta.Source, User: d.UserId}); err != nil {
		m.log.Warn("request from a caller the tool does not take refused", "tool", t.key, "request_id", meta.ID, "err", err)
		m.reply(ch, d, nil, &sdk.ToolError{Code: wire.CodeForbidden, Message: err.Error(), Permanent: true})
		return
	}
	// A request that breaks the tool's declared request schema is refused
	// before the handler, and before the stored answers: the same request
	// (a repeat has the same id because it has the same body) is refused
	// the same way again, so there is nothing to remember.
	if err := m.contracts.Request(t.key, d.Body); err != nil {
		m.log.Info("request refused: it does not conform to the tool's schema", "tool", t.key, "request_id", meta.ID, "err", err)
		m.reply(ch, d, nil, &sdk.ToolError{Code: wire.CodeInvalidRequest, Message: err.Error(), Permanent: true})
		return
	}
	req := sdk.Request{
		ID:          meta.ID,
		Tool:        t.key,
		Caller:      meta.Source,
		Node:        meta.Node,
		Time:        meta.Time,
		Deadline:    deadline,
		CausationID: meta.CausationID,
		Headers:     meta.Extra,
		Body:        d.Body,
	}
	traced, span := m.node.startServe(m.handleCtx, d, t.key, m.def.Name)
	var served error
	defer func() { endSpan(span, served) }()
	traced = handlerlog.Request(traced, m.log, req.ID, t.key, req.Caller, tracecontext.IDs)
	ctx, cancel := context.WithDeadline(causation.Handling(traced, req.ID, req.Time), deadline)
	defer cancel()
	var final *storedAnswer
	if req.CausationID != "" && !t.repeats {
		// Made inside a handling: its id is derived, and a retry of that
		// handling sends it again. (Other calls have fresh ids: nothing
		// to remember.)
		// Kept per caller: another caller naming the same id gets its own
		// answer, never this one's.
		stored, keep, err := m.answers.claim(ctx, strings.Join([]string{t.key, req.Node, req.Caller, d.UserId, req.ID}, "\x00"))
		if err != nil {
			m.settle(d) // the caller gave up while the first copy of its request ran
			return
		}
		digest := wire.Digest(t.key, wire.Meta{}, req.Body)
		if stored != nil && stored.digest != digest {
			te := conflict(req.ID, stored, digest)
			m.log.Warn("request refused: its id was answered for another request", "tool", t.key, "request_id", req.ID, "err", te.Message)
			m.reply(ch, d, nil, te)
			return
		}
		if stored != nil {
			m.log.Debug("repeated request answered from the stored answer", "tool", t.key, "request_id", req.ID)
			m.reply(ch, d, stored.body, stored.te)
			return
		}
		defer func() {
			if final != nil {
				final.digest = digest
			}
			keep(final)
		}()
	}
	resp, err := safeAnswer(ctx, t.handler, req)
	served = err
	if m.handleCtx.Err() != nil {
		// The module stopped past its grace period and cancelled the
		// handler: give the request back for another server to answer.
		if err := d.Reject(true); err != nil {
			m.log.Warn("returning a request failed; it returns when the channel closes", "err", err)
		}
		return
	}
	var body []byte
	var te *sdk.ToolError
	if err != nil {
		te = toolError(err)
	} else if body, err = m.node.encodeBody(resp); err != nil {
		te = &sdk.ToolError{Code: wire.CodeInternal, Message: "encode response: " + err.Error(), Permanent: true}
	} else if err = m.contracts.Response(t.key, body); err != nil {
		// The handler ran and broke its own contract: the caller is not
		// sent what it cannot rely on. The refusal is final (stored like a
		// response): a repeat would not run the handler again.
		m.log.Warn("response not sent: it does not conform to the tool's schema", "tool", t.key, "request_id", req.ID, "err", err)
		served = err
		body, te = nil, &sdk.ToolError{Code: schema.CodeInvalidResponse, Message: err.Error(), Permanent: true}
	}
	if keepable(te) {
		final = &storedAnswer{body: body, te: te} // kept even when the caller is gone: the tool ran
	}
	if !time.Now().Before(deadline) {
		// The caller gave up; a reply would only be dropped.
		m.settle(d)
		return
	}
	m.reply(ch, d, body, te)
}

// toolError is how a handler's error travels to the caller: a tool error
// as it is, another by the policy every host shares (execute.ToolFailure).
func toolError(err error) *sdk.ToolError {
	var te *sdk.ToolError
	if errors.As(err, &te) {
		return te
	}
	code, permanent := execute.ToolFailure(err)
	return &sdk.ToolError{Code: code, Message: err.Error(), Permanent: permanent}
}

func safeAnswer(ctx context.Context, h sdk.ToolHandler, req sdk.Request) (resp any, err error) {
	err, panicked := execute.Safely(func() (err error) { resp, err = h.HandleCall(ctx, req); return err })
	if panicked {
		return nil, &sdk.ToolError{Code: wire.CodeInternal, Message: err.Error(), Permanent: true}
	}
	if resp == nil && err == nil {
		resp = json.RawMessage("null")
	}
	return resp, err
}

// reply sends the answer to the caller's reply queue on the node's
// publishing connection and, once the broker confirmed it, acks the
// request: the broker has routed the reply before it forgets the request.
// Replies never go on the consuming connection: during a memory or disk
// alarm the broker stops reading any connection that publishes, and acks
// on it would stop with them.
func (m *Module) reply(ch *amqp.Channel, d amqp.Delivery, body []byte, te *sdk.ToolError) {
	if d.ReplyTo == "" {
		m.settle(d) // nobody to answer
		return
	}
	headers := amqp.Table{
		wire.HeaderStatus: wire.StatusOK,
		wire.HeaderSource: m.def.Name,
		wire.HeaderNode:   m.node.cfg.Node,
	}
	if te != nil {
		headers[wire.HeaderStatus] = wire.StatusError
		headers[wire.HeaderErrorCode] = te.Code
		headers[wire.HeaderErrorMessage] = truncateText(te.Message, 4096)
		headers[wire.HeaderErrorPermanent] = te.Permanent
		body = []byte("null")
	}
	s, ok := m.liveSession(d)
	if !ok {
		return // the request's channel is gone: it returns to its queue
	}
	ctx, cancel := context.WithTimeout(context.Background(), replyWait(d))
	defer cancel()
	err := s.pub.publish(ctx, "", d.ReplyTo, amqp.Publishing{
		Headers:       headers,
		ContentType:   wire.ContentTypeJSON,
		DeliveryMode:  amqp.Transient,
		CorrelationId: d.CorrelationId,
		Timestamp:     time.Now().UTC(),
		Body:          body,
	})
	switch {
	case err == nil:
	case errors.Is(err, errUnroutable):
		// The caller's reply queue is gone (it gave up or went away):
		// nobody waits for the answer.
	default:
		m.log.Warn("reply failed; the request returns to the queue", "err", err)
		_ = d.Reject(true)
		return
	}
	m.settle(d)
}

// replyWait bounds the wait for a reply's confirm: until the caller's
// deadline, and at least a few seconds for one already close to it.
func replyWait(d amqp.Delivery) time.Duration {
	const least = 5 * time.Second
	if s, ok := d.Headers[wire.HeaderDeadline].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return max(time.Until(t), least)
		}
	}
	return 30 * time.Second
}

func (m *Module) settle(d amqp.Delivery) {
	if err := d.Ack(false); err != nil {
		m.log.Warn("ack of a request failed; it may run again", "err", err)
	}
}
