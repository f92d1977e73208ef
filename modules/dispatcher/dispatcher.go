// Package dispatcher is the dispatcher module: config-driven triggers
// that take work from an existing broker queue (consumed passively, never
// declared) or from events on the mesh, and hand each message to a tool,
// with bounded concurrency and honest ack semantics.
//
// Each message goes to the trigger's tool as one JSON request: the
// trigger's constant inputs, plus
//
//	"message": the body when it is JSON, else {"raw_body_b64": "..."}
//	"meta":    {"message_id", "routing_key", "source", "redelivered", "queue", "trigger", "attempt"}
//
// A CloudEvent (binary or structured mode, ADR 34) is read as one: its id
// is the message id, its type the routing key, its source the source, its
// data the message.
//
// and the outcome decides what the broker does with it:
//
//	the tool answered                          ack
//	the tool rejected it (a permanent error)   dead-letter at once, with the tool's code and message
//	timeout, overload, transport, no server    retry with back-off, bounded; then dead-letter
//	the target key is bad or not granted       dead-letter at once with that reason
//	its own deadline (x-deadline) has passed   dead-letter as expired, without calling the tool
//	                                             (for a queue, the node does it before the trigger sees it)
//
// The back-off of a retry is the node's, or the module entry's retry:
// ([1m, 10m, 1h]), whose steps of 10 s or more wait in the delay cascade
// without holding the message (ADR 32), on a queue trigger as on a
// pattern one.
//
// Never more than max_concurrent_runs calls of a trigger run at once.
// dispatcher.pause and dispatcher.resume (`meshctl dispatcher pause|resume
// TRIGGER`) stop and start a queue trigger at run time: its queue keeps its
// messages meanwhile, and a paused trigger stays paused across restarts.
// dispatcher.triggers lists the triggers with their state.
// Every firing is recorded durably (Store, pure-Go SQLite): trigger,
// message id, routing key, redelivered, attempt, outcome, detail, time;
// the tool dispatcher.fires and `meshctl dispatcher fires TRIGGER` read
// it. A message whose id the trigger already handled is not handed to
// the tool again: it gets its first outcome (recorded as "repeated"); the
// same id with another body is a conflict, dead-lettered.
//
// For each message the tool answered, the dispatcher emits
// module.<name>.fired, caused by the message (when its id is a ULID),
// with the trigger, the message id and the tool's response, so the
// audit log holds the chain.
//
// Triggers on a queue consume it with max_concurrent_runs as the
// prefetch. Triggers on a pattern share the module's queue: give the
// module a concurrency (and prefetch) of at least the sum of their
// max_concurrent_runs.
package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshkit/mesh/sdk"
)

// Tool keys the dispatcher serves.
const (
	ToolFires    = "dispatcher.fires"
	ToolPause    = "dispatcher.pause"
	ToolResume   = "dispatcher.resume"
	ToolTriggers = "dispatcher.triggers"
)

// Dispatcher runs the triggers of a Config.
type Dispatcher struct {
	cfg   Config
	fires *fires
	now   func() time.Time
}

// Open checks cfg and opens its firing record.
func Open(cfg Config) (*Dispatcher, error) {
	cfg.Triggers = append([]Trigger(nil), cfg.Triggers...)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	f, err := openFires(cfg.Store)
	if err != nil {
		return nil, err
	}
	return &Dispatcher{cfg: cfg, fires: f, now: time.Now}, nil
}

// Close closes the firing record. Stop the module first.
func (d *Dispatcher) Close() error { return d.fires.close() }

