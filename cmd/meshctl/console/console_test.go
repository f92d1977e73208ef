package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
	"github.com/meshkit/mesh/sdk"
)

// These are the server's own tests, against a fake mesh: the guards, the
// grouping, the filters, the escaping. The browser tests in cmd/meshctl
// (TestConsole, TestConsoleGuards) prove the console on a real broker.

// fakeMesh records what the console asked of it.
type fakeMesh struct {
	mu       sync.Mutex
	events   map[string]store.Event
	kept     []deadletters.Message
	queries  []auditlogger.QueryRequest
	replayed []deadletters.Filter
	sent     []string      // id@queue of each message replayed
	block    chan struct{} // if not nil, a replay waits for it to close
	reads    []string      // the queue and query of each Kept
	// reading, if not nil, is where Kept says it reads, with a channel
	// it then waits on to be closed.
	reading chan chan struct{}
	paused  []string
	purged  []deadletters.Filter
	actions []Action
	nodes   []Node
	queues  []Queue
}

var _ Mesh = (*fakeMesh)(nil)

func (f *fakeMesh) Nodes() []Node { return f.nodes }
func (f *fakeMesh) Graph() Graph  { return Graph{} }
func (f *fakeMesh) Broker(context.Context) Broker {
	return Broker{Connected: true, URL: "amqp://127.0.0.1:5672/", Queues: f.queues}
}
func (f *fakeMesh) AuditQuery(_ context.Context, req auditlogger.QueryRequest) (auditlogger.QueryResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries = append(f.queries, req)
	var out auditlogger.QueryResponse
	for _, ev := range f.events {
		out.Events = append(out.Events, ev)
	}
	return out, nil
}
func (f *fakeMesh) AuditGet(_ context.Context, id string) (store.Event, error) {
	if ev, ok := f.events[id]; ok {
		return ev, nil
	}
	return store.Event{}, &sdk.ToolError{Code: "not_found", Message: "no event " + id, Permanent: true}
}
func (f *fakeMesh) AuditTrace(_ context.Context, id string, _ int) (store.Trace, error) {
	ev, err := f.AuditGet(context.Background(), id)
	return store.Trace{Root: &store.Caused{Event: ev}}, err
}
func (f *fakeMesh) Kept(ctx context.Context, queue string, q KeptQuery) ([]deadletters.Message, error) {
	f.mu.Lock()
	f.reads = append(f.reads, queue+" "+q.key())
	reading := f.reading
	f.mu.Unlock()
	if q.Progress != nil {
		q.Progress(1, len(f.kept))
	}
	if reading != nil {
		release := make(chan struct{})
		reading <- release
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var out []deadletters.Message
	for _, m := range f.kept {
		if len(q.Filter.IDs) == 0 || q.Filter.IDs[0] == m.ID {
			// Kept as deadletters.List keeps it.
			switch {
			case q.Summaries:
				m.Headers, m.Body = nil, nil
			case q.Body > 0 && len(m.Body) > q.Body:
				m.Body = m.Body[:q.Body]
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// Replay "replays" the kept messages the filter's ids and queue select,
// as deadletters.Replay would, and says how many.
func (f *fakeMesh) Replay(_ context.Context, _ string, flt deadletters.Filter, progress func(int, int)) (deadletters.Result, error) {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replayed = append(f.replayed, flt)
	var res deadletters.Result
	for _, m := range f.kept {
		if slices.Contains(flt.IDs, m.ID) && (flt.Queue == "" || flt.Queue == m.Queue) {
			res.Matched++
			res.Done++
			f.sent = append(f.sent, m.ID+"@"+m.Queue)
		}
	}
	progress(res.Done, res.Matched)
	return res, nil
}
func (f *fakeMesh) Purge(_ context.Context, _ string, flt deadletters.Filter, _ func(int, int)) (deadletters.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.purged = append(f.purged, flt)
	return deadletters.Result{Matched: len(flt.IDs), Done: len(flt.IDs)}, nil
}
func (f *fakeMesh) Triggers(context.Context) ([]dispatcher.TriggerState, error) { return nil, nil }
func (f *fakeMesh) Fires(context.Context, dispatcher.FiresRequest) (dispatcher.FiresResponse, error) {
	return dispatcher.FiresResponse{}, nil
}
func (f *fakeMesh) Pause(_ context.Context, trigger string, pause bool) (dispatcher.PauseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = append(f.paused, trigger)
	return dispatcher.PauseResponse{Trigger: trigger, Paused: pause}, nil
}
func (f *fakeMesh) Tail(ctx context.Context, _ string, ready func(), _ func(runtime.TailedEvent) error) error {
	ready()
	<-ctx.Done()
	return nil
}
func (f *fakeMesh) Record(_ context.Context, a Action) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, a)
	return nil
}

// testToken is the token serve gives a console that is given none, and
// do sends unless told otherwise; its name is "operator".
const testToken = "0123456789abcdef-operator"

// serve starts a console on f that accepts testToken, besides what cfg
// says; Host headers are those of cfg.Addr.
func serve(t *testing.T, f *fakeMesh, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Token == "" && cfg.Tokens == nil {
		cfg.Token, cfg.TokenName = testToken, "operator"
	}
	return serveOn(t, f, cfg, httptest.NewUnstartedServer(nil), false)
}

// serveOn starts a console on f as cfg says (no token added) in ts,
// over TLS if asked.
func serveOn(t *testing.T, f *fakeMesh, cfg Config, ts *httptest.Server, tls bool) (*Server, *httptest.Server) {
	t.Helper()
	cfg.Mesh = f
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Who = "tester"
	cfg.Addr = ts.Listener.Addr().String()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = s
	if tls {
		ts.StartTLS()
	} else {
		ts.Start()
	}
	t.Cleanup(ts.Close)
	t.Cleanup(s.Close) // after the server: the jobs it started end first
	return s, ts
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// do sends a request with the headers h, and testToken as a bearer
// token unless h has an Authorization ("" for none).
func do(t *testing.T, method, u string, body string, h map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	if req.Header.Get("Authorization") == "" {
		req.Header.Del("Authorization")
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestNewRefusesABadConfig(t *testing.T) {
	for _, cfg := range []Config{{Addr: "127.0.0.1:1"}, {Mesh: &fakeMesh{}, Addr: "no port"}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", cfg, err)
		}
	}
}

// checkHosts asks for the overview with each Host header and checks the
// status it gets.
func checkHosts(t *testing.T, ts *httptest.Server, want map[string]int) {
	t.Helper()
	for host, status := range want {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/", nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, status)
		}
	}
}

func TestHostHeaderIsChecked(t *testing.T) {
	_, ts := serve(t, &fakeMesh{}, Config{})
	checkHosts(t, ts, map[string]int{"evil.example": http.StatusMisdirectedRequest, ts.Listener.Addr().String(): http.StatusOK})
}

func TestTokenIsRequired(t *testing.T) {
	_, ts := serve(t, &fakeMesh{}, Config{Token: "0123456789abcdef-token"})
	none := map[string]string{"Authorization": ""}
	resp, _ := do(t, http.MethodGet, ts.URL+"/audit?type=x", "", none)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next="+url.QueryEscape("/audit?type=x") {
		t.Errorf("a page without the token: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/assets/style.css", "", none); resp.StatusCode != http.StatusOK {
		t.Errorf("the assets without the token: %d, want 200 (the login page needs them)", resp.StatusCode)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", map[string]string{"Authorization": "Bearer wrong"}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a wrong bearer token: %d", resp.StatusCode)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", map[string]string{"Authorization": "Bearer 0123456789abcdef-token"}); resp.StatusCode != http.StatusOK {
		t.Errorf("the bearer token: %d", resp.StatusCode)
	}
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Authorization": ""}
	resp, _ = do(t, http.MethodPost, ts.URL+"/login", "token=nope", form)
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a wrong login: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	for next, want := range map[string]string{"/audit?type=x": "/audit?type=x", "//evil.example/": "/", "https://evil.example/": "/", "/\\evil": "/", "": "/",
		"/\t/evil.example": "/", "/\n/evil.example": "/"} {
		resp, _ = do(t, http.MethodPost, ts.URL+"/login", url.Values{"token": {"0123456789abcdef-token"}, "next": {next}}.Encode(), form)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("login with next %q: %d to %q, want %q", next, resp.StatusCode, resp.Header.Get("Location"), want)
		}
		if c := resp.Cookies(); len(c) != 1 || c[0].Name != cookieName || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Path != "/" || c[0].Secure {
			t.Errorf("the login cookie: %+v", c)
		}
	}
}

// csrfOf reads the CSRF token from a page.
func csrfOf(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	_, body := do(t, http.MethodGet, ts.URL+"/", "", nil)
	_, rest, ok := strings.Cut(body, `<meta name="mesh-csrf" content="`)
	if !ok {
		t.Fatal("no CSRF token on the page")
	}
	tok, _, _ := strings.Cut(rest, `"`)
	return tok
}

func TestActionsNeedTheCSRFTokenAndTheirOrigin(t *testing.T) {
	f := &fakeMesh{}
	_, ts := serve(t, f, Config{})
	csrf := csrfOf(t, ts)
	for _, h := range []map[string]string{{}, {"X-Mesh-CSRF": "guess"}, {"X-Mesh-CSRF": csrf, "Origin": "http://evil.example"}} {
		if resp, body := do(t, http.MethodPost, ts.URL+"/api/dispatcher/pause", `{"trigger":"orders"}`, h); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a pause with %v: %d %s", h, resp.StatusCode, body)
		}
	}
	if len(f.paused) != 0 {
		t.Fatalf("refused pauses reached the mesh: %v", f.paused)
	}
	resp, body := do(t, http.MethodPost, ts.URL+"/api/dispatcher/pause", `{"trigger":"orders"}`, map[string]string{"X-Mesh-CSRF": csrf, "Origin": ts.URL})
	if resp.StatusCode != http.StatusOK || len(f.paused) != 1 {
		t.Fatalf("a pause with the token: %d %s, paused %v", resp.StatusCode, body, f.paused)
	}
	if len(f.actions) != 1 || f.actions[0].Action != "pause" || f.actions[0].Who != "operator (tester)" || f.actions[0].Auth != "token" || f.actions[0].Result != "paused" {
		t.Errorf("the action recorded: %+v", f.actions)
	}
	// A GET never acts.
	if resp, _ := do(t, http.MethodGet, ts.URL+"/api/dispatcher/pause", "", nil); resp.StatusCode == http.StatusOK {
		t.Errorf("GET of an action: %d", resp.StatusCode)
	}
}

func TestReadOnlyRefusesEveryAction(t *testing.T) {
	f := &fakeMesh{kept: []deadletters.Message{{ID: "a", Queue: "n.m.events"}}}
	_, ts := serve(t, f, Config{ReadOnly: true})
	csrf := csrfOf(t, ts)
	for _, p := range []string{"/api/dlq/replay", "/api/dlq/purge", "/api/unrouted/replay", "/api/unrouted/purge", "/api/dispatcher/pause", "/api/dispatcher/resume"} {
		body := `{"ids":["a"]}`
		if strings.Contains(p, "dispatcher") {
			body = `{"trigger":"orders"}`
		}
		if resp, b := do(t, http.MethodPost, ts.URL+p, body, map[string]string{"X-Mesh-CSRF": csrf}); resp.StatusCode != http.StatusForbidden || !strings.Contains(b, "read-only") {
			t.Errorf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	if len(f.paused)+len(f.replayed)+len(f.actions) != 0 {
		t.Errorf("a read-only console acted: %v %v %v", f.paused, f.replayed, f.actions)
	}
	if _, body := do(t, http.MethodGet, ts.URL+"/", "", nil); !strings.Contains(body, `class="read-only"`) {
		t.Error("the page does not say it is read-only")
	}
}

func TestDeadLettersAreGroupedAndAGroupReplayed(t *testing.T) {
	now := time.Now().UTC()
	f := &fakeMesh{kept: []deadletters.Message{
		{ID: "a", Queue: "n.ledger.events", Reason: "rejected", Error: "closed", Time: now.Add(-time.Hour)},
		{ID: "b", Queue: "n.ledger.events", Reason: "rejected", Error: "closed", Time: now},
		{ID: "c", Queue: "n.ledger.events", Reason: "delivery_limit", Time: now.Add(-time.Minute)},
		{ID: "a", Queue: "n.mailer.events", Reason: "rejected", Error: "smtp", Time: now.Add(-2 * time.Hour)}, // the same event, another queue
	}}
	g := groupsOf(deadKeeper, f.kept)
	if len(g) != 3 || g[0].Count != 2 || g[0].Error != "closed" || !g[0].First.Equal(now.Add(-time.Hour)) || !g[0].Last.Equal(now) || g[1].Count != 1 {
		t.Fatalf("groups: %+v", g)
	}
	u := groupsOf(unroutedKeeper, []deadletters.Message{
		{ID: "x", Type: "mesh.a.b", Source: "s1"}, {ID: "y", Type: "mesh.a.b", Source: "s2"}, {ID: "z", Type: "mesh.a.b", Source: "s1", Queue: "ignored"},
	})
	if len(u) != 2 || u[0].Type != "mesh.a.b" || strings.Join(u[0].IDs, ",") != "x,z" || strings.Join(u[1].IDs, ",") != "y" {
		t.Errorf("unrouted groups (by type and source): %+v", u)
	}
	_, ts := serve(t, f, Config{})
	if _, body := do(t, http.MethodGet, ts.URL+"/dlq/group/"+g[0].Key, "", nil); !strings.Contains(body, `value="a"`) || !strings.Contains(body, `value="b"`) || strings.Contains(body, `value="c"`) {
		t.Errorf("the group's page lists other messages: %s", body)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/dlq/group/nope", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown group: %d", resp.StatusCode)
	}
	csrf := map[string]string{"X-Mesh-CSRF": csrfOf(t, ts)}
	for _, bad := range []string{`{"ids":[]}`, `not json`, `{"ids":["a"],"all":true}`, `{"ids":["a"]}`} { // the last: no queue
		if resp, b := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", bad, csrf); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("replay %s: %d %s", bad, resp.StatusCode, b)
		}
	}
	resp, body := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", `{"ids":["a","b","b","gone"],"queue":"n.ledger.events"}`, csrf)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("replay: %d %s", resp.StatusCode, body)
	}
	var started struct{ Job string }
	if err := json.Unmarshal([]byte(body), &started); err != nil {
		t.Fatal(err)
	}
	var jb job
	for !jb.Finished { // the fake replays at once; the job says so when its goroutine ends
		_, b := do(t, http.MethodGet, ts.URL+"/api/jobs/"+started.Job, "", nil)
		if err := json.Unmarshal([]byte(b), &jb); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(jb.Summary, "replayed 2 of 2 dead letters; 1 of the 3 asked for not found") || jb.Done != 2 || jb.Missing != 1 {
		t.Errorf("the job: %+v", jb)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.replayed) != 1 || strings.Join(f.replayed[0].IDs, ",") != "a,b,gone" || f.replayed[0].Queue != "n.ledger.events" {
		t.Errorf("replayed %+v, want the ids a, b and gone (each once) of n.ledger.events", f.replayed)
	}
	if strings.Join(f.sent, " ") != "a@n.ledger.events b@n.ledger.events" {
		t.Errorf("sent %v: the mailer's copy of a is another group's", f.sent)
	}
	if len(f.actions) != 1 || f.actions[0].Target != wire.QueueDead || f.actions[0].IDs != 3 {
		t.Errorf("the action recorded: %+v", f.actions)
	}
}

func TestPagesEscapeWhatTheMeshSays(t *testing.T) {
	evil := `<script>alert(1)</script>`
	f := &fakeMesh{events: map[string]store.Event{"x": {ID: "x", Type: "mesh.evil." + evil, Source: evil, Headers: map[string]string{evil: evil},
		Body: []byte(`{"html":"` + strings.ReplaceAll(evil, `/`, `\/`) + `"}`)}}}
	_, ts := serve(t, f, Config{})
	for _, p := range []string{"/audit/event/x", "/audit/trace/x", "/audit?type=%23"} {
		resp, body := do(t, http.MethodGet, ts.URL+p, "", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		if strings.Contains(body, "<script>alert") {
			t.Errorf("%s has the event's script unescaped", p)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%s does not show the text escaped", p)
		}
		if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("%s: no Content-Security-Policy", p)
		}
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/audit/event/missing", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an event the audit log does not hold: %d", resp.StatusCode)
	}
}

