package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshkit/mesh/internal/causation"
	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// The host service: what a module process calls back (Emit, Call,
// ReportOutbox, Hold), on the one callback server start hands it. The
// invariants:
//
//   - The process acts as its module and nothing else: it emits and calls
//     as the module, so x-source and x-node are the host's, names stay in
//     the module's namespace and its grants apply, whatever the process
//     sends; it reports only its own module's outbox.
//   - Ids are the host's: an emit's or call's id is derived in the handling
//     the process names by its token (inHandling), or, for a row of the
//     module's outbox (plugin.ProtocolOutbox on), from the module's name
//     and the row's ref; fresh outside a handling. The id the process sent
//     is never used, and a token the host does not know is refused when the
//     process asked for a derived id.
//   - An emit batch holds plugin.MaxBatch emits at most (a larger one is
//     refused whole, as a gRPC error), published by as many goroutines at
//     most.
//   - Otherwise a refused emit, call or hold is answered as a result naming
//     the sdk sentinel it wraps (errorKind), not as a gRPC error.

// hostServer is the callback service a module process calls: it emits and
// calls as the module, so x-source and x-node are the host's, and names
// stay in the module's namespace whatever the process sends.
type hostServer struct {
	pb.UnimplementedHostServer
	pm *PluginModule
}

// Emit publishes a batch of the process's emits as the module. The ids
// are the host's: for a row of the module's outbox (protocol 8 on),
// derived from the module's name and the row's ref; otherwise derived in
// the handling the process names by its token, if the process asked for a
// derived id (a non-empty Id, whose value is not used), fresh outside a
// handling; a token the host does not know is refused.
// A batch holds plugin.MaxBatch emits at most, published by as many
// goroutines at most.
func (h *hostServer) Emit(ctx context.Context, b *pb.EmitBatch) (*pb.EmitResults, error) {
	if len(b.Emits) > plugin.MaxBatch {
		h.pm.log.Warn("emit batch over the limit refused", "emits", len(b.Emits), "limit", plugin.MaxBatch)
		return nil, status.Errorf(codes.ResourceExhausted, "an emit batch holds %d emits at most, not %d", plugin.MaxBatch, len(b.Emits))
	}
	m := h.pm.module
	res := &pb.EmitResults{Results: make([]*pb.EmitResult, len(b.Emits))}
	var wg sync.WaitGroup
	for i, e := range b.Emits {
		wg.Add(1)
		go func() { // the batch's publishes pipeline on the confirm channel
			defer wg.Done()
			o := wire.EmitOptions{Schema: e.Schema, CausationID: e.CausationId, TTL: time.Duration(e.TtlMillis) * time.Millisecond,
				Priority: uint8(min(e.Priority, 255)), HasPriority: e.HasPriority,
				FullType:   e.FullType, // still subject to the module's grants
				FreshID:    e.Id == "",
				AtMostOnce: e.AtMostOnce,
			}
			if e.HasKey && h.pm.Protocol() >= plugin.ProtocolKeys {
				o.Key, o.HasKey = e.Key, true
			}
			o.After, o.At = plugin.TimingFrom(e.AfterMillis, e.AtUnixMillis)
			if e.Outbox && h.pm.Protocol() >= plugin.ProtocolOutbox {
				// The id is derived from the module's name, which the host
				// knows, and the row's ref: e.Id is not used.
				o.Outbox = &causation.OutboxRef{Scope: e.OutboxScope, N: e.OutboxN, Time: time.UnixMilli(e.OutboxUnixMillis)}
				e.Handling = 0
			}
			hctx, err := h.pm.inHandling(ctx, e.Handling, e.CausationId, e.Id != "")
			id := ""
			if err == nil {
				err = o.Check()
			}
			if err == nil {
				id, err = m.emit(hctx, e.Name, json.RawMessage(e.Body), o, "")
			}
			res.Results[i] = &pb.EmitResult{Id: id, ErrorKind: errorKind(err)}
			if err != nil {
				res.Results[i].Error = err.Error()
				h.pm.log.Warn("emit from the module refused", "name", truncateText(e.Name, 300), "err", err)
			}
		}()
	}
	wg.Wait()
	return res, nil
}

func (h *hostServer) Call(ctx context.Context, r *pb.CallRequest) (*pb.CallResponse, error) {
	ctx, cancel := context.WithDeadline(ctx, time.Unix(0, r.DeadlineUnixNano))
	defer cancel()
	// The request id is the host's: derived from the handling the process
	// names, fresh outside one (r.Id, the process's own derivation, is not
	// used).
	ctx, err := h.pm.inHandling(ctx, r.Handling, r.CausationId, r.Id != "")
	var resp json.RawMessage
	if err == nil {
		err = h.pm.module.callTool(ctx, r.Tool, json.RawMessage(r.Body), &resp, "")
	}
	out := &pb.CallResponse{Body: resp, ErrorKind: errorKind(err)}
	if err != nil {
		out.Error = err.Error()
		var te *sdk.ToolError
		if errors.As(err, &te) {
			out.Error, out.ToolCode, out.ToolPermanent = te.Message, te.Code, te.Permanent
		}
	}
	return out, nil
}

// ReportOutbox keeps the backlog the process's outbox relay reports, for
// the node's metrics; a process can only report its own module's.
func (h *hostServer) ReportOutbox(_ context.Context, r *pb.OutboxReport) (*pb.Empty, error) {
	s := wire.OutboxStats{Unsent: max(r.Unsent, 0), SetAside: max(r.SetAside, 0), RelayErrors: r.RelayErrors}
	if r.OldestUnixNano > 0 {
		s.Oldest = time.Unix(0, r.OldestUnixNano)
	}
	h.pm.module.counts.outbox.Store(&s)
	return &pb.Empty{}, nil
}

func (h *hostServer) Hold(ctx context.Context, r *pb.HoldRequest) (*pb.HoldResponse, error) {
	err := h.pm.module.mesh.Hold(r.Queue, r.Held)
	if err != nil {
		return &pb.HoldResponse{ErrorKind: errorKind(err), Error: err.Error()}, nil
	}
	return &pb.HoldResponse{}, nil
}

// errorKind names the sdk sentinel err wraps, for the module process: a
// tool's error, or one of the table's (plugin.KindOf).
func errorKind(err error) pb.ErrorKind {
	var te *sdk.ToolError
	if errors.As(err, &te) {
		return pb.ErrorKind_TOOL
	}
	return plugin.KindOf(err)
}
