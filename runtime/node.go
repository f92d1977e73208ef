package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Node is a mesh node: it owns the broker connections and topology, and
// runs modules in-process. It is safe for concurrent use.
type Node struct {
	cfg      Config
	log      *slog.Logger
	pubConn  *amqp.Connection // publishes only: broker flow control on it never stalls acks
	subConn  *amqp.Connection // consumes: one channel per module
	pub      *publisher
	bindings bindingRecord

	mu      sync.Mutex
	modules map[string]*Module
	plugins []*PluginModule
	closed  bool

	callerMu sync.Mutex
	calls    *caller // made on the first call

	done     chan struct{} // closed when a broker connection is lost
	doneOnce sync.Once
	doneErr  error
}

// New connects to the broker, declares and verifies the topology, and
// returns a node ready to load modules and emit.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	cfg.withDefaults()
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.Node),
		bindings: bindingRecord{dir: cfg.StateDir},
		modules:  make(map[string]*Module),
		done:     make(chan struct{}),
	}
	var err error
	if n.pubConn, err = dial(ctx, cfg, "publish"); err != nil {
		return nil, err
	}
	if n.subConn, err = dial(ctx, cfg, "consume"); err != nil {
		n.pubConn.Close()
		return nil, err
	}
	ch, err := n.pubConn.Channel()
	if err == nil {
		err = declareTopology(ch)
		ch.Close()
	}
	if err == nil {
		n.pub, err = newPublisher(n.pubConn)
	}
	if err != nil {
		n.pubConn.Close()
		n.subConn.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.Node, err)
	}
	go n.watch(n.pubConn, "publish")
	go n.watch(n.subConn, "consume")
	n.log.Info("node connected", "broker", redactURL(cfg.AMQPURL))
	return n, nil
}

// watch reports the loss of a broker connection through Done. The node does
// not reconnect yet: a supervisor (systemd, meshd's caller) restarts it.
func (n *Node) watch(conn *amqp.Connection, role string) {
	err, ok := <-conn.NotifyClose(make(chan *amqp.Error, 1))
	if !ok || err == nil {
		return // closed by Close
	}
	n.log.Error("broker connection lost", "connection", role, "err", err)
	n.doneOnce.Do(func() {
		n.doneErr = fmt.Errorf("broker connection (%s) lost: %w", role, err)
		close(n.done)
	})
}

// Done is closed when the node can no longer work because a broker
// connection was lost; Err then says why. It is not closed by Close.
func (n *Node) Done() <-chan struct{} { return n.done }

// Err returns why Done was closed, or nil.
func (n *Node) Err() error {
	select {
	case <-n.done:
		return n.doneErr
	default:
		return nil
	}
}

func dial(ctx context.Context, cfg Config, role string) (*amqp.Connection, error) {
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("mesh " + cfg.Node + " " + role)
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: props,
		Dial:       amqp.DefaultDial(timeout),
	})
	if err != nil {
		// amqp091-go errors do not carry the URL, so err is safe to show.
		return nil, fmt.Errorf("connect to broker %s (%s): %w", redactURL(cfg.AMQPURL), role, err)
	}
	return conn, nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Node }

// Close stops every module (see Module.Stop), ends the module processes,
// and closes the connections.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	plugins := n.plugins
	n.mu.Unlock()
	var errs []error
	for _, pm := range plugins { // their modules first, then their processes
		errs = append(errs, pm.Stop(ctx))
	}
	n.mu.Lock()
	mods := make([]*Module, 0, len(n.modules))
	for _, m := range n.modules {
		mods = append(mods, m)
	}
	n.mu.Unlock()
	for _, m := range mods {
		errs = append(errs, m.Stop(ctx))
	}
	n.callerMu.Lock()
	if n.calls != nil {
		n.calls.close()
	}
	n.callerMu.Unlock()
	errs = append(errs, n.pub.close())
	errs = append(errs, n.subConn.Close(), n.pubConn.Close())
	return errors.Join(ignoreClosed(errs)...)
}

func ignoreClosed(errs []error) []error {
	out := errs[:0]
	for _, err := range errs {
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			out = append(out, err)
		}
	}
	return out
}

// Call invokes a tool with source as the caller (x-source); see
// sdk.Mesh.Call. It is the operator's way to call (meshctl call); modules
// call through their sdk.Mesh.
func (n *Node) Call(ctx context.Context, source, tool string, req, resp any) error {
	if err := wire.ValidateWord("source", source); err != nil {
		return err
	}
	return n.call(ctx, source, tool, req, resp)
}

// Emit publishes an event of any full type (module., mesh. or node.
// origin) with source as its x-source. It is the operator's and the node's
// own way to emit; modules emit through their sdk.Mesh, which confines
// them to their namespace.
func (n *Node) Emit(ctx context.Context, source, eventType string, body any, opts ...sdk.EmitOption) (string, error) {
	if err := wire.ValidateWord("source", source); err != nil {
		return "", err
	}
	if err := wire.ValidateEventType(eventType); err != nil {
		return "", err
	}
	o, err := sdk.ApplyEmitOptions(opts...)
	if err != nil {
		return "", err
	}
	return n.emit(ctx, source, eventType, body, o)
}

// emit publishes a validated event and waits for its confirm.
func (n *Node) emit(ctx context.Context, source, eventType string, body any, o wire.EmitOptions) (string, error) {
	raw, err := n.encodeBody(body)
	if err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	if o.CausationID == "" {
		o.CausationID = causation.From(ctx)
	}
	now := time.Now().UTC()
	id := newID(now)
	headers := amqp.Table{
		wire.HeaderEventID: id,
		wire.HeaderSource:  source,
		wire.HeaderNode:    n.cfg.Node,
		wire.HeaderTime:    now.Format(time.RFC3339Nano),
	}
	if o.CausationID != "" {
		headers[wire.HeaderCausationID] = o.CausationID
	}
	if o.Schema != "" {
		headers[wire.HeaderSchema] = o.Schema
	}
	msg := amqp.Publishing{
		Headers:      headers,
		ContentType:  wire.ContentTypeJSON,
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    now,
		Body:         raw,
	}
	if o.TTL > 0 {
		msg.Expiration = strconv.FormatInt(o.TTL.Milliseconds(), 10)
	}
	if o.HasPriority {
		msg.Priority = o.Priority
	}
	if err := n.pub.publish(ctx, wire.ExchangeEvents, eventType, msg); err != nil {
		return "", fmt.Errorf("emit %s: %w", eventType, err)
	}
	return id, nil
}

// newID returns a new ULID for an event or request made at now.
func newID(now time.Time) string {
	return ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
}

// encodeBody turns an emit's body into JSON: json.RawMessage and []byte
// are taken as JSON as they are, anything else is marshalled.
func (n *Node) encodeBody(body any) ([]byte, error) {
	var raw []byte
	switch b := body.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("%w: %v", sdk.ErrBodyNotJSON, err)
		}
	}
	if len(raw) > n.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", sdk.ErrBodyTooLarge, len(raw), n.cfg.MaxBodyBytes)
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%w: %d bytes are not valid JSON", sdk.ErrBodyNotJSON, len(raw))
	}
	return raw, nil
}