func TestAuditFilterOfTheQuery(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	q := url.Values{"type": {"module.a.#", "", "mesh.b.c"}, "source": {"s"}, "node": {"n"}, "user": {"u"}, "id": {"i"}, "causation": {"c"},
		"header": {"x-schema=2"}, "body": {"order.id=42"}, "from": {"1h"}, "to": {"2026-12-01T11:30:00Z"}, "malformed": {"1"}, "dead": {"on"}}
	f, err := auditFilterOf(q, now)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.Types, " ") != "module.a.# mesh.b.c" || f.Sources[0] != "s" || f.Nodes[0] != "n" || f.UserIDs[0] != "u" || f.IDs[0] != "i" || f.CausationIDs[0] != "c" ||
		f.Headers["x-schema"] != "2" || f.Body["order.id"] != "42" || !f.From.Equal(now.Add(-time.Hour)) || f.To.Format(time.RFC3339) != "2026-12-01T11:30:00Z" ||
		f.Malformed == nil || !*f.Malformed || f.Dead == nil || !*f.Dead {
		t.Errorf("filter: %+v", f)
	}
	for _, bad := range []url.Values{{"header": {"novalue"}}, {"body": {"=1"}}, {"from": {"yesterday"}}} {
		if _, err := auditFilterOf(bad, now); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	_, ts := serve(t, &fakeMesh{}, Config{})
	if resp, body := do(t, http.MethodGet, ts.URL+"/audit?from=yesterday", "", nil); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "neither RFC 3339 nor a duration") {
		t.Errorf("a bad from: %d", resp.StatusCode)
	}
}

