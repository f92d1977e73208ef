// Package console is meshctl's web console: the mesh as pages for
// operators and auditors, served by `meshctl console` with the clients and
// broker permissions meshctl already uses.
//
// The pages (each a URL that can be shared and reloaded) are the overview
// (nodes and modules, the broker's connection and alarms, queues with
// their depth and the age of their oldest message, rates, what is
// unhealthy first), the event graph, the audit log (search with every
// filter of `meshctl audit query`, an event with its fates, its causal
// chain as a tree and as a sequence diagram, export), the dead letters and
// unrouted events grouped by queue, reason and error (replay or purge a
// group or a selection), the dispatcher's triggers (pause, resume,
// firings) and a live view of events matching a pattern (server-sent
// events).
//
// Everything the console shows comes from the mesh, whose content is
// anyone's who can publish: pages are rendered with html/template, which
// escapes it, and no page runs script from an asset it did not embed
// (Content-Security-Policy: script-src 'self').
//
// Safety: every request but the login page's and the assets' must carry
// a token, on loopback too (a process of the console's own host is no
// more trusted than another host). The tokens are Config.Token, the
// operators' tokens of Config.Tokens (a TokenFile, re-read when it
// changes, so a revoked token is refused from the next request), and
// the browsers logged in by a one-time login URL (Server.LoginURL): its
// code is good once, for LoginCodeTTL. A token comes as a cookie (the
// login page sets it: HttpOnly, SameSite=Strict, and __Host- and Secure
// over TLS) or an Authorization: Bearer header. Requests whose Host
// header is not the console's own are refused (DNS rebinding). Actions
// (replay, purge, pause, resume) are POSTs that must carry the page's
// CSRF token (one per token) in the X-Mesh-CSRF header, are refused
// altogether with Config.ReadOnly or a read-only token, and are logged,
// and recorded on the mesh, with the name of the token that asked.
//
//	srv, err := console.New(console.Config{Mesh: m, Addr: "127.0.0.1:8080",
//		Tokens: console.OpenTokenFile(path).Tokens})
//	if err != nil { ... }
//	fmt.Println("log in:", srv.LoginURL("http://127.0.0.1:8080"))
//	http.ListenAndServe("127.0.0.1:8080", srv)
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/modules/dispatcher"
	"github.com/meshkit/mesh/runtime"
)

// Mesh is what the console asks of the mesh. meshctl implements it with a
// node of its own (the audit logger's and dispatcher's tools over
// mesh.rpc, heartbeats, a tail), a connection to the broker (the keeper
// queues) and the broker's management API (queues, alarms).
type Mesh interface {
	// Nodes are the nodes heard from, by name.
	Nodes() []Node
	// Graph is the event graph the nodes' heartbeats declare.
	Graph() Graph
	// Broker is the broker's state now.
	Broker(ctx context.Context) Broker

	// AuditQuery, AuditGet and AuditTrace ask the audit logger
	// (audit.query, audit.get, audit.trace).
	AuditQuery(ctx context.Context, req auditlogger.QueryRequest) (auditlogger.QueryResponse, error)
	AuditGet(ctx context.Context, id string) (store.Event, error)
	AuditTrace(ctx context.Context, id string, depth int) (store.Trace, error)

	// Kept lists the messages of a keeper queue (wire.QueueDead or
	// wire.QueueUnrouted) that q selects, keeping of each what q says
	// (deadletters.List with q.Options()); Replay and Purge act on them,
	// reporting progress. The console calls Kept at most maxBrowses at
	// once, and never for a queue while it replays or purges in it.
	Kept(ctx context.Context, queue string, q KeptQuery) ([]deadletters.Message, error)
	Replay(ctx context.Context, queue string, f deadletters.Filter, progress func(done, total int)) (deadletters.Result, error)
	Purge(ctx context.Context, queue string, f deadletters.Filter, progress func(done, total int)) (deadletters.Result, error)

	// Triggers, Fires and Pause ask the dispatcher (dispatcher.triggers,
	// dispatcher.fires, dispatcher.pause and dispatcher.resume).
	Triggers(ctx context.Context) ([]dispatcher.TriggerState, error)
	Fires(ctx context.Context, req dispatcher.FiresRequest) (dispatcher.FiresResponse, error)
	Pause(ctx context.Context, trigger string, pause bool) (dispatcher.PauseResponse, error)

	// Tail calls fn with every event matching pattern until ctx is done
	// (runtime.Node.Tail); ready is called once it listens.
	Tail(ctx context.Context, pattern string, ready func(), fn func(runtime.TailedEvent) error) error

	// Record puts an action taken from the console on the mesh, for the
	// audit log.
	Record(ctx context.Context, a Action) error
}