// Module is the dispatcher as an sdk module.
func (d *Dispatcher) Module() sdk.Module {
	var calls []string
	for _, t := range d.cfg.Triggers {
		calls = append(calls, t.Tool)
	}
	// Pausing a trigger stops work, and its firings tell what it handed
	// on: by default only the operator (meshctl) may call its tools; a
	// node config may grant more (callers:).
	callers := map[string][]string{"dispatcher.*": {"meshctl"}}
	return sdk.Module{Name: d.cfg.Name, Kind: "dispatcher", Emits: []string{"fired"}, Calls: calls, Callers: callers, Setup: func(m sdk.Mesh) error {
		paused, err := d.fires.paused(context.Background())
		if err != nil {
			return err
		}
		errs := []error{
			m.Serve(ToolFires, sdk.ToolHandlerFunc(d.listFires)),
			m.Serve(ToolPause, d.pauser(m, true)),
			m.Serve(ToolResume, d.pauser(m, false)),
			m.Serve(ToolTriggers, sdk.ToolHandlerFunc(d.listTriggers)),
		}
		for _, t := range d.cfg.Triggers {
			if !t.enabled() {
				m.Logger().Info("trigger disabled; it consumes nothing", "trigger", t.Name)
				continue
			}
			h := d.handler(t, m)
			if t.Queue != "" {
				errs = append(errs, m.Consume(t.Queue, t.MaxConcurrentRuns, h))
				if t.SingleActiveConsumer {
					errs = append(errs, m.Exclusive(t.Queue))
				}
				if paused[t.Name] {
					m.Logger().Info("trigger paused; its queue keeps its messages", "trigger", t.Name, "queue", t.Queue)
					errs = append(errs, m.Hold(t.Queue, true))
				}
			} else {
				errs = append(errs, m.On(t.Pattern, h))
			}
		}
		return errors.Join(errs...)
	}}
}

// Request is what a tool gets for one message: the trigger's inputs, plus
// Message and Meta.
type Request map[string]json.RawMessage

// Meta is a message's metadata in a request.
type Meta struct {
	MessageID string `json:"message_id,omitempty"`
	// RoutingKey is the event's type: the key it was routed by, or a
	// CloudEvent's type (ADR 34).
	RoutingKey string `json:"routing_key"`
	// Source is the event's emitter: x-source, or a CloudEvent's source.
	Source      string `json:"source,omitempty"`
	Redelivered bool   `json:"redelivered"`
	Queue       string `json:"queue,omitempty"`
	Trigger     string `json:"trigger"`
	Attempt     int    `json:"attempt"`
}

// request builds the tool's request for ev.
func request(t Trigger, ev sdk.Event) (Request, error) {
	req := make(Request, len(t.Inputs)+2)
	for k, v := range t.Inputs {
		req[k] = v
	}
	if json.Valid(ev.Body) {
		req["message"] = json.RawMessage(ev.Body)
	} else {
		raw, _ := json.Marshal(map[string]string{"raw_body_b64": base64.StdEncoding.EncodeToString(ev.Body)})
		req["message"] = raw
	}
	meta, err := json.Marshal(Meta{MessageID: ev.ID, RoutingKey: ev.Type, Source: ev.Source, Redelivered: ev.Redelivered, Queue: ev.Queue, Trigger: t.Name, Attempt: ev.Attempt})
	if err != nil {
		return nil, err
	}
	req["meta"] = meta
	return req, nil
}

// handler fires t for each message.
func (d *Dispatcher) handler(t Trigger, m sdk.Mesh) sdk.Handler {
	slots := make(chan struct{}, t.MaxConcurrentRuns)
	log := m.Logger().With("trigger", t.Name)
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-ctx.Done():
			return fmt.Errorf("trigger %s: %d runs busy until the handler's deadline: %w", t.Name, t.MaxConcurrentRuns, ctx.Err())
		}
		sum := sha256.Sum256(ev.Body)
		x := Fire{Trigger: t.Name, MessageID: ev.ID, RoutingKey: ev.Type, Redelivered: ev.Redelivered, Attempt: ev.Attempt, bodySum: hex.EncodeToString(sum[:])}
		outcome, detail, result := d.decide(ctx, t, m, ev, x)
		x.Outcome, x.Detail, x.Time = outcome, detail, d.now().UTC()
		if err := d.fires.add(context.WithoutCancel(ctx), x); err != nil {
			// Not acknowledged unrecorded: the message comes back.
			log.Error("firing not recorded; the message will come back", "message_id", ev.ID, "err", err)
			return err
		}
		if result != nil {
			log.Warn("trigger fired", "message_id", ev.ID, "outcome", outcome, "detail", detail)
		}
		if d.cfg.OnFire != nil {
			d.cfg.OnFire(x)
		}
		return result
	})
}