func TestTimelineIsInTimeOrder(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ev := func(id, src, cause string, at time.Duration) store.Event {
		return store.Event{ID: id, Type: "module." + src + ".x", Source: src, CausationID: cause, Time: t0.Add(at)}
	}
	tr := store.Trace{
		Causes: []store.Event{ev("b", "two", "a", time.Second), ev("a", "one", "", 0)},
		Root: &store.Caused{Event: ev("c", "three", "b", 2*time.Second), Caused: []*store.Caused{
			{Event: ev("e", "one", "c", 4*time.Second)}, {Event: ev("d", "two", "c", 3*time.Second)},
		}},
	}
	tl := layoutTimeline(tr, "c")
	var order, lanes []string
	for _, m := range tl.Marks {
		order = append(order, strings.Fields(m.Full)[1])
	}
	for _, l := range tl.Lanes {
		lanes = append(lanes, l.Label)
	}
	if strings.Join(order, "") != "abcde" || strings.Join(lanes, " ") != "one two three" || len(tl.Arrows) != 4 || !tl.Marks[2].Focus {
		t.Errorf("timeline: order %v, lanes %v, %d arrows, marks %+v", order, lanes, len(tl.Arrows), tl.Marks)
	}
	if tl.Marks[4].X != tl.Marks[0].X {
		t.Error("one module's events are on different lanes")
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:80": true, "localhost:1": true, "0.0.0.0:8080": false, ":8080": false, "10.0.0.1:80": false, "bad": false} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v", addr, got)
		}
	}
}

