// Package conformance holds one module author's contract (the sdk package
// doc, "What a module can rely on") to every host that runs modules: the
// in-memory sdk/meshtest, the runtime in-process on RabbitMQ, and a module
// process under the runtime. Each scenario is written once against the
// Host interface (conformance_test.go) and runs on all three.
//
// The modules the scenarios load are here, in a non-test file, so that
// the module binary (./module) runs the very same code. A module reports
// what it saw by appending JSON lines to a log file (Probe): a file works
// alike in-process and across the process boundary. What a module does is
// steered by the bodies of the events and requests it gets.
package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
	"github.com/meshkit/mesh/sdk/outbox"
)

// Record is one line a module appends to its log.
type Record struct {
	Kind        string          `json:"kind"`
	ID          string          `json:"id,omitempty"`
	Type        string          `json:"type,omitempty"`
	Source      string          `json:"source,omitempty"`
	Node        string          `json:"node,omitempty"`
	CausationID string          `json:"causation_id,omitempty"`
	Attempt     int             `json:"attempt,omitempty"`
	Redelivered bool            `json:"redelivered,omitempty"`
	Body        json.RawMessage `json:"body,omitempty"`
	Value       string          `json:"value,omitempty"`
	Caller      string          `json:"caller,omitempty"`
	Err         string          `json:"err,omitempty"`
	// Queue is the consumed queue a message came from.
	Queue string `json:"queue,omitempty"`
	// Schema is the event's x-schema (Event.Schema).
	Schema string `json:"schema,omitempty"`
	// Waited is how long after the event's time (Event.Time) a delayed
	// event was due (its x-due header); 0 for one that was not delayed.
	Waited time.Duration `json:"waited,omitempty"`
	// Trace is the trace id of the span a handler's ctx carries.
	Trace string `json:"trace,omitempty"`
	// Deadline is how long a handler's ctx had left when it began, or
	// -1 for none.
	Deadline time.Duration `json:"deadline,omitempty"`
	// OwnLogger says sdk.Logger(ctx) was not slog.Default().
	OwnLogger bool `json:"own_logger,omitempty"`
	// The Dead fields of a dead letter (sdk.Event).
	DeadQueue    string `json:"dead_queue,omitempty"`
	DeadReason   string `json:"dead_reason,omitempty"`
	DeadError    string `json:"dead_error,omitempty"`
	DeadAttempts int    `json:"dead_attempts,omitempty"`
	DeadTime     bool   `json:"dead_time,omitempty"` // DeadTime is set
	// Is names the sentinels the error satisfies (errors.Is), and a
	// ToolError's code, so a test compares errors across hosts.
	Is []string `json:"is,omitempty"`
}

// Probe appends Records to a file. It is safe for concurrent use.
type Probe struct {
	mu   sync.Mutex
	path string
}

// NewProbe appends to the file at path.
func NewProbe(path string) *Probe { return &Probe{path: path} }

