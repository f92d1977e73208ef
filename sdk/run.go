package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
)

// Run serves m as a module process under meshd; it is the whole main of a
// module binary:
//
//	func main() { sdk.Run(mymodule.Module()) }
//
// Deliveries, outcomes and emits cross the process boundary in small
// batches. Run returns only if the process was not started by meshd, with
// an error saying so.
func Run(m Module) error {
	if os.Getenv(plugin.Handshake().MagicCookieKey) != plugin.Handshake().MagicCookieValue {
		return errors.New("this is a mesh module: meshd starts it (meshd run --config ...); it does not run on its own")
	}
	go exitWithParent(os.Getppid())
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: plugin.Handshake(),
		Plugins: plugin.Set(func(b *goplugin.GRPCBroker) pb.ModuleServer {
			return &moduleServer{module: m, broker: b, ready: make(chan struct{})}
		}),
		GRPCServer: goplugin.DefaultGRPCServer,
	})
	return nil
}

// exitWithParent ends the module process when meshd is gone (killed with
// SIGKILL, say): the process is then adopted by another parent, and an
// orphaned module has nobody to deliver to it. The broker redelivers what
// meshd had not acked.
func exitWithParent(parent int) {
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			fmt.Fprintln(os.Stderr, "meshd is gone; the module exits")
			os.Exit(0)
		}
	}
}

// moduleServer runs a module in its process for meshd.
type moduleServer struct {
	pb.UnimplementedModuleServer
	module Module
	broker *goplugin.GRPCBroker

	once     sync.Once
	handlers []Handler     // by pattern index
	tools    []ToolHandler // by tool index
	desc     *pb.Description
	descErr  error

	ready chan struct{} // closed once Start has connected the host
	host  pb.HostClient
	emits chan emitRequest
}

func (s *moduleServer) Describe(context.Context, *pb.Empty) (*pb.Description, error) {
	s.once.Do(func() {
		c := &collector{}
		if s.module.Setup != nil {
			s.descErr = s.module.Setup(&pluginMesh{server: s, collect: c})
		}
		s.handlers, s.tools = c.handlers, c.toolHandlers
		s.desc = &pb.Description{Name: s.module.Name, Kind: s.module.Kind, Emits: s.module.Emits, Calls: s.module.Calls,
			Patterns: c.patterns, Tools: c.tools, DuplicatesAllowed: c.duplicatesAllowed()}
	})
	return s.desc, s.descErr
}

func (s *moduleServer) Start(_ context.Context, req *pb.StartRequest) (*pb.Empty, error) {
	conn, err := s.broker.Dial(req.HostBrokerId)
	if err != nil {
		return nil, fmt.Errorf("dial the host: %w", err)
	}
	s.host = pb.NewHostClient(conn)
	s.emits = make(chan emitRequest, 1024)
	go s.batchEmits()
	close(s.ready)
	if s.module.Run != nil {
		go func() {
			if err := s.module.Run(context.Background(), &pluginMesh{server: s}); err != nil {
				fmt.Fprintf(os.Stderr, "module run ended with an error: %v\n", err)
			}
		}()
	}
	return &pb.Empty{}, nil
}

func (s *moduleServer) Deliver(stream pb.Module_DeliverServer) error {
	outcomes := make(chan *pb.Outcome, 256)
	done := make(chan struct{})
	defer close(done)
	var inflight atomic.Int64
	// Outcomes go back as soon as every delivery received is handled: the
	// host sends in batches, so they come back in batches.
	idle := func() bool { return inflight.Load() == 0 && len(outcomes) == 0 }
	go func() {
		for batch := range plugin.Batches(outcomes, done, idle) {
			if err := stream.Send(&pb.OutcomeBatch{Outcomes: batch}); err != nil {
				return
			}
		}
	}()
	for {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		inflight.Add(int64(len(b.Deliveries)))
		for _, d := range b.Deliveries {
			go func() {
				o := s.handle(d)
				inflight.Add(-1)
				outcomes <- o
			}()
		}
	}
}