func TestExportFormats(t *testing.T) {
	_, ts := serve(t, &fakeMesh{}, Config{})
	resp, body := do(t, http.MethodGet, ts.URL+"/audit/export?format=csv", "", nil)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != strings.Join(store.CSVHeader, ",") {
		t.Errorf("an empty CSV export: %d %q, want the header row alone", resp.StatusCode, body)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/audit/export?format=xml", "", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("format xml: %d", resp.StatusCode)
	}
	f := &fakeMesh{events: map[string]store.Event{"x": {ID: "x", Type: "mesh.a.b", Body: []byte(`{"a":1}`)}}}
	_, ts = serve(t, f, Config{})
	if _, body := do(t, http.MethodGet, ts.URL+"/audit/export", "", nil); !strings.Contains(body, `"id":"x"`) || !strings.Contains(body, `"body":{"a":1}`) {
		t.Errorf("a JSON Lines export: %q", body)
	}
}

func TestHostsOfAProxiedConsole(t *testing.T) {
	_, ts := serve(t, &fakeMesh{}, Config{PublicURL: "https://Console.Example", Names: []string{"mesh-ops:8080"}})
	checkHosts(t, ts, map[string]int{"console.example": http.StatusOK, "CONSOLE.EXAMPLE": http.StatusOK, "mesh-ops:8080": http.StatusOK,
		strings.ToUpper(ts.Listener.Addr().String()): http.StatusOK, "console.example:444": http.StatusMisdirectedRequest, "evil.example": http.StatusMisdirectedRequest})
	// An action from the public origin passes, though the proxy rewrote
	// the Host; another origin does not.
	csrf := csrfOf(t, ts)
	for origin, want := range map[string]int{"https://console.example": http.StatusOK, "https://evil.example": http.StatusForbidden} {
		if resp, b := do(t, http.MethodPost, ts.URL+"/api/dispatcher/pause", `{"trigger":"x"}`, map[string]string{"X-Mesh-CSRF": csrf, "Origin": origin}); resp.StatusCode != want {
			t.Errorf("Origin %s: %d %s, want %d", origin, resp.StatusCode, b, want)
		}
	}
	if _, err := New(Config{Mesh: &fakeMesh{}, Addr: "127.0.0.1:1", PublicURL: "ftp://x"}); !errors.Is(err, ErrConfig) {
		t.Errorf("PublicURL ftp://x: %v", err)
	}
}

