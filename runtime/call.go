package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// serverCheckTTL is how long a tool seen with a consumer is trusted to
// still have one before Call checks again; serverRecheck is how often a
// call waiting for its answer checks that a server is still there.
const (
	serverCheckTTL = time.Second
	serverRecheck  = time.Second
)

// caller makes tool calls for a node: one channel publishes requests
// (mandatory, without confirms: a request nobody can route comes back as a
// basic.return at once), and one exclusive, auto-delete, server-named reply
// queue per connection receives every answer, matched by correlation id.
type caller struct {
	node       *Node
	sess       *session
	pub        *amqp.Channel // shared by calling goroutines: amqp091-go serialises Publish per channel
	replies    *amqp.Channel
	replyQueue string

	mu      sync.Mutex
	pending map[string]chan callResult
	lost    error // set once a channel is gone; every later call fails with it

	checkMu sync.Mutex
	check   *amqp.Channel        // passive declares; a 404 closes it, so it is reopened
	served  map[string]time.Time // tool → when it was last seen with a consumer
	// checked is each tool's latest check, whatever it found: the calls
	// waiting on one tool share it rather than each asking the broker.
	checked map[string]serverCheck
}

// serverCheck is one answer to "is anyone serving the tool?".
type serverCheck struct {
	at     time.Time
	served bool
}

type callResult struct {
	reply amqp.Delivery
	err   error
}

// caller returns the node's caller on the current session, making it on
// first use and again after a reconnect (its reply queue went with the
// old connection). While the node is reconnecting it waits, until ctx is
// done.
func (n *Node) caller(ctx context.Context) (*caller, error) {
	for {
		s, err := n.awaitSession(ctx)
		if err != nil {
			return nil, err
		}
		c, err := n.callerOn(s)
		if errors.Is(err, amqp.ErrClosed) {
			// The connection closed before the node noticed: wait for the
			// next session.
			s.markLost(fmt.Errorf("broker connection lost: %w", err))
			continue
		}
		return c, err
	}
}

// callerOn returns the caller on s, making it if the current one is on
// another session or lost.
func (n *Node) callerOn(s *session) (*caller, error) {
	n.callerMu.Lock()
	defer n.callerMu.Unlock()
	if c := n.calls; c != nil {
		c.mu.Lock()
		usable := c.sess == s && c.lost == nil
		c.mu.Unlock()
		if usable {
			return c, nil
		}
		c.close()
		n.calls = nil
	}
	c, err := newCaller(n, s)
	if err != nil {
		return nil, err
	}
	n.calls = c
	return c, nil
}

func newCaller(n *Node, s *session) (*caller, error) {
	c := &caller{node: n, sess: s, pending: make(map[string]chan callResult), served: make(map[string]time.Time), checked: make(map[string]serverCheck)}
	var err error
	if c.pub, err = s.pubConn.Channel(); err != nil {
		return nil, fmt.Errorf("open request channel: %w", err)
	}
	if c.replies, err = s.subConn.Channel(); err != nil {
		c.pub.Close()
		return nil, fmt.Errorf("open reply channel: %w", err)
	}
	q, err := c.replies.QueueDeclare("", false, true, true, false, amqp.Table{"x-queue-type": QueueClassic})
	if err == nil {
		c.replyQueue = q.Name
		var deliveries <-chan amqp.Delivery
		deliveries, err = c.replies.Consume(q.Name, "", true, true, false, false, nil)
		if err == nil {
			go c.receive(deliveries)
		}
	}
	if err != nil {
		c.pub.Close()
		c.replies.Close()
		return nil, fmt.Errorf("declare reply queue: %w", err)
	}
	go c.returned(c.pub.NotifyReturn(make(chan amqp.Return, 16)))
	go c.watch(c.pub.NotifyClose(make(chan *amqp.Error, 1)), c.replies.NotifyClose(make(chan *amqp.Error, 1)))
	return c, nil
}

// receive hands each reply to its waiting call; a reply nobody waits for
// (the caller gave up) is dropped.
func (c *caller) receive(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		c.resolve(d.CorrelationId, callResult{reply: d})
	}
}

// returned fails a call whose request the broker could not route: no
// server ever declared the tool.
func (c *caller) returned(returns <-chan amqp.Return) {
	for r := range returns {
		c.resolve(r.CorrelationId, callResult{err: sdk.ErrNoServer})
	}
}

