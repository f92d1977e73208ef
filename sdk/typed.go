package sdk

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/meshkit/mesh/internal/wire"
)

// Typed is a Handler of events whose JSON body is a T: it decodes the body
// (with encoding/json; fields T does not have are ignored) and calls f
// with it. An event whose body does not decode into a T is a permanent
// failure, dead-lettered at once with the reason, never retried: a retry
// cannot make it decode. f's own errors are a Handler's.
func Typed[T any](f func(ctx context.Context, ev Event, body T) error) Handler {
	return HandlerFunc(func(ctx context.Context, ev Event) error {
		var body T
		if err := json.Unmarshal(ev.Body, &body); err != nil {
			return Permanent(fmt.Errorf("decode the body of %s event %s into %T: %w", ev.Type, ev.ID, body, err))
		}
		return f(ctx, ev, body)
	})
}

// TypedTool is a ToolHandler of requests whose JSON body is a Req,
// answered with a Resp (marshalled to JSON). A request that does not decode
// into a Req is answered with a permanent ToolError of code
// "invalid_request", without calling f. f's own errors are a
// ToolHandler's.
func TypedTool[Req, Resp any](f func(ctx context.Context, req Request, body Req) (Resp, error)) ToolHandler {
	return ToolHandlerFunc(func(ctx context.Context, req Request) (any, error) {
		var body Req
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return nil, &ToolError{Code: wire.CodeInvalidRequest, Permanent: true,
				Message: fmt.Sprintf("decode the request %s to %s into %T: %v", req.ID, req.Tool, body, err)}
		}
		return f(ctx, req, body)
	})
}

// TypedCall calls a tool through m, as m.Call does, and returns its
// response decoded into a Resp. Its errors are Call's; a response that
// does not decode into a Resp is returned as an error saying so, with the
// zero Resp.
func TypedCall[Resp any](ctx context.Context, m Mesh, tool string, req any) (Resp, error) {
	var raw json.RawMessage
	var resp Resp
	if err := m.Call(ctx, tool, req, &raw); err != nil {
		return resp, err
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return resp, fmt.Errorf("call %s: decode its response into %T: %w", tool, resp, err)
	}
	return resp, nil
}
