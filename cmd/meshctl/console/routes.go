package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/modules/dispatcher"
)

// askTimeout bounds what one page asks of the mesh.
const askTimeout = 30 * time.Second

func (s *Server) routes() {
	m := http.NewServeMux()
	assets, _ := fs.Sub(assetFS, "assets")
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("GET /{$}", s.overview)
	m.HandleFunc("GET /graph", s.graph)
	m.HandleFunc("GET /audit", s.auditSearch)
	m.HandleFunc("GET /audit/export", s.auditExport)
	m.HandleFunc("GET /audit/event/{id}", s.auditEvent)
	m.HandleFunc("GET /audit/trace/{id}", s.auditTrace)
	for _, k := range []keeper{deadKeeper, unroutedKeeper} {
		m.HandleFunc("GET /"+k.Path, func(w http.ResponseWriter, r *http.Request) { s.keptGroups(w, r, k) })
		m.HandleFunc("GET /"+k.Path+"/group/{group}", func(w http.ResponseWriter, r *http.Request) { s.keptGroup(w, r, k) })
		m.HandleFunc("GET /"+k.Path+"/message/{id}", func(w http.ResponseWriter, r *http.Request) { s.keptMessage(w, r, k) })
		m.HandleFunc("GET /"+k.Path+"/message/{id}/body", func(w http.ResponseWriter, r *http.Request) { s.keptBody(w, r, k) })
		m.HandleFunc("POST /api/"+k.Path+"/replay", func(w http.ResponseWriter, r *http.Request) { s.keptAct(w, r, k, "replay") })
		m.HandleFunc("POST /api/"+k.Path+"/purge", func(w http.ResponseWriter, r *http.Request) { s.keptAct(w, r, k, "purge") })
	}
	m.HandleFunc("GET /api/jobs/{id}", s.jobStatus)
	m.HandleFunc("GET /dispatcher", s.dispatcherPage)
	m.HandleFunc("GET /groups", s.groupsPage)
	m.HandleFunc("POST /api/dispatcher/pause", func(w http.ResponseWriter, r *http.Request) { s.pause(w, r, true) })
	m.HandleFunc("POST /api/dispatcher/resume", func(w http.ResponseWriter, r *http.Request) { s.pause(w, r, false) })
	m.HandleFunc("GET /live", s.livePage)
	m.HandleFunc("GET /api/live", s.liveEvents)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, "Not found", "no page "+r.URL.Path)
	})
	s.mux = m
}

// ask is a context for what one page asks of the mesh.
func ask(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), askTimeout)
}

// loginPage asks for a token; with ?once=CODE, a login URL's code, it
// spends the code and logs the browser in.
func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.URL.Query().Get("next"))
	if code := r.URL.Query().Get("once"); code != "" {
		secret, ok := s.spend(code)
		if !ok {
			s.cfg.Logger.Warn("console login refused: a login URL's code spent, expired or unknown", "from", r.RemoteAddr)
			s.renderStatus(w, r, http.StatusUnauthorized, "login", view{Title: "Log in", Data: map[string]string{"Next": next},
				Err: "that login URL was used already, has expired, or is not this console's: log in with a token, or restart meshctl console for a new URL"})
			return
		}
		s.cfg.Logger.Info("console login", "who", NameLoginURL, "from", r.RemoteAddr)
		s.setCookie(w, r, secret)
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	s.render(w, r, "login", view{Title: "Log in", Data: map[string]string{"Next": next}})
}

// login checks the token of the login form and sets it as a cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10) // a token and a path: no uploads, no megabytes
	if err := r.ParseForm(); err != nil {
		http.Error(w, "a login is a small form: "+err.Error(), http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	token := strings.TrimSpace(r.PostForm.Get("token"))
	c, ok := s.lookup(token)
	if !ok {
		s.cfg.Logger.Warn("console login refused", "from", r.RemoteAddr)
		s.renderStatus(w, r, http.StatusUnauthorized, "login", view{Title: "Log in", Err: "that is not a token of this console", Data: map[string]string{"Next": next}})
		return
	}
	s.cfg.Logger.Info("console login", "who", c.Name, "from", r.RemoteAddr)
	s.setCookie(w, r, token)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// safeNext is a local path to go to after logging in: "/" unless next is
// one ("/audit?type=x"), never another site ("//evil", "https://...").
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\") {
		return "/"
	}
	for _, r := range next {
		if r < 0x20 || r == 0x7f { // browsers drop tabs and newlines: "/\t/evil" would be "//evil"
			return "/"
		}
	}
	if u, err := url.Parse(next); err != nil || u.Scheme != "" || u.Host != "" {
		return "/"
	}
	return next
}

// readJSON decodes a small JSON request body into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the request is not the JSON expected: %w", err)
	}
	return nil
}

func (s *Server) jobStatus(w http.ResponseWriter, r *http.Request) {
	jb, ok := s.jobs.get(r.PathValue("id"))
	if !ok {
		writeJSONError(w, http.StatusNotFound, "no such job")
		return
	}
	writeJSON(w, http.StatusOK, jb)
}