// Node is a node as its heartbeats tell of it.
type Node struct {
	runtime.Heartbeat
	// LastSeen is when its last heartbeat arrived.
	LastSeen time.Time
}

// Graph is the event graph: modules, events, patterns no declared event
// matches, tools and queues, and the edges between them.
type Graph struct {
	Vertices []Vertex
	Edges    []Edge
}

// Vertex is a vertex of the graph. Kind is "module", "event", "pattern",
// "tool" or "queue"; Link, if not empty, is the console page it opens
// (the audit log of an event type or a module).
type Vertex struct {
	ID, Kind, Label, Link string
	// Stale marks a module whose node has not been heard for three of
	// its heartbeats: drawn greyed, as what may be gone.
	Stale bool
}

// Edge is an edge of the graph, from one vertex id to another. Label says
// which pattern it is ("calls", "serves", a subscription's pattern);
// Dashed marks a pattern no declared event matches.
type Edge struct {
	From, To, Label string
	Dashed          bool
}

// Broker is the broker's state as the console shows it.
type Broker struct {
	// Connected says the console's node is connected; URL is the broker it
	// is connected to, without credentials.
	Connected bool
	URL       string
	// Management is why the management API could not be read, or "": the
	// alarms, queues and rates come from it.
	Management string
	// Version is the broker's RabbitMQ version, when known.
	Version string
	// Alarms are the broker's resource alarms in force ("memory on
	// rabbit@host").
	Alarms []string
	// Queues are the mesh's queues (and every other queue of the virtual
	// host), by name.
	Queues []Queue
	// Rates are messages per second over the management API's last
	// sample.
	Rates Rates
}

// Queue is a queue as the management API tells of it.
type Queue struct {
	Name, Type     string
	Ready, Unacked int
	Consumers      int
	// Oldest is the age of the message at its head (time in queue), when
	// the broker knows it (a classic queue whose head has a timestamp); 0
	// otherwise.
	Oldest time.Duration
	// In and Out are publishes and deliveries per second; Redelivered the
	// redeliveries per second (handlers failing, or consumers lost).
	In, Out, Redelivered float64
}

// Rates are the mesh's rates in messages per second: emitted (into
// mesh.events), handled (acknowledged from module queues), failed
// (redelivered) and dead-lettered (into mesh.events.dead).
type Rates struct {
	Emitted, Handled, Failed, DeadLettered float64
}

// Action is one action taken from the console, as logged and recorded.
type Action struct {
	// Action is "replay", "purge", "pause" or "resume"; Target what it
	// acted on (a keeper queue with the ids, a trigger).
	Action string `json:"action"`
	Target string `json:"target"`
	IDs    int    `json:"ids,omitempty"`
	// Who is the operator: the name of the token the request carried,
	// then the OS user and broker user meshctl runs as ("alice (root as
	// broker user ops)"); From the client's address; Auth how it proved
	// itself: "token" (Config.Token or one of Config.Tokens) or
	// "login-url" (a browser logged in by a one-time login URL).
	Who  string `json:"who"`
	From string `json:"from"`
	Auth string `json:"auth"`
	// Result says what came of it.
	Result string    `json:"result"`
	Time   time.Time `json:"time"`
}