func TestLiveStreamsAreBounded(t *testing.T) {
	_, ts := serve(t, &fakeMesh{}, Config{})
	var open []*http.Response
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	get := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/live?pattern=%23", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		return http.DefaultClient.Do(req)
	}
	for range maxStreams {
		resp, err := get()
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d", len(open), resp.StatusCode)
		}
	}
	resp, err := get()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("stream %d: %d, want 503", maxStreams+1, resp.StatusCode)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/api/live?pattern=a..b", "", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a bad pattern: %d", resp.StatusCode)
	}
}

func TestRunningJobsAreBounded(t *testing.T) {
	f := &fakeMesh{block: make(chan struct{}), kept: []deadletters.Message{{ID: "a", Queue: "q"}}}
	_, ts := serve(t, f, Config{})
	csrf := map[string]string{"X-Mesh-CSRF": csrfOf(t, ts)}
	var jobs []string
	for range maxRunning {
		resp, body := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", `{"ids":["a"],"queue":"q"}`, csrf)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("replay %d: %d %s", len(jobs)+1, resp.StatusCode, body)
		}
		var started struct{ Job string }
		_ = json.Unmarshal([]byte(body), &started)
		jobs = append(jobs, started.Job)
	}
	if resp, body := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", `{"ids":["a"],"queue":"q"}`, csrf); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("replay %d: %d %s, want 429", maxRunning+1, resp.StatusCode, body)
	}
	close(f.block)
	for _, id := range jobs {
		for done := false; !done; { // each ends once the fake lets it
			_, b := do(t, http.MethodGet, ts.URL+"/api/jobs/"+id, "", nil)
			var jb job
			_ = json.Unmarshal([]byte(b), &jb)
			done = jb.Finished
		}
	}
	if resp, _ := do(t, http.MethodPost, ts.URL+"/api/dlq/replay", `{"ids":["a"],"queue":"q"}`, csrf); resp.StatusCode != http.StatusAccepted {
		t.Errorf("a replay after the others ended: %d", resp.StatusCode)
	}
}