// Add appends r. A record that cannot be written (the test is over and
// its directory gone) is dropped: a test missing it fails on its own.
func (p *Probe) Add(r Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line, err := json.Marshal(r)
	if err != nil {
		panic(err) // a Record always marshals
	}
	f, err := os.OpenFile(p.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
}

// Classify names what err is, for Record.Is.
func Classify(err error) []string {
	if err == nil {
		return nil
	}
	var is []string
	for name, target := range map[string]error{
		"invalid": sdk.ErrInvalid, "forbidden": sdk.ErrForbidden, "not_started": wire.ErrNotStarted,
		"already_started": wire.ErrAlreadyStarted, "no_server": sdk.ErrNoServer, "deadline": context.DeadlineExceeded,
		"permanent": sdk.ErrPermanent, "closed": sdk.ErrClosed,
	} {
		if errors.Is(err, target) {
			is = append(is, name)
		}
	}
	var te *sdk.ToolError
	if errors.As(err, &te) {
		is = append(is, "tool:"+te.Code)
	}
	if is == nil {
		is = []string{"other"}
	}
	return is
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Streamed is how many events the streamer module emits with EmitAsync.
const Streamed = 300

// Steer is what an event's or a request's body asks of the module.
type Steer struct {
	// Fail fails the first Fail attempts with a transient error.
	Fail int `json:"fail,omitempty"`
	// Permanent fails with a Permanent error.
	Permanent bool `json:"permanent,omitempty"`
	// Panic panics.
	Panic bool `json:"panic,omitempty"`
	// Block waits for the context to end.
	Block bool `json:"block,omitempty"`
	// Vary makes what is emitted or called depend on the attempt.
	Vary bool `json:"vary,omitempty"`
	// Fresh emits with sdk.WithFreshID.
	Fresh bool `json:"fresh,omitempty"`
	// After delays what the relay emits by that many milliseconds
	// (sdk.After); AtMostOnce emits it at most once.
	After      int  `json:"after,omitempty"`
	AtMostOnce bool `json:"at_most_once,omitempty"`
	// Code makes a tool answer with a ToolError of that code.
	Code string `json:"code,omitempty"`
	// Together waits (until the ctx ends) for that many handler calls
	// of the module to be running at once.
	Together int `json:"together,omitempty"`
	// DeadFail fails the first DeadFail attempts of the undertaker's
	// DeadLetters handler at the event's dead letter.
	DeadFail int `json:"dead_fail,omitempty"`
	// N is a payload number.
	N int `json:"n,omitempty"`
	// Negative makes the quoter answer a total below zero, which its
	// response schema refuses.
	Negative bool `json:"negative,omitempty"`
	// Rollback makes the ledger roll its transaction back.
	Rollback bool `json:"rollback,omitempty"`
	// The kinds module reads these (conf.echo reads Transient too; the
	// previous release's modules read none):
	//
	// Transient makes the ToolError of Code transient.
	Transient bool `json:"transient,omitempty"`
	// Return fails with an error that wraps the sentinel of that name
	// (Sentinels).
	Return string `json:"return,omitempty"`
	// Call calls that tool first, with Inner as the request, and fails
	// with what the call returned, if it failed.
	Call  string `json:"call,omitempty"`
	Inner *Steer `json:"inner,omitempty"`
	// Emit emits an event of that name first, and fails with what the
	// emit returned, if it failed.
	Emit string `json:"emit,omitempty"`
	// Unmarshalable makes the body of that call or emit a value
	// encoding/json cannot marshal.
	Unmarshalable bool `json:"unmarshalable,omitempty"`
}

// Sentinels are the errors Steer.Return names: what a handler may return
// that the hosts classify.
var Sentinels = map[string]error{
	"invalid": sdk.ErrInvalid, "forbidden": sdk.ErrForbidden, "no_server": sdk.ErrNoServer,
	"deadline": context.DeadlineExceeded, "closed": sdk.ErrClosed, "transient": sdk.ErrTransient,
	"permanent": sdk.ErrPermanent, "not_started": wire.ErrNotStarted,
}

// barrier is met once n handler calls are in it at once.
type barrier struct {
	mu  sync.Mutex
	in  int
	met chan struct{}
}

func (b *barrier) wait(ctx context.Context, n int) error {
	b.mu.Lock()
	if b.met == nil {
		b.met = make(chan struct{})
	}
	met := b.met
	b.in++
	if b.in == n {
		close(met)
		b.in, b.met = 0, nil
	}
	b.mu.Unlock()
	select {
	case <-met:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d handler calls never ran at once: %w", n, ctx.Err())
	}
}

func steer(body json.RawMessage) Steer {
	var s Steer
	_ = json.Unmarshal(body, &s)
	return s
}

// act does what s asks of attempt.
func act(ctx context.Context, s Steer, attempt int) error {
	switch {
	case s.Panic:
		panic("asked to panic")
	case s.Block:
		<-ctx.Done()
		return ctx.Err()
	case s.Permanent:
		return sdk.Permanent(errors.New("asked to fail for good"))
	case attempt <= s.Fail:
		return fmt.Errorf("asked to fail attempt %d", attempt)
	}
	return nil
}

// actKinds does what s asks of the kinds module's handler or tool, in
// m: first the call or emit it asks for (recorded as kind, Value the
// payload number, with what the call or emit returned), then the error it
// asks to return, then what act does.
func actKinds(ctx context.Context, m sdk.Mesh, probe *Probe, kind string, s Steer, attempt int) error {
	inner := func(err error) error {
		probe.Add(Record{Kind: kind, Value: fmt.Sprint(s.N), Attempt: attempt, Err: errText(err), Is: Classify(err)})
		return err
	}
	switch {
	case s.Call != "":
		var req any = Steer{}
		if s.Inner != nil {
			req = *s.Inner
		}
		if s.Unmarshalable {
			req = func() {}
		}
		if err := inner(m.Call(ctx, s.Call, req, nil)); err != nil {
			return fmt.Errorf("the inner call failed: %w", err)
		}
	case s.Emit != "":
		var body any = map[string]int{"n": s.N}
		if s.Unmarshalable {
			body = func() {}
		}
		if _, err := m.Emit(ctx, s.Emit, body); inner(err) != nil {
			return fmt.Errorf("the inner emit failed: %w", err)
		}
	case s.Return != "":
		sentinel, ok := Sentinels[s.Return]
		if !ok {
			return fmt.Errorf("no sentinel %q", s.Return)
		}
		return fmt.Errorf("asked to return %s: %w", s.Return, sentinel)
	case s.Code != "":
		return &sdk.ToolError{Code: s.Code, Message: "asked for " + s.Code, Permanent: !s.Transient}
	}
	return act(ctx, s, attempt)
}

// Module returns the conformance module of that name, reporting to probe.
// The names: watcher, worker, setup, namer, streamer, relay, tools, caller,
// undertaker, taker, runner, filterer, drainer, failer, ctxprobe, typed,
// pricer, pricewatch, oldreader, quoter, kinds.
func Module(name string, probe *Probe) (sdk.Module, error) {
	seen := func(kind string, ev sdk.Event) {
		r := Record{Kind: kind, ID: ev.ID, Type: ev.Type, Source: ev.Source, Node: ev.Node, CausationID: ev.CausationID,
			Attempt: ev.Attempt, Redelivered: ev.Redelivered, Body: ev.Body}
		if due, err := time.Parse(time.RFC3339Nano, ev.Headers["x-due"]); err == nil {
			r.Waited = due.Sub(ev.Time)
		}
		probe.Add(r)
	}
	switch name {
	case "watcher":
		// Records every event of the relay, namer, streamer and ledger modules it handles
		// (de-duplicated), and every copy on "mesh.dup.#" (duplicates
		// allowed).
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			h := sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { seen("seen", ev); return nil })
			return errors.Join(m.On("module.relay.#", h), m.On("module.namer.#", h), m.On("mesh.once.#", h), m.On("module.streamer.#", h), m.On("module.ledger.#", h),
				m.On("mesh.dup.#", middleware(h), sdk.AllowDuplicates()))
		}}, nil

	case "worker":
		// Handles mesh.work.# as each body steers it, recording every
		// attempt.
		var together barrier
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return m.On("mesh.work.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				seen("attempt", ev)
				s := steer(ev.Body)
				if s.Together > 0 {
					err := together.wait(ctx, s.Together)
					probe.Add(Record{Kind: "together", ID: ev.ID, Err: errText(err)})
					return err
				}
				err := act(ctx, s, ev.Attempt)
				if err != nil && ctx.Err() != nil {
					probe.Add(Record{Kind: "ctx", ID: ev.ID, Err: ctx.Err().Error(), Is: Classify(ctx.Err())})
				}
				return err
			}))
		}}, nil

	case "setup":
		// Tries in Setup what Setup may not do, and in Run what may only
		// be done in Setup.
		var later sdk.Mesh
		h := sdk.HandlerFunc(func(context.Context, sdk.Event) error { return nil })
		th := sdk.ToolHandlerFunc(func(context.Context, sdk.Request) (any, error) { return "ok", nil })
		try := func(what string, err error) { probe.Add(Record{Kind: what, Err: errText(err), Is: Classify(err)}) }
		return sdk.Module{Name: name,
			Setup: func(m sdk.Mesh) error {
				later = m
				_, err := m.Emit(context.Background(), "too.early", 1)
				try("setup_emit", err)
				try("setup_call", m.Call(context.Background(), "conf.echo", 1, nil))
				try("setup_on_nil", m.On("mesh.setup.#", nil))
				try("setup_on", m.On("mesh.setup.#", h))
				try("setup_on_again", m.On("mesh.setup.#", h))
				try("setup_on_bad", m.On("mesh..setup", h))
				try("setup_on_never", m.On("setup.created", h)) // no origin: could never match
				try("setup_serve_nil", m.Serve("conf.setup", nil))
				try("setup_serve", m.Serve("conf.setup", th))
				try("setup_serve_again", m.Serve("conf.setup", th))
				try("setup_serve_ungranted", m.Serve("forbidden.tool", th))
				try("setup_on_bad_filter", m.On("mesh.filtered.#", h, sdk.Filter("total > 3")))
				try("setup_serve_filter", m.Serve("conf.filtered", th, sdk.Filter("source = 'a'")))
				try("setup_consume_duplicates", m.Consume("conf.setup", 1, h, sdk.AllowDuplicates()))
				return nil
			},
			Run: func(ctx context.Context, m sdk.Mesh) error {
				try("run_on", later.On("mesh.late.#", h))
				try("run_serve", later.Serve("conf.late", th))
				return nil
			}}, nil

	case "namer":
		// Emits, in Run, by the naming rules.
		return sdk.Module{Name: name, Emits: []string{"site.created", "site.full"}, Run: func(ctx context.Context, m sdk.Mesh) error {
			for _, e := range []struct {
				what, name string
				body       any
				opts       []sdk.EmitOption
			}{
				{"ok", "site.created", map[string]int{"n": 1}, []sdk.EmitOption{sdk.WithSchema("2")}},
				{"ok_again", "site.created", map[string]int{"n": 1}, []sdk.EmitOption{sdk.WithSchema("2")}}, // outside a handler: a fresh id
				{"empty_word", "site..created", 1, nil},
				{"wildcard", "site.*", 1, nil},
				{"not_json", "site.created", json.RawMessage("{"), nil},
				{"unmarshalable", "site.created", func() {}, nil},
				{"ungranted_full_type", "mesh.other.thing", 1, []sdk.EmitOption{sdk.AsFullType()}},
				{"own_full_type", "module.namer.site.full", 2, []sdk.EmitOption{sdk.AsFullType()}},
				{"undeclared", "site.deleted", 1, nil},
				{"undeclared_full_type", "module.namer.site.gone", 1, []sdk.EmitOption{sdk.AsFullType()}},
				{"bad_option", "site.created", 1, []sdk.EmitOption{sdk.WithPriority(10)}},
			} {
				id, err := m.Emit(ctx, e.name, e.body, e.opts...)
				probe.Add(Record{Kind: "emit_" + e.what, ID: id, Err: errText(err), Is: Classify(err)})
			}
			return nil
		}}, nil

	case "streamer":
		// Emits, in Run, from one goroutine, Streamed events with
		// EmitAsync, then one under a bad name; each outcome is recorded
		// by its done.
		return sdk.Module{Name: name, Emits: []string{"item"}, Run: func(ctx context.Context, m sdk.Mesh) error {
			done := func(id string, err error) {
				probe.Add(Record{Kind: "stream_done", ID: id, Err: errText(err), Is: Classify(err)})
			}
			for i := range Streamed {
				if err := m.EmitAsync(ctx, "item", map[string]int{"n": i}, done); err != nil {
					probe.Add(Record{Kind: "stream_refused", Err: errText(err), Is: Classify(err)})
				}
			}
			if err := m.EmitAsync(ctx, "item..bad", 1, done); err != nil {
				probe.Add(Record{Kind: "stream_refused", Err: errText(err), Is: Classify(err)})
			}
			if err := m.EmitAsync(ctx, "item", 1, nil); err != nil {
				probe.Add(Record{Kind: "stream_no_done", Err: errText(err), Is: Classify(err)})
			}
			return nil
		}}, nil

	case "relay":
		// On mesh.relay.#: emits "relayed" with the event's body, then
		// fails as the body steers; then emits "done" with a fresh id.
		return sdk.Module{Name: name, Emits: []string{"relayed", "done"}, Setup: func(m sdk.Mesh) error {
			var self sdk.Mesh = m
			return m.On("mesh.relay.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				s := steer(ev.Body)
				body := map[string]int{"n": s.N}
				if s.Vary {
					body["attempt"] = ev.Attempt
				}
				var opts []sdk.EmitOption
				if s.Fresh {
					opts = append(opts, sdk.WithFreshID())
				}
				if s.After > 0 {
					opts = append(opts, sdk.After(time.Duration(s.After)*time.Millisecond))
				}
				if s.AtMostOnce {
					opts = append(opts, sdk.AtMostOnce())
				}
				id, err := self.Emit(ctx, "relayed", body, opts...)
				probe.Add(Record{Kind: "relayed", ID: id, Attempt: ev.Attempt, CausationID: ev.ID, Err: errText(err)})
				if err != nil {
					return err
				}
				if err := act(ctx, s, ev.Attempt); err != nil {
					return err
				}
				_, err = self.Emit(ctx, "done", map[string]int{"n": s.N}, sdk.WithFreshID())
				return err
			}))
		}}, nil

	case "ledger":
		// Keeps orders in a SQLite file beside its log and emits
		// module.ledger.booked through its outbox (sdk/outbox), relayed by
		// its Run. On mesh.ledger.book it writes order N and the event in
		// one transaction and commits it, unless the body asks Rollback;
		// then it fails as the body steers (after the commit). It records
		// the id Emit returned ("written"). Fresh writes WithFreshID.
		db, err := outbox.OpenSQLite(probe.path + ".db")
		if err != nil {
			return sdk.Module{}, err
		}
		def := sdk.Module{Name: name, Emits: []string{"booked"}}
		ob, err := outbox.New(context.Background(), db, def)
		if err != nil {
			db.Close()
			return sdk.Module{}, err
		}
		if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS orders (n INTEGER PRIMARY KEY)`); err != nil {
			db.Close()
			return sdk.Module{}, err
		}
		if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS paid (n INTEGER PRIMARY KEY, times INTEGER NOT NULL)`); err != nil {
			db.Close()
			return sdk.Module{}, err
		}
		// On mesh.ledger.pay, through the inbox: counts payment N's runs
		// in paid, emits booked, then fails as the body steers (inside the
		// transaction: a failed attempt rolls back); once committed, it
		// records the times paid says ("paid").
		pay := ob.Handler(func(ctx context.Context, tx *sql.Tx, ev sdk.Event) error {
			s := steer(ev.Body)
			if _, err := tx.ExecContext(ctx, `INSERT INTO paid (n, times) VALUES (?, 1) ON CONFLICT (n) DO UPDATE SET times = paid.times + 1`, s.N); err != nil {
				return err
			}
			if _, err := ob.Emit(ctx, tx, "booked", map[string]int{"n": s.N}); err != nil {
				return err
			}
			return act(ctx, s, ev.Attempt)
		})
		def.Setup = func(m sdk.Mesh) error {
			payErr := m.On("mesh.ledger.pay", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				if err := pay.HandleEvent(ctx, ev); err != nil {
					return err
				}
				var times int
				err := db.QueryRowContext(ctx, `SELECT times FROM paid WHERE n = ?`, steer(ev.Body).N).Scan(&times)
				probe.Add(Record{Kind: "paid", ID: ev.ID, Attempt: ev.Attempt, Value: fmt.Sprint(times), Err: errText(err)})
				return nil
			}))
			if payErr != nil {
				return payErr
			}
			return m.On("mesh.ledger.book", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				s := steer(ev.Body)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `INSERT INTO orders (n) VALUES (?) ON CONFLICT (n) DO NOTHING`, s.N); err != nil {
					return err
				}
				var opts []sdk.EmitOption
				if s.Fresh {
					opts = append(opts, sdk.WithFreshID())
				}
				id, err := ob.Emit(ctx, tx, "booked", map[string]int{"n": s.N}, opts...)
				probe.Add(Record{Kind: "written", ID: id, Attempt: ev.Attempt, CausationID: ev.ID, Value: fmt.Sprint(s.N), Err: errText(err)})
				if err != nil {
					return err
				}
				if !s.Rollback {
					if err := tx.Commit(); err != nil {
						return err
					}
				}
				return act(ctx, s, ev.Attempt)
			}))
		}
		def.Run = ob.Relay
		return def, nil

	case "tools":
		// Serves conf.echo (answers as the request steers) and
		// conf.invoice (counts its runs).
		var mu sync.Mutex
		runs := 0
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return errors.Join(
				m.Serve("conf.echo", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					s := steer(req.Body)
					if s.Block {
						probe.Add(Record{Kind: "echo_block", Caller: req.Caller, Value: time.Until(req.Deadline).String()})
					}
					if s.Code != "" {
						return nil, &sdk.ToolError{Code: s.Code, Message: "asked for " + s.Code, Permanent: !s.Transient}
					}
					if err := act(ctx, s, 1); err != nil {
						return nil, err
					}
					return map[string]any{"n": s.N, "caller": req.Caller, "causation_id": req.CausationID}, nil
				})),
				m.Serve("conf.invoice", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					mu.Lock()
					runs++
					n := runs
					mu.Unlock()
					probe.Add(Record{Kind: "invoice_run", ID: req.ID, CausationID: req.CausationID, Value: fmt.Sprint(n)})
					return map[string]int{"invoice": n}, nil
				})))
		}}, nil

	case "caller":
		// On mesh.order.#: calls conf.invoice, records the answer, then
		// fails as the body steers. In Run: calls conf.echo blocking,
		// without a deadline of its own.
		return sdk.Module{Name: name, Calls: []string{"conf.invoice", "conf.echo"}, Setup: func(m sdk.Mesh) error {
			var self sdk.Mesh = m
			return m.On("mesh.order.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				s := steer(ev.Body)
				req := map[string]int{"n": s.N}
				if s.Vary {
					req["attempt"] = ev.Attempt
				}
				var resp json.RawMessage
				err := self.Call(ctx, "conf.invoice", req, &resp)
				probe.Add(Record{Kind: "invoice", Attempt: ev.Attempt, Body: resp, Err: errText(err), Is: Classify(err)})
				if err != nil {
					return err
				}
				return act(ctx, s, ev.Attempt)
			}))
		}, Run: func(ctx context.Context, m sdk.Mesh) error {
			err := m.Call(ctx, "conf.echo", Steer{Block: true}, nil)
			probe.Add(Record{Kind: "default_deadline", Err: errText(err), Is: Classify(err)})
			return nil
		}}, nil

	case "kinds":
		// Handles mesh.kinds.# and serves conf.kinds, each as the body
		// steers it (actKinds): what every host makes of each error a
		// handler or tool may come to. Its inner calls and emits are
		// recorded as "kinds_event_inner" and "kinds_tool_inner".
		return sdk.Module{Name: name, Emits: []string{"kinds.done"}, Calls: []string{"conf.echo", "conf.nobody", "conf.invoice"}, Setup: func(m sdk.Mesh) error {
			return errors.Join(
				m.On("mesh.kinds.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
					seen("kinds_attempt", ev)
					return actKinds(ctx, m, probe, "kinds_event_inner", steer(ev.Body), ev.Attempt)
				})),
				m.Serve("conf.kinds", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					s := steer(req.Body)
					if err := actKinds(ctx, m, probe, "kinds_tool_inner", s, 1); err != nil {
						return nil, err
					}
					return map[string]int{"n": s.N}, nil
				})))
		}}, nil

	case "undertaker":
		// Records every dead letter of the mesh its DeadLetters handler
		// gets, failing the first DeadFail attempts at each.
		return sdk.Module{Name: name, DeadLetters: sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
			probe.Add(Record{Kind: "dead", ID: ev.ID, Type: ev.Type, Source: ev.Source, Node: ev.Node, Attempt: ev.Attempt, Body: ev.Body,
				DeadQueue: ev.DeadQueue, DeadReason: ev.DeadReason, DeadError: ev.DeadError, DeadAttempts: ev.DeadAttempts, DeadTime: !ev.DeadTime.IsZero()})
			if ev.Attempt <= steer(ev.Body).DeadFail {
				return fmt.Errorf("asked to fail dead-letter attempt %d", ev.Attempt)
			}
			return nil
		})}, nil

	case "taker":
		// Consumes the existing queue conf.orders, two at a time, as each
		// body steers it (a body that is not JSON asks nothing). The tool
		// taker.hold holds or releases the queue as its request (a bool)
		// says; a message taken while the module holds the queue is
		// recorded as "taken_while_held".
		var held atomic.Bool
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return errors.Join(
				m.Consume("conf.orders", 2, sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
					kind := "taken"
					if held.Load() {
						kind = "taken_while_held"
					}
					probe.Add(Record{Kind: kind, ID: ev.ID, Type: ev.Type, Queue: ev.Queue, Attempt: ev.Attempt, Value: string(ev.Body)})
					return act(ctx, steer(ev.Body), ev.Attempt)
				})),
				m.Serve("taker.hold", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					var h bool
					if err := req.Decode(&h); err != nil {
						return nil, sdk.Permanent(err)
					}
					if h {
						defer held.Store(true) // once the node stopped delivering
					} else {
						held.Store(false)
					}
					err := m.Hold("conf.orders", h)
					probe.Add(Record{Kind: "hold", Value: fmt.Sprint(h), Err: errText(err), Is: Classify(err)})
					return h, err
				})),
			)
		}}, nil

	case "runner":
		// Records its Run's start and the end of Run's context.
		return sdk.Module{Name: name, Run: func(ctx context.Context, m sdk.Mesh) error {
			probe.Add(Record{Kind: "run_started"})
			<-ctx.Done()
			probe.Add(Record{Kind: "run_ctx_done", Err: ctx.Err().Error()})
			return nil
		}}, nil

	case "filterer":
		// Takes mesh.filt.# as its two filters say, the first that
		// accepts an event winning ("big", then "tagged"), acting as the
		// body steers; consumes conf.filtered as a header and body filter
		// says ("queued"). Each handler is wrapped by a middleware, and
		// its options are given beside it.
		logged := func(kind string) sdk.Handler {
			return middleware(sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				probe.Add(Record{Kind: kind, ID: ev.ID, Type: ev.Type, Source: ev.Source, Attempt: ev.Attempt, Queue: ev.Queue, Value: string(ev.Body)})
				return act(ctx, steer(ev.Body), ev.Attempt)
			}))
		}
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return errors.Join(
				m.On("mesh.filt.#", logged("big"), sdk.Filter("body.n >= 10 and source = 'conformance'")),
				m.On("mesh.filt.*", logged("tagged"), sdk.Filter("body.tag in ('a', 'b') or not body.n exists"), sdk.AllowDuplicates()),
				m.Consume("conf.filtered", 1, logged("queued"), sdk.Filter(`header.x-kind = 'keep' and not body.drop = true`)),
			)
		}}, nil

	case "drainer":
		// Its handler of mesh.drain.# takes its time ("drain_started",
		// then "drain_done" half a second later); its Run records when its
		// ctx ends.
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return m.On("mesh.drain.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				probe.Add(Record{Kind: "drain_started", ID: ev.ID})
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
				}
				probe.Add(Record{Kind: "drain_done", ID: ev.ID, Err: errText(ctx.Err())})
				return nil
			}))
		}, Run: func(ctx context.Context, m sdk.Mesh) error {
			probe.Add(Record{Kind: "run_started"})
			<-ctx.Done()
			probe.Add(Record{Kind: "run_ctx_done"})
			return nil
		}}, nil

	case "failer":
		// Its Run fails once its handler took an event of mesh.fail.#,
		// the first time it runs: started again (a module process), its
		// Run finds the mark it left beside its log, and runs on.
		asked := make(chan struct{})
		var once sync.Once
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return m.On("mesh.fail.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				probe.Add(Record{Kind: "fail_asked", ID: ev.ID})
				once.Do(func() { close(asked) })
				return nil
			}))
		}, Run: func(ctx context.Context, m sdk.Mesh) error {
			probe.Add(Record{Kind: "run_started"})
			mark := probe.path + ".failed"
			if _, err := os.Stat(mark); err == nil {
				<-ctx.Done()
				return nil
			}
			select {
			case <-asked:
			case <-ctx.Done():
				return nil
			}
			if err := os.WriteFile(mark, nil, 0o600); err != nil {
				return err
			}
			return errors.New("run broke")
		}}, nil

	case "ctxprobe":
		// Records what the ctx of its handler (mesh.ctx.#), its tool
		// handler (conf.ctx) and its Run carry, and logs through
		// sdk.Logger(ctx) in each.
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return errors.Join(
				m.On("mesh.ctx.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
					probe.Add(ctxRecord(ctx, "ctx_event", ev.ID))
					sdk.Logger(ctx).Info("ctxprobe handled")
					return nil
				})),
				m.Serve("conf.ctx", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					probe.Add(ctxRecord(ctx, "ctx_tool", req.ID))
					sdk.Logger(ctx).Info("ctxprobe answered")
					return "ok", nil
				})),
			)
		}, Run: func(ctx context.Context, m sdk.Mesh) error {
			probe.Add(ctxRecord(ctx, "ctx_run", ""))
			sdk.Logger(ctx).Info("ctxprobe runs")
			<-ctx.Done()
			return nil
		}}, nil

	case "typed":
		// Handles mesh.typed.# with a typed handler of Order ("typed",
		// Value the number), calling conf.double with TypedCall for
		// mesh.typed.call ("typed_call", Value the answer); serves
		// conf.double with a typed tool.
		type number struct {
			N int `json:"n"`
		}
		var mesh sdk.Mesh
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			mesh = m
			return errors.Join(
				m.On("mesh.typed.#", sdk.Typed(func(ctx context.Context, ev sdk.Event, o number) error {
					probe.Add(Record{Kind: "typed", ID: ev.ID, Type: ev.Type, Attempt: ev.Attempt, Value: fmt.Sprint(o.N)})
					if ev.Type != "mesh.typed.call" {
						return nil
					}
					got, err := sdk.TypedCall[number](ctx, mesh, "conf.double", o)
					probe.Add(Record{Kind: "typed_call", ID: ev.ID, Value: fmt.Sprint(got.N), Err: errText(err), Is: Classify(err)})
					return err
				})),
				m.Serve("conf.double", sdk.TypedTool(func(ctx context.Context, req sdk.Request, in number) (number, error) {
					return number{N: 2 * in.N}, nil
				})),
			)
		}}, nil

	case "pricer":
		// Emits, in Run, each of PriceEmits as "price", whose schema it
		// declares in versions 1 and 2 (PriceSchemaV1, PriceSchemaV2), and
		// records each outcome as "price_" and its name.
		return sdk.Module{Name: name, Emits: []string{"price"},
			Schemas: []sdk.Schema{{Event: "price", Version: "1", JSON: PriceSchemaV1}, {Event: "price", Version: "2", JSON: PriceSchemaV2}},
			Run: func(ctx context.Context, m sdk.Mesh) error {
				for _, e := range PriceEmits {
					var opts []sdk.EmitOption
					if e.Schema != "" {
						opts = append(opts, sdk.WithSchema(e.Schema))
					}
					id, err := m.Emit(ctx, "price", e.Body, opts...)
					probe.Add(Record{Kind: "price_" + e.Name, ID: id, Err: errText(err), Is: Classify(err)})
				}
				return nil
			}}, nil

	case "pricewatch":
		// Records every event of the pricer ("priced"), whatever its
		// version: it declares no reads.
		return sdk.Module{Name: name, Setup: func(m sdk.Mesh) error {
			return m.On("module.pricer.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				probe.Add(Record{Kind: "priced", ID: ev.ID, Type: ev.Type, Source: ev.Source, Schema: ev.Schema, Body: ev.Body})
				return nil
			}))
		}}, nil

	case "oldreader":
		// Reads only version 1 of the pricer's events; records any its
		// handler gets ("old_read").
		return sdk.Module{Name: name, Reads: map[string][]string{"module.pricer.#": {"1"}}, Setup: func(m sdk.Mesh) error {
			return m.On("module.pricer.#", sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error {
				probe.Add(Record{Kind: "old_read", ID: ev.ID, Type: ev.Type, Schema: ev.Schema})
				return nil
			}))
		}}, nil

	case "quoter":
		// Serves conf.quote, whose request (QuoteRequestSchema) and
		// response (QuoteResponseSchema) schemas it declares: it records
		// each run ("quote_run", Value the request's n) and answers the
		// total n, or -n when the request asks for Negative.
		return sdk.Module{Name: name,
			Schemas: []sdk.Schema{{Tool: "conf.quote", Version: "1", JSON: QuoteRequestSchema, Response: QuoteResponseSchema}},
			Setup: func(m sdk.Mesh) error {
				return m.Serve("conf.quote", sdk.ToolHandlerFunc(func(ctx context.Context, req sdk.Request) (any, error) {
					s := steer(req.Body)
					probe.Add(Record{Kind: "quote_run", ID: req.ID, Value: fmt.Sprint(s.N)})
					if s.Negative {
						return map[string]int{"total": -s.N}, nil
					}
					return map[string]int{"total": s.N}, nil
				}))
			}}, nil
	}
	return sdk.Module{}, fmt.Errorf("no conformance module %q", name)
}