// Config configures a console.
type Config struct {
	// Mesh is the mesh the console shows. Required.
	Mesh Mesh
	// Addr is the address the console listens on (host:port); requests
	// whose Host header names another host are refused. Required.
	Addr string
	// Token, when set, is a token the console accepts (as the login
	// page's cookie, or an Authorization: Bearer header), named
	// TokenName (default "token") in the log.
	Token     string
	TokenName string
	// Tokens, when set, are the operators' tokens (TokenFile.Tokens). It
	// is called for every request that carries a token, so it must be
	// cheap; an error refuses the tokens it would have given (and is
	// logged). With neither Token nor Tokens, only a browser logged in by
	// a login URL (Server.LoginURL) gets in: a token is always required.
	Tokens func() ([]Token, error)
	// ReadOnly refuses every action, whatever the token.
	ReadOnly bool
	// PublicURL, when set, is the console's address as browsers reach it
	// through a proxy (https://console.example): its host is a Host the
	// console answers to, and its origin one actions may come from.
	PublicURL string
	// Names are more HOST:PORT names the console answers to (the address
	// it was asked to listen on, when that is a name).
	Names []string
	// Who is who runs the console, as actions are logged after the
	// token's name ("alice as broker user ops").
	Who string
	// Logger logs the actions; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// ErrConfig is what New returns for a Config it cannot use.
var ErrConfig = errors.New("console: bad config")

// Server is the console, an http.Handler.
type Server struct {
	cfg Config
	// csrfKey makes each token's CSRF token (csrfFor).
	csrfKey []byte
	// static is Config.Token, when set.
	static *Token

	mux   *http.ServeMux
	pages *pages
	jobs  *jobs
	kept  *browses        // the reads of the keeper queues, shared
	hosts map[string]bool // Host headers that name this console, lower case
	// origin is PublicURL's origin, which actions may come from besides
	// the Host's own.
	origin  string
	streams chan struct{} // a token per live stream open

	mu       sync.Mutex
	codes    []loginCode // the login URLs' codes not spent, nor expired
	sessions []Token     // the browsers logged in by a login URL
	tokenErr string      // Config.Tokens' last error, logged once

	// work is the context of the replays and purges, and of the reads of
	// the keeper queues, which outlive their requests; Close cancels it
	// and waits for them.
	work     context.Context
	stopWork context.CancelFunc
	working  sync.WaitGroup
}

// New checks cfg and builds the console.
func New(cfg Config) (*Server, error) {
	if cfg.Mesh == nil {
		return nil, fmt.Errorf("%w: Mesh is required", ErrConfig)
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("%w: Addr %q: want HOST:PORT: %v", ErrConfig, cfg.Addr, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pg, err := loadPages()
	if err != nil {
		return nil, err
	}
	if cfg.TokenName == "" {
		cfg.TokenName = NameToken
	}
	s := &Server{cfg: cfg, csrfKey: []byte(randomToken()), pages: pg, jobs: newJobs(), hosts: hostsOf(host, port), streams: make(chan struct{}, maxStreams)}
	for _, n := range cfg.Names {
		s.hosts[strings.ToLower(n)] = true
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: PublicURL %q: want http(s)://HOST[:PORT]", ErrConfig, cfg.PublicURL)
		}
		s.hosts[strings.ToLower(u.Host)] = true
		s.origin = strings.ToLower(u.Scheme + "://" + u.Host)
	}
	if cfg.Token != "" {
		s.static = &Token{Name: cfg.TokenName, SHA256: HashToken(cfg.Token)}
	}
	s.work, s.stopWork = context.WithCancel(context.Background())
	s.kept = newBrowses(cfg.Mesh, cfg.Now, s.work, &s.working)
	s.routes()
	return s, nil
}

// Close stops the replays and purges still running (what they had not
// moved stays in its keeper queue) and the reads of the keeper queues,
// and waits for them.
func (s *Server) Close() {
	s.stopWork()
	s.working.Wait()
}

// hostsOf is the Host headers that name a console listening on host:port:
// the address itself, and for loopback or every interface the names of
// loopback; for every interface, any host (it is reached by many names,
// and a token guards it).
func hostsOf(host, port string) map[string]bool {
	h := map[string]bool{net.JoinHostPort(host, port): true}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && (ip.IsLoopback() || ip.IsUnspecified())) || host == "" {
		for _, n := range []string{"127.0.0.1", "localhost", "::1"} {
			h[net.JoinHostPort(n, port)] = true
		}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		h["*"] = true
	}
	return h
}

// IsLoopback says whether addr's host is a loopback address or
// "localhost": a console there is reached from this machine only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// randomToken is 32 random bytes in hex.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// NewToken returns a new random token for Config.Token.
func NewToken() string { return randomToken() }

// cookieName is the login cookie's name; over TLS (or behind an https
// PublicURL) it is secureCookieName, which browsers take only from a
// secure origin, for the whole host (Path=/, no Domain).
const (
	cookieName       = "mesh_console"
	secureCookieName = "__Host-mesh_console"
)

// ServeHTTP checks the Host header and the token, then serves the page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if !s.hosts["*"] && !s.hosts[strings.ToLower(r.Host)] {
		http.Error(w, "this console answers to its own address only (Host "+r.Host+" refused)", http.StatusMisdirectedRequest)
		return
	}
	c, ok := s.callerOf(r)
	if ok {
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, c))
	} else if !strings.HasPrefix(r.URL.Path, "/assets/") && r.URL.Path != "/login" {
		if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/api/") {
			http.Redirect(w, r, "/login?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		http.Error(w, "a token is required: log in at /login", http.StatusUnauthorized)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// caller is the token a request proved itself with, and how: "token" or
// "login-url".
type caller struct {
	Token
	Auth string
}

type callerKey struct{}

// callerFrom is the caller ServeHTTP found for r; the zero caller (no
// name) on the pages served without a token.
func callerFrom(r *http.Request) caller {
	c, _ := r.Context().Value(callerKey{}).(caller)
	return c
}

// callerOf finds the token r carries, as the cookie or a bearer token.
func (s *Server) callerOf(r *http.Request) (caller, bool) {
	if ck, err := r.Cookie(s.cookieName(r)); err == nil {
		if c, ok := s.lookup(ck.Value); ok {
			return c, true
		}
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return s.lookup(strings.TrimSpace(v))
	}
	return caller{}, false
}

// lookup finds the token whose secret is secret. Every token is compared
// (their hashes, in constant time), whichever matches.
func (s *Server) lookup(secret string) (caller, bool) {
	if secret == "" {
		return caller{}, false
	}
	h := HashToken(secret)
	var found caller
	ok := false
	match := func(t Token, auth string) {
		if subtle.ConstantTimeCompare(h[:], t.SHA256[:]) == 1 && !ok {
			found, ok = caller{Token: t, Auth: auth}, true
		}
	}
	if s.static != nil {
		match(*s.static, "token")
	}
	if s.cfg.Tokens != nil {
		ts, err := s.cfg.Tokens()
		s.noteTokenErr(err)
		for _, t := range ts {
			match(t, "token")
		}
	}
	s.mu.Lock()
	for _, t := range s.sessions {
		match(t, NameLoginURL)
	}
	s.mu.Unlock()
	return found, ok
}

// noteTokenErr logs Config.Tokens' error once, when it changes.
func (s *Server) noteTokenErr(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	changed := msg != s.tokenErr
	s.tokenErr = msg
	s.mu.Unlock()
	if changed && err != nil {
		s.cfg.Logger.Warn("console: the operators' tokens are refused until this is fixed", "err", err)
	}
}

// secure says whether browsers reach the console over TLS (its own, or
// a proxy's of an https PublicURL).
func (s *Server) secure(r *http.Request) bool {
	return r.TLS != nil || strings.HasPrefix(s.origin, "https://")
}

func (s *Server) cookieName(r *http.Request) string {
	if s.secure(r) {
		return secureCookieName
	}
	return cookieName
}

// setCookie logs the browser in with the token secret.
func (s *Server) setCookie(w http.ResponseWriter, r *http.Request, secret string) {
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(r), Value: secret, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
}

// csrfFor is the CSRF token of the pages served to c: one per token, so
// that a page read with one token does not let another's actions through.
func (s *Server) csrfFor(c caller) string {
	if c.Name == "" {
		return ""
	}
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write(c.SHA256[:])
	return hex.EncodeToString(m.Sum(nil))
}

// readOnly says whether r may only look: the console is read-only, or
// its token is.
func (s *Server) readOnly(r *http.Request) bool {
	return s.cfg.ReadOnly || callerFrom(r).ReadOnly
}

// LoginCodeTTL is how long a login URL's code is good for.
const LoginCodeTTL = 10 * time.Minute

// maxSessions bounds the browsers logged in by login URLs that are
// remembered: the oldest is logged out first.
const maxSessions = 1000

// loginCode is a login URL's code: its hash, and when it expires.
type loginCode struct {
	hash    [32]byte
	expires time.Time
}

// LoginURL makes a new one-time login code and returns base (the
// console's address as the operator's browser reaches it,
// http://127.0.0.1:8080) with the path that spends it:
// BASE/login?once=CODE. The first visit within LoginCodeTTL logs that
// browser in (as "login-url", with a secret of its own in the cookie,
// good until the console stops); the code is then spent, and a second
// visit is refused.
func (s *Server) LoginURL(base string) string {
	code := randomToken()[:32] // 128 bits
	s.mu.Lock()
	s.codes = append(s.codes, loginCode{hash: HashToken(code), expires: s.cfg.Now().Add(LoginCodeTTL)})
	s.mu.Unlock()
	return strings.TrimSuffix(base, "/") + "/login?once=" + code
}

// spend spends a login URL's code, and returns the secret of the session
// it opens; false if the code is not one, or is spent or expired.
func (s *Server) spend(code string) (string, bool) {
	h := HashToken(code)
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	found := -1
	for i, c := range s.codes {
		if subtle.ConstantTimeCompare(h[:], c.hash[:]) == 1 && now.Before(c.expires) {
			found = i
		}
	}
	if found >= 0 {
		s.codes = slices.Delete(s.codes, found, found+1)
	}
	s.codes = slices.DeleteFunc(s.codes, func(c loginCode) bool { return !now.Before(c.expires) })
	if found < 0 {
		return "", false
	}
	secret := randomToken()
	if len(s.sessions) >= maxSessions {
		s.sessions = slices.Delete(s.sessions, 0, 1)
	}
	s.sessions = append(s.sessions, Token{Name: NameLoginURL, SHA256: HashToken(secret), Created: now})
	return secret, true
}

// checkAction refuses an action in read-only mode and one without the
// page's CSRF token (or from another origin), writing the refusal; it
// says whether the action may go on.
func (s *Server) checkAction(w http.ResponseWriter, r *http.Request) bool {
	c := callerFrom(r)
	if s.cfg.ReadOnly {
		writeJSONError(w, http.StatusForbidden, "this console is read-only (meshctl console --read-only): no action is taken")
		return false
	}
	if c.ReadOnly {
		writeJSONError(w, http.StatusForbidden, "the token "+c.Name+" is read-only (meshctl console token add --read-only): no action is taken")
		return false
	}
	if csrf := s.csrfFor(c); csrf == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Mesh-CSRF")), []byte(csrf)) != 1 {
		writeJSONError(w, http.StatusForbidden, "the request lacks this console's CSRF token (X-Mesh-CSRF): reload the page")
		return false
	}
	if o := strings.ToLower(r.Header.Get("Origin")); o != "" && o != "http://"+strings.ToLower(r.Host) && o != "https://"+strings.ToLower(r.Host) && o != s.origin {
		writeJSONError(w, http.StatusForbidden, "the request comes from another origin ("+o+")")
		return false
	}
	return true
}

// record logs an action with who took it, and puts it on the mesh.
func (s *Server) record(r *http.Request, a Action) {
	c := callerFrom(r)
	a.Who, a.From, a.Auth, a.Time = c.Name, r.RemoteAddr, c.Auth, s.cfg.Now().UTC()
	if s.cfg.Who != "" {
		a.Who += " (" + s.cfg.Who + ")"
	}
	s.cfg.Logger.Info("console action", "action", a.Action, "target", a.Target, "ids", a.IDs, "who", a.Who, "from", a.From, "auth", a.Auth, "result", a.Result)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cfg.Mesh.Record(ctx, a); err != nil {
		s.cfg.Logger.Warn("console action not recorded on the mesh", "action", a.Action, "err", err)
	}
}

// jobs are the replays and purges running or done, by id.
type jobs struct {
	mu   sync.Mutex
	byID map[string]*job
	seq  int
}

// job is one replay or purge, as its page polls it.
type job struct {
	ID       string   `json:"id"`
	Action   string   `json:"action"`
	Done     int      `json:"done"`
	Total    int      `json:"total"`
	Finished bool     `json:"finished"`
	Summary  string   `json:"summary,omitempty"`
	Left     []string `json:"left,omitempty"`
	Missing  int      `json:"missing,omitempty"` // ids asked for and not found
	// Waiting, while it waits for its turn, says for what.
	Waiting string `json:"waiting,omitempty"`
	seq     int    // its order of start
	Error   string `json:"error,omitempty"`
}

func newJobs() *jobs { return &jobs{byID: map[string]*job{}} }

// maxJobs bounds the jobs remembered: the oldest finished go first.
// maxRunning bounds the replays and purges at once (each holds a broker
// connection and what it matched).
const (
	maxJobs    = 100
	maxRunning = 4
)

// start records a new job, or returns nil when maxRunning run already.
func (j *jobs) start(action string) *job {
	j.mu.Lock()
	defer j.mu.Unlock()
	running := 0
	var oldest *job
	for _, jb := range j.byID {
		if !jb.Finished {
			running++
		} else if oldest == nil || jb.seq < oldest.seq {
			oldest = jb
		}
	}
	if running >= maxRunning {
		return nil
	}
	if len(j.byID) >= maxJobs && oldest != nil {
		delete(j.byID, oldest.ID)
	}
	j.seq++
	jb := &job{ID: fmt.Sprintf("%d-%s", j.seq, randomToken()[:8]), Action: action, seq: j.seq}
	j.byID[jb.ID] = jb
	return jb
}

func (j *jobs) update(jb *job, f func(*job)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f(jb)
}

func (j *jobs) get(id string) (job, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	jb, ok := j.byID[id]
	if !ok {
		return job{}, false
	}
	return *jb, true
}
