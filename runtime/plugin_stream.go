package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/tracecontext"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// The delivery stream: events, dead letters and history batches cross to
// the module process as deliveries, and their outcomes come back; tool
// calls cross as one unary call each (answer). The invariants:
//
//   - Every delivery sent is in its process's pending, by its seq, until
//     its outcome arrives (receive hands it over and deletes it) or its
//     handling gives up (its deadline, or the process gone).
//   - outcomesDue counts outcomes handed over to their handlings and not
//     yet taken: receive counts a whole batch due before the first
//     handling can take its outcome; a handling takes one off as it takes
//     its outcome, or, for one handed over as it gave up, as it gives up.
//     An outcome whose seq is no longer pending (one the process sent
//     twice) is never handed over and not left counted.
//   - Deliveries go out in batches that end with their burst, or at once
//     when the window is full: every delivery the window allows is pending
//     and none is left to send.
//   - Every delivery and tool call is made in a handling (its token),
//     begun before it is sent and ended when its handler returns.
//   - A delivery goes to the process now running, waiting while it
//     restarts (current); the process going away (exited) fails the
//     deliveries waiting on it with a processCrash that says whether each
//     was alone in the process: only those are charged an attempt, the
//     others go back uncharged as suspects (isolation.go).
//   - Text from the process is bounded before the host logs, stores or
//     passes it on: its error texts by maxModuleErrorText, a tool's error
//     code by 64 bytes.

// maxModuleErrorText bounds an error text from a module process where the
// host logs, stores or passes it on.
const maxModuleErrorText = 4096

// forward is the in-process handler of pattern i (i = the number of
// patterns: the DeadLetters handler; past it, the consumed queues): it
// hands the event to the module process and waits for its outcome.
func (pm *PluginModule) forward(i uint32) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		p, err := pm.current(ctx)
		if err != nil {
			return err
		}
		// Counted in the process before it is handed over: if the process
		// exits, the count then says whether this event was alone in it.
		p.mu.Lock()
		if p.ended {
			p.mu.Unlock()
			return &processCrash{exit: p.exitStatus()}
		}
		p.events++
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.events--
			p.mu.Unlock()
		}()
		token, end := pm.handlings.begin(ctx)
		defer end()
		deadline, _ := ctx.Deadline()
		d := plugin.DeliveryOf(plugin.Event(ev), deadline)
		d.Handling, d.Seq, d.Pattern = token, p.seq.Add(1), i
		d.Traceparent, d.Tracestate = tracecontext.Inject(ctx)
		result := make(chan *pb.Outcome, 1)
		p.mu.Lock()
		p.pending[d.Seq] = result
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.pending, d.Seq)
			if len(result) > 0 {
				// Handed over as the handling gave up (its deadline, or
				// the process gone): never taken, no longer due.
				p.outcomesDue.Add(-1)
			}
			p.mu.Unlock()
		}()
		if err := p.hand(ctx, d); err != nil {
			if errors.Is(err, errExited) {
				return &processCrash{exit: p.exitStatus()}
			}
			return err
		}
		select {
		case o := <-result:
			p.outcomesDue.Add(-1)
			return handlerError(o)
		case <-p.exited:
			select {
			case o := <-result: // its outcome came before the end
				p.outcomesDue.Add(-1)
				return handlerError(o)
			default:
			}
			p.mu.Lock()
			others := p.eventsAtExit - 1
			p.mu.Unlock()
			return &processCrash{handed: true, others: others, exit: p.exitStatus()}
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// forwardHistory is the in-process History handler of a module process
// (delivery index i): each batch crosses as deliveries of one
// history_batch, which the process hands to its History.Handle in one
// call; the batch succeeded if every delivery's outcome is OK.
func (pm *PluginModule) forwardHistory(i uint32) func(context.Context, []sdk.Event) error {
	return func(ctx context.Context, events []sdk.Event) error {
		p, err := pm.current(ctx)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			// A process started again rewinds the history (and so ends
			// ctx) before it is current: a batch from before goes to it
			// never.
			return err
		}
		token, end := pm.handlings.begin(ctx)
		defer end()
		deadline, _ := ctx.Deadline()
		batch := p.seq.Add(1)
		result := make(chan *pb.Outcome, len(events))
		ds := make([]*pb.Delivery, len(events))
		p.mu.Lock()
		for k, ev := range events {
			d := plugin.DeliveryOf(plugin.Event(ev), deadline)
			d.Handling, d.Seq, d.Pattern = token, p.seq.Add(1), i
			d.HistoryBatch, d.HistoryBatchSize = batch, uint32(len(events))
			p.pending[d.Seq] = result
			ds[k] = d
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			for _, d := range ds {
				delete(p.pending, d.Seq)
			}
			p.outcomesDue.Add(-int64(len(result))) // handed over, never taken
			p.mu.Unlock()
		}()
		for _, d := range ds {
			if err := p.hand(ctx, d); err != nil {
				return err
			}
		}
		var failed error
		for range ds {
			select {
			case o := <-result:
				p.outcomesDue.Add(-1)
				if err := handlerError(o); err != nil && failed == nil {
					failed = err
				}
			case <-p.exited:
				return errors.New("module process exited while handling the history")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return failed
	}
}

// answer is the in-process handler of tool i: it runs the call in the
// module process. Calls are not batched: each is one unary gRPC call.
func (pm *PluginModule) answer(i uint32) sdk.ToolHandler {
	return sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
		p, err := pm.current(ctx)
		if err != nil {
			return nil, err
		}
		token, end := pm.handlings.begin(ctx)
		defer end()
		tr := plugin.ToolRequestOf(plugin.Request(req), i)
		tr.Handling = token
		tr.Traceparent, tr.Tracestate = tracecontext.Inject(ctx)
		a, err := p.remote.Module.Answer(ctx, tr)
		if err != nil {
			return nil, fmt.Errorf("module process: %w", err)
		}
		msg := truncateText(a.Message, maxModuleErrorText)
		switch {
		case a.IsError && a.Code != "":
			return nil, &sdk.ToolError{Code: truncateText(a.Code, 64), Message: msg, Permanent: a.Permanent}
		case a.IsError && a.Permanent:
			return nil, permanentText(msg) // toolError makes it "rejected", in the module's words
		case a.IsError:
			return nil, errors.New(msg) // and this "failed"
		}
		return json.RawMessage(a.Body), nil
	})
}