// decide fires t for ev unless the record or the message's deadline say
// otherwise, and returns the outcome, its detail and the handler's result.
func (d *Dispatcher) decide(ctx context.Context, t Trigger, m sdk.Mesh, ev sdk.Event, x Fire) (string, string, error) {
	if ev.ID != "" {
		first, found, err := d.fires.first(ctx, t.Name, ev.ID)
		if err != nil {
			return OutcomeFailed, err.Error(), err
		}
		if found {
			if first.bodySum != x.bodySum {
				detail := fmt.Sprintf("conflict: message id %s was handled (%s) with another body", ev.ID, first.Outcome)
				return OutcomeConflict, detail, sdk.Permanent(errors.New(detail))
			}
			detail := "already handled: " + first.Outcome
			if first.Outcome == OutcomeOK {
				return OutcomeRepeated, detail, nil
			}
			return OutcomeRepeated, detail, sdk.Permanent(fmt.Errorf("%s: %s", detail, first.Detail))
		}
	}
	if dl, ok := ev.Headers["x-deadline"]; ok {
		if deadline, err := time.Parse(time.RFC3339Nano, dl); err == nil && !d.now().Before(deadline) {
			detail := fmt.Sprintf("expired: its deadline %s passed before the dispatcher took it", dl)
			return OutcomeExpired, detail, sdk.Permanent(errors.New(detail))
		}
	}
	req, err := request(t, ev)
	if err != nil {
		return OutcomeRejected, err.Error(), sdk.Permanent(err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Duration(t.Timeout))
	defer cancel()
	var resp json.RawMessage
	err = m.Call(cctx, t.Tool, req, &resp)
	var te *sdk.ToolError
	switch {
	case err == nil:
		if _, eerr := m.Emit(ctx, "fired", map[string]any{"trigger": t.Name, "message_id": ev.ID, "tool": t.Tool, "response": resp}); eerr != nil {
			// The tool ran; the event saying so is not worth running it
			// again for.
			m.Logger().Warn("the fired event was not emitted", "trigger", t.Name, "message_id", ev.ID, "err", eerr)
		}
		return OutcomeOK, "", nil
	case errors.As(err, &te) && te.Permanent:
		detail := fmt.Sprintf("tool %s rejected it (%s): %s", t.Tool, te.Code, te.Message)
		return OutcomeRejected, detail, sdk.Permanent(errors.New(detail))
	case errors.Is(err, sdk.ErrInvalid), errors.Is(err, sdk.ErrForbidden):
		detail := fmt.Sprintf("target %s: %v", t.Tool, err)
		return OutcomeRejected, detail, sdk.Permanent(errors.New(detail))
	default:
		detail := fmt.Sprintf("tool %s: %v", t.Tool, err)
		return OutcomeFailed, detail, errors.New(detail)
	}
}

// PauseRequest is the request of dispatcher.pause and dispatcher.resume.
type PauseRequest struct {
	Trigger string `json:"trigger"`
}

// PauseResponse says what the trigger is now.
type PauseResponse struct {
	Trigger string `json:"trigger"`
	Paused  bool   `json:"paused"`
}

// pauser pauses (or resumes) a queue trigger: the node stops (or starts)
// consuming its queue, which keeps its messages meanwhile, and the state
// is recorded so that it holds across restarts. A pattern trigger shares
// the module's queue and cannot be paused alone.
func (d *Dispatcher) pauser(m sdk.Mesh, pause bool) sdk.ToolHandler {
	return sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
		var r PauseRequest
		if err := req.Decode(&r); err != nil {
			return nil, &sdk.ToolError{Code: "bad_request", Message: err.Error(), Permanent: true}
		}
		t, ok := d.trigger(r.Trigger)
		switch {
		case !ok:
			return nil, &sdk.ToolError{Code: "not_found", Message: fmt.Sprintf("no trigger %q", r.Trigger), Permanent: true}
		case t.Queue == "":
			return nil, &sdk.ToolError{Code: "bad_request", Permanent: true,
				Message: fmt.Sprintf("trigger %s takes events by pattern on the module's own queue, which it shares with the other pattern triggers: set enabled: false and reload instead", t.Name)}
		case !t.enabled():
			return nil, &sdk.ToolError{Code: "bad_request", Message: fmt.Sprintf("trigger %s is disabled in the config", t.Name), Permanent: true}
		}
		// Recorded first: if holding fails, a retry finds the same state.
		if err := d.fires.setPaused(ctx, t.Name, pause, d.now()); err != nil {
			return nil, err
		}
		if err := m.Hold(t.Queue, pause); err != nil {
			return nil, fmt.Errorf("trigger %s: %w", t.Name, err)
		}
		m.Logger().Info("trigger paused or resumed", "trigger", t.Name, "paused", pause)
		return PauseResponse{Trigger: t.Name, Paused: pause}, nil
	})
}