// TestOverviewShowsTheOutbox: a module's outbox backlog, from its node's
// heartbeat, is on the overview beside the module.
func TestOverviewShowsTheOutbox(t *testing.T) {
	oldest := time.Now().Add(-3 * time.Minute)
	f := &fakeMesh{nodes: []Node{{LastSeen: time.Now(), Heartbeat: runtime.Heartbeat{Node: "anchor", Started: time.Now(), Modules: []runtime.ModuleSummary{
		{Name: "ledger", Outbox: &runtime.OutboxSummary{Unsent: 3, Oldest: &oldest, SetAside: 1}},
		{Name: "plain"},
	}}}}}
	_, ts := serve(t, f, Config{})
	resp, body := do(t, http.MethodGet, ts.URL+"/", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/: %d", resp.StatusCode)
	}
	if !strings.Contains(body, "outbox 3 unsent, oldest 3m ago, 1 set aside") || strings.Count(body, " unsent") != 1 {
		t.Errorf("the overview does not show the ledger's outbox (and only its):\n%s", body)
	}
}

func TestGroupsPageShowsMembersPartitionsAndHotKeys(t *testing.T) {
	now := time.Now()
	hb := func(node string, mods ...runtime.ModuleSummary) Node {
		return Node{LastSeen: now, Heartbeat: runtime.Heartbeat{Node: node, Started: now, Interval: time.Second, Modules: mods}}
	}
	f := &fakeMesh{nodes: []Node{
		hb("east", runtime.ModuleSummary{Name: "ledger", Group: "books", Partitions: 2, Owns: []int{0},
			Hot: []runtime.HotKey{{Key: "<b>acct</b>", Partition: 0, Waiting: 4}}},
			runtime.ModuleSummary{Name: "billing", Group: "eu"}),
		hb("west", runtime.ModuleSummary{Name: "ledger", Group: "books", Partitions: 2, Owns: []int{1}},
			runtime.ModuleSummary{Name: "billing", Group: "eu"}, runtime.ModuleSummary{Name: "shop", Group: "../x"}),
	}, queues: []Queue{{Name: "group.books.ledger.p000", Ready: 7, Consumers: 1}, {Name: "group.eu.billing.events", Ready: 3, Consumers: 2}}}
	_, ts := serve(t, f, Config{})
	resp, body := do(t, http.MethodGet, ts.URL+"/groups", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/groups: %d", resp.StatusCode)
	}
	for _, want := range []string{
		`data-group="books" data-module="ledger"`, "ordered by key over 2 partitions", `data-group="eu" data-module="billing"`, "shared queue",
		`<tr data-queue="group.books.ledger.p000"><td>group.books.ledger.p000</td><td class="owner">east</td><td class="num">7</td>`,
		`<tr data-queue="group.books.ledger.p001"><td>group.books.ledger.p001</td><td class="owner">west</td><td class="num" colspan="5">not listed</td>`,
		`<tr data-queue="group.eu.billing.events"><td>group.eu.billing.events</td><td class="num">3</td>`,
		"group.books.ledger.intake", `<td class="key">&lt;b&gt;acct&lt;/b&gt;</td><td class="num">4</td><td>east</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/groups lacks %q:\n%s", want, body)
		}
	}
	if strings.Count(body, "1 of 2 partitions") != 2 || strings.Contains(body, "<b>acct") || strings.Contains(body, "../x") {
		t.Errorf("/groups: each member owns 1 of 2, the key escaped, no group of a name that makes no queue:\n%s", body)
	}

	// A change of the count under way (meshctl groups repartition): west
	// says epoch 1 and 4 partitions, east is still at epoch 0. The page
	// shows the new count's partitions, west's ownership of them, and
	// that the count is changing.
	f.nodes[1] = hb("west", runtime.ModuleSummary{Name: "ledger", Group: "books", Partitions: 4, Epoch: 1, Owns: []int{0, 3}})
	_, body = do(t, http.MethodGet, ts.URL+"/groups", "", nil)
	for _, want := range []string{"ordered by key over 4 partitions (epoch 1: changed by meshctl groups repartition), count changing",
		`<tr data-queue="group.books.ledger.e1p003"><td>group.books.ledger.e1p003</td><td class="owner">west</td>`, "2 of 4 partitions"} {
		if !strings.Contains(body, want) {
			t.Errorf("/groups during a change lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "group.books.ledger.p000") {
		t.Errorf("/groups during a change lists the old count's partitions:\n%s", body)
	}
}