// hand queues d for the process's sender (send), unless the process
// exits or ctx ends first.
func (p *moduleProcess) hand(ctx context.Context, d *pb.Delivery) error {
	select {
	case p.sendq <- d:
		return nil
	case <-p.exited:
		return errExited
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errExited is hand's error when the process exited before the delivery
// was queued for it.
var errExited = errors.New("module process exited")

// send crosses deliveries in batches that end with their burst (at most a
// millisecond: docs/adr/0025-plugin-batches.md), or at once when the
// window is full: then nothing more can arrive until outcomes go back.
func (p *moduleProcess) send() {
	for batch := range plugin.Batches(p.sendq, p.exited, p.windowFull) {
		if err := p.stream.Send(&pb.DeliveryBatch{Deliveries: batch}); err != nil {
			return // receive sees the stream end and marks the process gone
		}
	}
}

// windowFull reports whether every delivery the window allows is waiting
// for its outcome and none is left to send.
func (p *moduleProcess) windowFull() bool {
	if len(p.sendq) > 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending) >= p.window
}

// exitErr says how the process ended, as far as the stream saw it.
func (p *moduleProcess) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streamErr
}

func (p *moduleProcess) receive() {
	defer close(p.exited)
	for {
		b, err := p.stream.Recv()
		if err != nil {
			p.mu.Lock()
			p.streamErr = err
			p.ended, p.eventsAtExit = true, p.events
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		// The whole batch is counted due before the first handling can
		// take its outcome: its worker, and the others woken with it,
		// then ack together.
		due := 0
		for _, o := range b.Outcomes {
			if _, ok := p.pending[o.Seq]; ok {
				due++
			}
		}
		p.outcomesDue.Add(int64(due))
		for _, o := range b.Outcomes {
			if ch, ok := p.pending[o.Seq]; ok {
				ch <- o
				delete(p.pending, o.Seq)
				due--
			}
		}
		p.outcomesDue.Add(-int64(due)) // a seq the process sent twice: counted, not handed over
		p.mu.Unlock()
	}
}

// handlerError is the handler's error a module process reported in o,
// in the process's words and of the same kind (execute.Of) as the error
// the handler returned: nil for OK.
func handlerError(o *pb.Outcome) error {
	text := truncateText(o.Error, maxModuleErrorText)
	switch o.Kind {
	case pb.Outcome_OK:
		return nil
	case pb.Outcome_PERMANENT:
		// The text of an error marked permanent (sdk.Permanent's says
		// "permanent: " itself; a permanent ToolError's does not): kept
		// as it is, as in-process.
		return permanentText(text)
	case pb.Outcome_FORBIDDEN:
		// An emit or call the host refused for want of a grant:
		// dead-lettered at once, as forbidden, in the process's words.
		return refusedGrant(text)
	case pb.Outcome_CONFLICT:
		// The handler's inbox holds the id with other content:
		// dead-lettered at once, reason conflict.
		return fmt.Errorf("%w: %s", wire.ErrConflict, text)
	}
	return errors.New(text)
}

// permanentText is a module process's error that was permanent (a handler's
// error marked sdk.Permanent, or a permanent ToolError; a tool's error with
// no code of its own that cannot succeed if called again): its text as the
// process sent it, and sdk.ErrPermanent to errors.Is.
type permanentText string

func (e permanentText) Error() string { return string(e) }

// Is reports sdk.ErrPermanent.
func (e permanentText) Is(target error) bool { return target == sdk.ErrPermanent }

// refusedGrant is a module process's handler error that was a refused
// grant: its text as the process sent it, and sdk.ErrForbidden to errors.Is,
// so the handling is dead-lettered at once as forbidden.
type refusedGrant string

func (e refusedGrant) Error() string { return string(e) }

// Is reports sdk.ErrForbidden.
func (e refusedGrant) Is(target error) bool { return target == sdk.ErrForbidden }