func (s *moduleServer) handle(d *pb.Delivery) *pb.Outcome {
	if int(d.Pattern) >= len(s.handlers) {
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_PERMANENT, Error: fmt.Sprintf("no handler for pattern %d", d.Pattern)}
	}
	ev := Event{
		ID: d.Id, Type: d.Type, Source: d.Source, Node: d.Node, Time: time.Unix(0, d.TimeUnixNano).UTC(),
		CausationID: d.CausationId, Schema: d.Schema, Headers: d.Headers, Body: d.Body,
		Attempt: int(d.Attempt), Redelivered: d.Redelivered,
	}
	ctx, cancel := context.WithDeadline(causation.With(context.Background(), ev.ID), time.Unix(0, d.DeadlineUnixNano))
	defer cancel()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler panicked: %v", r)
			}
		}()
		return s.handlers[d.Pattern].HandleEvent(ctx, ev)
	}()
	switch {
	case err == nil:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_OK}
	case errors.Is(err, ErrPermanent):
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_PERMANENT, Error: err.Error()}
	default:
		return &pb.Outcome{Seq: d.Seq, Kind: pb.Outcome_FAILED, Error: err.Error()}
	}
}

type emitRequest struct {
	emit   *pb.Emit
	result chan emitResult
}

type emitResult struct {
	id  string
	err error
}

// batchEmits sends the module's emits to the host in batches.
func (s *moduleServer) batchEmits() {
	for batch := range plugin.Batches(s.emits, make(chan struct{}), nil) {
		req := &pb.EmitBatch{Emits: make([]*pb.Emit, len(batch))}
		for i, e := range batch {
			req.Emits[i] = e.emit
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		res, err := s.host.Emit(ctx, req)
		cancel()
		for i, e := range batch {
			switch {
			case err != nil:
				e.result <- emitResult{err: fmt.Errorf("%w: %v", ErrConnectionLost, err)}
			case i >= len(res.Results):
				e.result <- emitResult{err: errors.New("the host answered fewer emits than it was sent")}
			default:
				r := res.Results[i]
				e.result <- emitResult{id: r.Id, err: errorOf(r.ErrorKind, r.Error)}
			}
		}
	}
}

// errorOf gives back the sdk error the host reported, so errors.Is works
// as in-process.
func errorOf(kind pb.ErrorKind, msg string) error {
	var sentinel error
	switch kind {
	case pb.ErrorKind_NONE:
		return nil
	case pb.ErrorKind_INVALID_NAME:
		sentinel = ErrInvalidName
	case pb.ErrorKind_BODY_TOO_LARGE:
		sentinel = ErrBodyTooLarge
	case pb.ErrorKind_BODY_NOT_JSON:
		sentinel = ErrBodyNotJSON
	case pb.ErrorKind_REFUSED:
		sentinel = ErrRefused
	case pb.ErrorKind_UNROUTABLE:
		sentinel = ErrUnroutable
	case pb.ErrorKind_CLOSED:
		sentinel = ErrClosed
	case pb.ErrorKind_CONNECTION_LOST:
		sentinel = ErrConnectionLost
	case pb.ErrorKind_NO_SERVER:
		sentinel = ErrNoServer
	case pb.ErrorKind_DEADLINE_EXCEEDED:
		sentinel = ErrDeadlineExceeded
	case pb.ErrorKind_BACK_PRESSURE:
		sentinel = ErrBackPressure
	case pb.ErrorKind_FORBIDDEN:
		sentinel = ErrForbidden
	default:
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %w", msg, sentinel)
}

// collector records what Setup subscribes and serves, in order.
type collector struct {
	patterns     []string
	handlers     []Handler
	tools        []string
	toolHandlers []ToolHandler
}

// duplicatesAllowed lists the indexes of the handlers marked
// AllowDuplicates.
func (c *collector) duplicatesAllowed() []uint32 {
	var idx []uint32
	for i, h := range c.handlers {
		if DuplicatesAllowed(h) {
			idx = append(idx, uint32(i))
		}
	}
	return idx
}

// Answer runs one tool call: a ToolError goes back as it is, a panic as
// "internal", any other error without a code for the host to classify.
func (s *moduleServer) Answer(_ context.Context, r *pb.ToolRequest) (*pb.ToolAnswer, error) {
	if int(r.Tool) >= len(s.tools) {
		return &pb.ToolAnswer{IsError: true, Code: CodeInternal, Message: fmt.Sprintf("no tool %d", r.Tool), Permanent: true}, nil
	}
	req := Request{ID: r.Id, Tool: s.desc.Tools[r.Tool], Caller: r.Caller, Node: r.Node, Time: time.Unix(0, r.TimeUnixNano).UTC(),
		Deadline: time.Unix(0, r.DeadlineUnixNano), CausationID: r.CausationId, Headers: r.Headers, Body: r.Body}
	ctx, cancel := context.WithDeadline(causation.With(context.Background(), req.ID), req.Deadline)
	defer cancel()
	resp, err := func() (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = &ToolError{Code: CodeInternal, Message: fmt.Sprintf("handler panicked: %v", p), Permanent: true}
			}
		}()
		return s.tools[r.Tool].HandleCall(ctx, req)
	}()
	if err == nil {
		var body []byte
		if body, err = toJSON(resp); err == nil {
			return &pb.ToolAnswer{Body: body}, nil
		}
		err = &ToolError{Code: CodeInternal, Message: "encode response: " + err.Error(), Permanent: true}
	}
	var te *ToolError
	if errors.As(err, &te) {
		return &pb.ToolAnswer{IsError: true, Code: te.Code, Message: te.Message, Permanent: te.Permanent}, nil
	}
	// No code: the host gives it one by the same rules as in-process.
	return &pb.ToolAnswer{IsError: true, Message: err.Error(), Permanent: errors.Is(err, ErrPermanent)}, nil
}