// The quoter's declared schemas of conf.quote: a request with a whole n of
// at least 1, a response with a total of at least 0.
var (
	QuoteRequestSchema  = []byte(`{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 1}}}`)
	QuoteResponseSchema = []byte(`{"type": "object", "required": ["total"], "properties": {"total": {"type": "integer", "minimum": 0}}}`)
)

// The pricer's declared schemas of "price": version 2 is the one it
// emits now.
var (
	PriceSchemaV1 = []byte(`{"type": "object", "required": ["price"]}`)
	PriceSchemaV2 = []byte(`{
		"type": "object",
		"properties": {
			"price": {"type": "number", "minimum": 0},
			"currency": {"enum": ["EUR", "USD"]},
			"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}
		},
		"required": ["price", "currency"],
		"additionalProperties": false
	}`)
)

// PriceEmit is one emit the pricer makes: Body, with sdk.WithSchema(Schema)
// unless Schema is "".
type PriceEmit struct {
	Name   string
	Body   any
	Schema string
}

// PriceEmits are the pricer's emits, in order: two that conform to
// version 2, one breaking each rule family of it, and a conforming one
// asking for version 1.
var PriceEmits = []PriceEmit{
	{Name: "ok", Body: map[string]any{"price": 9.5, "currency": "EUR", "sku": "ABC-1"}},
	{Name: "ok_same_version", Body: map[string]any{"price": 3, "currency": "USD"}, Schema: "2"},
	{Name: "type", Body: map[string]any{"price": "ten", "currency": "EUR"}},
	{Name: "required", Body: map[string]any{"price": 1}},
	{Name: "minimum", Body: map[string]any{"price": -1, "currency": "EUR"}},
	{Name: "enum", Body: map[string]any{"price": 1, "currency": "GBP"}},
	{Name: "additional", Body: map[string]any{"price": 1, "currency": "EUR", "colour": "red"}},
	{Name: "pattern", Body: map[string]any{"price": 1, "currency": "EUR", "sku": "abc"}},
	{Name: "other_version", Body: map[string]any{"price": 2, "currency": "EUR"}, Schema: "1"},
}

// ctxRecord is what ctx carries: its trace, its deadline and its logger.
func ctxRecord(ctx context.Context, kind, id string) Record {
	r := Record{Kind: kind, ID: id, Deadline: -1, OwnLogger: sdk.Logger(ctx) != slog.Default()}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.Trace = sc.TraceID().String()
	}
	if d, ok := ctx.Deadline(); ok {
		r.Deadline = time.Until(d)
	}
	return r
}

// middleware wraps h as an author's middleware does (logging, metrics):
// the handler's options, given beside it to On, survive it.
func middleware(h sdk.Handler) sdk.Handler {
	return sdk.HandlerFunc(func(ctx context.Context, ev sdk.Event) error { return h.HandleEvent(ctx, ev) })
}