// FiresRequest is dispatcher.fires' request: a trigger ("" for all) and
// a page.
type FiresRequest struct {
	Trigger string `json:"trigger,omitempty"`
	After   int64  `json:"after,omitempty"`
	Limit   int    `json:"limit,omitempty"`
}

// FiresResponse is a page of the record and the next cursor (0 at the
// end).
type FiresResponse struct {
	Fires []Fire `json:"fires"`
	Next  int64  `json:"next,omitempty"`
}

func (d *Dispatcher) listFires(ctx context.Context, req sdk.Request) (any, error) {
	var r FiresRequest
	if len(req.Body) > 0 {
		if err := req.Decode(&r); err != nil {
			return nil, &sdk.ToolError{Code: "bad_request", Message: err.Error(), Permanent: true}
		}
	}
	if r.Trigger != "" && !d.hasTrigger(r.Trigger) {
		return nil, &sdk.ToolError{Code: "not_found", Message: fmt.Sprintf("no trigger %q", r.Trigger), Permanent: true}
	}
	list, next, err := d.fires.list(ctx, r.Trigger, r.After, r.Limit)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []Fire{}
	}
	return FiresResponse{Fires: list, Next: next}, nil
}

// TriggerState is a trigger as dispatcher.triggers tells of it: its
// config and whether it consumes now.
type TriggerState struct {
	Name              string `json:"name"`
	Queue             string `json:"queue,omitempty"`
	Pattern           string `json:"pattern,omitempty"`
	Tool              string `json:"tool"`
	MaxConcurrentRuns int    `json:"max_concurrent_runs"`
	// Enabled is false for a trigger the config disables; Paused is true
	// for a queue trigger paused at run time (dispatcher.pause).
	Enabled bool `json:"enabled"`
	Paused  bool `json:"paused"`
	// CanPause says dispatcher.pause applies: an enabled queue trigger.
	CanPause bool `json:"can_pause"`
}

// TriggersResponse is dispatcher.triggers' response, in config order.
type TriggersResponse struct {
	Triggers []TriggerState `json:"triggers"`
}

func (d *Dispatcher) listTriggers(ctx context.Context, _ sdk.Request) (any, error) {
	paused, err := d.fires.paused(ctx)
	if err != nil {
		return nil, err
	}
	out := TriggersResponse{Triggers: []TriggerState{}}
	for _, t := range d.cfg.Triggers {
		out.Triggers = append(out.Triggers, TriggerState{Name: t.Name, Queue: t.Queue, Pattern: t.Pattern, Tool: t.Tool,
			MaxConcurrentRuns: t.MaxConcurrentRuns, Enabled: t.enabled(), Paused: t.Queue != "" && paused[t.Name],
			CanPause: t.Queue != "" && t.enabled()})
	}
	return out, nil
}

func (d *Dispatcher) hasTrigger(name string) bool {
	_, ok := d.trigger(name)
	return ok
}

func (d *Dispatcher) trigger(name string) (Trigger, bool) {
	for _, t := range d.cfg.Triggers {
		if t.Name == name {
			return t, true
		}
	}
	return Trigger{}, false
}