// pluginMesh is a module's Mesh inside its own process: emits and calls go
// to meshd, which publishes them under the module's name.
type pluginMesh struct {
	server  *moduleServer
	collect *collector // set only while Setup runs
}

func (pm *pluginMesh) Emit(ctx context.Context, name string, body any, opts ...EmitOption) (string, error) {
	o, err := ApplyEmitOptions(opts...)
	if err != nil {
		return "", err
	}
	raw, err := toJSON(body)
	if err != nil {
		return "", fmt.Errorf("emit %s: %w", name, err)
	}
	if o.CausationID == "" {
		o.CausationID = causation.From(ctx)
	}
	e := &pb.Emit{Name: name, Body: raw, Schema: o.Schema, CausationId: o.CausationID,
		TtlMillis: o.TTL.Milliseconds(), Priority: uint32(o.Priority), HasPriority: o.HasPriority, FullType: o.FullType}
	select {
	case <-pm.server.ready:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	req := emitRequest{emit: e, result: make(chan emitResult, 1)}
	select {
	case pm.server.emits <- req:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-req.result:
		return r.id, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func toJSON(body any) ([]byte, error) {
	switch b := body.(type) {
	case json.RawMessage:
		return b, nil
	case []byte:
		return b, nil
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBodyNotJSON, err)
	}
	return raw, nil
}

func (pm *pluginMesh) On(pattern string, h Handler) error {
	if pm.collect == nil {
		return fmt.Errorf("on %q: %w", pattern, ErrAlreadyStarted)
	}
	if err := wire.ValidatePattern(pattern); err != nil {
		return fmt.Errorf("on: %w", err)
	}
	pm.collect.patterns = append(pm.collect.patterns, pattern)
	pm.collect.handlers = append(pm.collect.handlers, h)
	return nil
}

func (pm *pluginMesh) Call(ctx context.Context, tool string, req, resp any) error {
	raw, err := toJSON(req)
	if err != nil {
		return fmt.Errorf("call %s: %w", tool, err)
	}
	select {
	case <-pm.server.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	r, err := pm.server.host.Call(ctx, &pb.CallRequest{Tool: tool, Body: raw, DeadlineUnixNano: deadline.UnixNano(), CausationId: causation.From(ctx)})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("call %s: %w", tool, ErrDeadlineExceeded)
		}
		return fmt.Errorf("call %s: %w: %v", tool, ErrConnectionLost, err)
	}
	switch r.ErrorKind {
	case pb.ErrorKind_NONE:
		if resp == nil {
			return nil
		}
		return json.Unmarshal(r.Body, resp)
	case pb.ErrorKind_TOOL:
		return fmt.Errorf("call %s: %w", tool, &ToolError{Code: r.ToolCode, Message: r.Error, Permanent: r.ToolPermanent})
	default:
		return errorOf(r.ErrorKind, r.Error)
	}
}

func (pm *pluginMesh) Serve(tool string, h ToolHandler) error {
	if pm.collect == nil {
		return fmt.Errorf("serve %q: %w", tool, ErrAlreadyStarted)
	}
	if err := wire.ValidateToolKey(tool); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if h == nil {
		return fmt.Errorf("serve %q: handler is nil", tool)
	}
	pm.collect.tools = append(pm.collect.tools, tool)
	pm.collect.toolHandlers = append(pm.collect.toolHandlers, h)
	return nil
}

// processLogger writes JSON lines in hclog's shape to stderr, which
// go-plugin in meshd reads, parses and logs at their level.
var processLogger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{
	Level: slog.LevelDebug,
	ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.TimeKey:
			return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
		case slog.LevelKey:
			return slog.String("@level", strings.ToLower(a.Value.String()))
		case slog.MessageKey:
			return slog.String("@message", a.Value.String())
		}
		return a
	},
}))

func (pm *pluginMesh) Logger() *slog.Logger { return processLogger }