// dispatcherView is the dispatcher page's data.
type dispatcherView struct {
	Triggers []dispatcher.TriggerState
	Fires    []dispatcher.Fire // the latest, newest first
	Trigger  string            // the trigger the firings are of, or ""
}

// recentFires is how many of the latest firings the page shows.
const recentFires = 100

func (s *Server) dispatcherPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ask(r)
	defer cancel()
	v := view{Title: "Dispatcher", Nav: "dispatcher"}
	d := dispatcherView{Trigger: r.URL.Query().Get("trigger")}
	var errs []string
	trs, err := s.cfg.Mesh.Triggers(ctx)
	if err != nil {
		errs = append(errs, err.Error())
	}
	d.Triggers = trs
	// The record is read oldest first a page at a time; the page keeps
	// the last ones (at most 50 pages: a longer record shows its latest
	// 50,000 firings' tail).
	req := dispatcher.FiresRequest{Trigger: d.Trigger, Limit: 1000}
	for range 50 {
		page, err := s.cfg.Mesh.Fires(ctx, req)
		if err != nil {
			errs = append(errs, err.Error())
			break
		}
		d.Fires = append(d.Fires, page.Fires...)
		if len(d.Fires) > recentFires {
			d.Fires = d.Fires[len(d.Fires)-recentFires:]
		}
		if page.Next == 0 {
			break
		}
		req.After = page.Next
	}
	slices.Reverse(d.Fires)
	v.Err, v.Data = strings.Join(errs, "; "), d
	s.render(w, r, "dispatcher", v)
}

// pauseRequest is the body of a pause or resume.
type pauseRequest struct {
	Trigger string `json:"trigger"`
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, pause bool) {
	if !s.checkAction(w, r) {
		return
	}
	var req pauseRequest
	if err := readJSON(w, r, &req); err != nil || req.Trigger == "" {
		writeJSONError(w, http.StatusBadRequest, "want {\"trigger\": NAME}")
		return
	}
	action := map[bool]string{true: "pause", false: "resume"}[pause]
	ctx, cancel := ask(r)
	defer cancel()
	resp, err := s.cfg.Mesh.Pause(ctx, req.Trigger, pause)
	a := Action{Action: action, Target: "trigger " + req.Trigger}
	if err != nil {
		a.Result = "failed: " + err.Error()
		s.record(r, a)
		writeJSONError(w, http.StatusBadGateway, err.Error())
		return
	}
	a.Result = map[bool]string{true: "paused", false: "consuming"}[resp.Paused]
	s.record(r, a)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) livePage(w http.ResponseWriter, r *http.Request) {
	pattern := r.URL.Query().Get("pattern")
	if pattern == "" {
		pattern = "#"
	}
	v := view{Title: "Live", Nav: "live", Data: map[string]string{"Pattern": pattern}}
	if err := wire.ValidatePattern(pattern); err != nil {
		v.Err = err.Error()
	}
	s.render(w, r, "live", v)
}

// liveEvent is one event as the live page gets it.
type liveEvent struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Source    string    `json:"source,omitempty"`
	Node      string    `json:"node,omitempty"`
	Causation string    `json:"causation,omitempty"`
	Time      time.Time `json:"time,omitzero"`
	Body      string    `json:"body"`
	Malformed string    `json:"malformed,omitempty"`
}

// liveBodyMax is how much of a body the live page gets.
const liveBodyMax = 2048

// maxStreams bounds the live pages open at once (each is a tail: a
// channel and a queue); streamWriteTimeout is how long one may take to
// read an event before its stream is ended.
const (
	maxStreams         = 32
	streamWriteTimeout = 10 * time.Second
)

// liveEvents streams the events matching ?pattern as server-sent events:
// "ready" once it listens, then one "event" per event. It ends when the
// page goes (or the console stops).
func (s *Server) liveEvents(w http.ResponseWriter, r *http.Request) {
	pattern := r.URL.Query().Get("pattern")
	if err := wire.ValidatePattern(pattern); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		writeJSONError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d live pages are open already: close one", maxStreams))
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeJSONError(w, http.StatusInternalServerError, "streaming unsupported")
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	send := func(kind string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		// A page that stops reading ends its stream, instead of the
		// tail's deliveries piling up in meshctl's memory behind it.
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", kind, b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	err := s.cfg.Mesh.Tail(r.Context(), pattern, func() { _ = send("ready", map[string]string{"pattern": pattern}) }, func(ev tailed) error {
		body := ev.Event.Body
		if len(body) > liveBodyMax {
			body = body[:liveBodyMax]
		}
		le := liveEvent{ID: ev.Event.ID, Type: ev.Event.Type, Source: ev.Event.Source, Node: ev.Event.Node,
			Causation: ev.Event.CausationID, Time: ev.Event.Time, Body: prettyBody(body)}
		if ev.Err != nil {
			le.Malformed = ev.Err.Error()
		}
		return send("event", le)
	})
	if err != nil && r.Context().Err() == nil {
		_ = send("failed", map[string]string{"error": err.Error()})
	}
}