func (c *caller) resolve(id string, res callResult) {
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ok {
		ch <- res // buffered 1, and only one resolve finds it
	}
}

// watch fails every call in flight, and every later one, once either
// channel is gone: the broker or the connection went away.
func (c *caller) watch(pubClosed, repliesClosed <-chan *amqp.Error) {
	var err *amqp.Error
	select {
	case err = <-pubClosed:
	case err = <-repliesClosed:
	}
	lost := wire.ErrConnectionLost
	if err == nil {
		lost = sdk.ErrClosed
	}
	c.mu.Lock()
	c.lost = lost
	pending := c.pending
	c.pending = make(map[string]chan callResult)
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- callResult{err: lost}
	}
}

func (c *caller) close() {
	c.pub.Close()
	c.replies.Close()
	c.checkMu.Lock()
	if c.check != nil {
		c.check.Close()
	}
	c.checkMu.Unlock()
}

// hasServer reports whether tool's serve queue exists and has a consumer,
// trusting a positive answer for serverCheckTTL unless fresh is set. A
// fresh answer is one at most half a recheck period old: however many
// calls wait on a tool, the broker is asked about it about twice per
// recheck period, not once per call.
func (c *caller) hasServer(tool string, fresh bool) (bool, error) {
	c.checkMu.Lock()
	defer c.checkMu.Unlock()
	if seen, ok := c.served[tool]; ok && !fresh && time.Since(seen) < serverCheckTTL {
		return true, nil
	}
	if last, ok := c.checked[tool]; ok && fresh && time.Since(last.at) < serverRecheck/2 {
		return last.served, nil
	}
	served, err := c.askServer(tool)
	if err == nil {
		c.checked[tool] = serverCheck{at: time.Now(), served: served}
		c.pruneChecks(time.Now())
	}
	return served, err
}

// maxServerChecks bounds the tools whose server checks a node keeps: a
// module calling ever new tool names must not grow the node's memory.
const maxServerChecks = 4096

// pruneChecks drops, past maxServerChecks tools, the checks too old to be
// used, and if that is not enough, all of them (they are a cache).
// checkMu is held.
func (c *caller) pruneChecks(now time.Time) {
	if len(c.checked) <= maxServerChecks && len(c.served) <= maxServerChecks {
		return
	}
	for tool, last := range c.checked {
		if now.Sub(last.at) >= serverRecheck/2 {
			delete(c.checked, tool)
		}
	}
	for tool, seen := range c.served {
		if now.Sub(seen) >= serverCheckTTL {
			delete(c.served, tool)
		}
	}
	if len(c.checked) > maxServerChecks || len(c.served) > maxServerChecks {
		clear(c.checked)
		clear(c.served)
	}
}

// askServer asks the broker whether tool's serve queue has a consumer.
// checkMu is held.
func (c *caller) askServer(tool string) (bool, error) {
	c.node.stats.serverChecks.Add(1)
	if c.check == nil || c.check.IsClosed() {
		ch, err := c.sess.subConn.Channel()
		if err != nil {
			return false, fmt.Errorf("%w: open check channel: %v", wire.ErrConnectionLost, err)
		}
		c.check = ch
	}
	q, err := c.check.QueueDeclarePassive(wire.ServeQueue(tool), true, false, false, false, nil)
	if isAMQPCode(err, amqp.NotFound) {
		c.check = nil // the 404 closed it
		delete(c.served, tool)
		return false, nil
	}
	if err != nil {
		c.check = nil
		return false, fmt.Errorf("check servers of %s: %w", tool, err)
	}
	if q.Consumers == 0 {
		delete(c.served, tool)
		return false, nil
	}
	c.served[tool] = time.Now()
	return true, nil
}

func isAMQPCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// call makes one tool call on behalf of source. id is the request's id,
// or "" for one derived from the handling in ctx (source being the
// calling module), or fresh outside a handling.
func (n *Node) call(ctx context.Context, source, tool string, req, resp any, id string) (err error) {
	if err := wire.ValidateToolKey(tool); err != nil {
		return fmt.Errorf("call: %w", err)
	}
	start := time.Now()
	defer func() { n.recordCall(start, tool, callOutcome(err)) }()
	body, err := n.encodeBody(req)
	if err != nil {
		return fmt.Errorf("call %s: %w", tool, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(n.cfg.CallTimeout)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := n.caller(ctx)
	if err != nil {
		return fmt.Errorf("call %s: %w", tool, err)
	}
	if served, err := c.hasServer(tool, false); err != nil {
		return fmt.Errorf("call %s: %w", tool, err)
	} else if !served {
		return fmt.Errorf("call %s: %w", tool, sdk.ErrNoServer)
	}

	now := time.Now().UTC()
	remaining := time.Until(deadline)
	if remaining < time.Millisecond {
		return fmt.Errorf("call %s: no time left before the deadline: %w", tool, context.DeadlineExceeded)
	}
	if id == "" {
		id, _ = causation.Derive(ctx, source, causation.KindCall, tool, body)
	}
	if id == "" {
		id = newID(now)
	}
	headers := amqp.Table{
		wire.HeaderEventID:  id,
		wire.HeaderSource:   source,
		wire.HeaderNode:     n.cfg.Node,
		wire.HeaderTime:     now.Format(time.RFC3339Nano),
		wire.HeaderDeadline: deadline.UTC().Format(time.RFC3339Nano),
	}
	if cause := causation.From(ctx); cause != "" {
		headers[wire.HeaderCausationID] = cause
	}
	ctx, span := n.startCall(ctx, tool, id)
	defer func() { endSpan(span, err) }()
	injectTrace(ctx, headers)
	result := make(chan callResult, 1)
	c.mu.Lock()
	if c.lost != nil {
		c.mu.Unlock()
		return fmt.Errorf("call %s: %w", tool, c.lost)
	}
	// The reply is matched by a correlation id of this call alone, not
	// by the request id: two calls with the same id (a module naming
	// another's) each get their own reply.
	correlation := newID(now)
	c.pending[correlation] = result
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, correlation)
		c.mu.Unlock()
	}()
	err = c.pub.Publish(wire.ExchangeRPC, tool, true, false, amqp.Publishing{
		Headers:       headers,
		ContentType:   wire.ContentTypeJSON,
		DeliveryMode:  amqp.Transient, // docs/adr/0007-rpc-wire.md: a request outliving its caller is useless
		CorrelationId: correlation,
		ReplyTo:       c.replyQueue,
		UserId:        n.userID, // the broker checks it: the serving node's callers rely on it
		Expiration:    strconv.FormatInt(max(remaining.Milliseconds(), 1), 10),
		MessageId:     id,
		Timestamp:     now,
		Body:          body,
	})
	if err != nil {
		return fmt.Errorf("call %s: %w: %v", tool, wire.ErrConnectionLost, err)
	}

	recheck := time.NewTicker(serverRecheck)
	defer recheck.Stop()
	for {
		select {
		case res := <-result:
			if res.err != nil {
				return fmt.Errorf("call %s: %w", tool, res.err)
			}
			noteAnswerer(ctx, res.reply)
			return decodeReply(tool, res.reply, resp)
		case <-recheck.C:
			// A server that stopped after the call was sent leaves the
			// request in its queue: say so now, not at the deadline.
			if served, err := c.hasServer(tool, true); err == nil && !served {
				return fmt.Errorf("call %s: %w (the servers stopped)", tool, sdk.ErrNoServer)
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("call %s: no answer within %v: %w", tool, remaining.Round(time.Millisecond), context.DeadlineExceeded)
			}
			return fmt.Errorf("call %s: %w", tool, ctx.Err())
		}
	}
}

// decodeReply turns a reply into the response or the tool's error.
func decodeReply(tool string, d amqp.Delivery, resp any) error {
	status, _ := d.Headers[wire.HeaderStatus].(string)
	switch status {
	case wire.StatusOK:
		if resp == nil {
			return nil
		}
		if err := json.Unmarshal(d.Body, resp); err != nil {
			return fmt.Errorf("call %s: decode response: %w", tool, err)
		}
		return nil
	case wire.StatusError:
		code, _ := d.Headers[wire.HeaderErrorCode].(string)
		msg, _ := d.Headers[wire.HeaderErrorMessage].(string)
		permanent, _ := d.Headers[wire.HeaderErrorPermanent].(bool)
		return fmt.Errorf("call %s: %w", tool, &sdk.ToolError{Code: code, Message: msg, Permanent: permanent})
	default:
		return fmt.Errorf("call %s: %w", tool, &sdk.ToolError{Code: wire.CodeInvalidRequest,
			Message: fmt.Sprintf("the reply's %s is %q, want %q or %q", wire.HeaderStatus, status, wire.StatusOK, wire.StatusError), Permanent: true})
	}
}
