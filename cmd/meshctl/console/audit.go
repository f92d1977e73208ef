package console

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/meshkit/mesh/auditlogger"
	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/csvsafe"
	"github.com/meshkit/mesh/sdk"
)

// auditFilterOf reads the audit search's query parameters: the flags of
// `meshctl audit query` by the same names (type, source, node, user, id,
// causation and header and body as NAME=VALUE may repeat; from and to are
// RFC 3339 or a duration ago; malformed and dead are "1" or "on").
func auditFilterOf(q url.Values, now time.Time) (store.Filter, error) {
	f := store.Filter{Types: nonEmpty(q["type"]), Sources: nonEmpty(q["source"]), Nodes: nonEmpty(q["node"]),
		UserIDs: nonEmpty(q["user"]), IDs: nonEmpty(q["id"]), CausationIDs: nonEmpty(q["causation"])}
	for _, p := range []struct {
		name string
		to   *map[string]string
	}{{"header", &f.Headers}, {"body", &f.Body}} {
		for _, kv := range nonEmpty(q[p.name]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return f, fmt.Errorf("%s %q: want NAME=VALUE", p.name, kv)
			}
			if *p.to == nil {
				*p.to = map[string]string{}
			}
			(*p.to)[k] = v
		}
	}
	var err error
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{"from", &f.From}, {"to", &f.To}} {
		if *t.to, err = ParseTime(q.Get(t.name), now); err != nil {
			return f, fmt.Errorf("%s: %w", t.name, err)
		}
	}
	yes := true
	if on(q.Get("malformed")) {
		f.Malformed = &yes
	}
	if on(q.Get("dead")) {
		f.Dead = &yes
	}
	return f, nil
}

func on(s string) bool { return s == "1" || s == "on" || s == "true" }

// nonEmpty drops the empty values a form sends for fields left blank.
func nonEmpty(vs []string) []string {
	var out []string
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// ParseTime reads a time as the audit filters take it (the console's
// from and to, meshctl audit's --from and --to): RFC 3339, or a duration
// before now ("90m"); "" is the zero time.
func ParseTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("%q is neither RFC 3339 nor a duration", s)
	}
	return t, nil
}

// auditSearchView is the audit search page's data.
type auditSearchView struct {
	Q      url.Values
	Rows   []auditRow
	Next   string // the next page's URL, or ""
	First  string // the first page's URL, when this is not it
	Export string // the export's URL, without a format
	Asked  bool
	// Oldest says the page is oldest first (order=oldest); newest first
	// by default. Flip is the URL of the other order.
	Oldest bool
	Flip   string
}

// pageLimit is the default and the bound of events per page.
const (
	pageLimit    = 50
	maxPageLimit = 1000
)

func (s *Server) auditSearch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := view{Title: "Audit", Nav: "audit"}
	d := auditSearchView{Q: q, Asked: len(q) > 0}
	f, err := auditFilterOf(q, s.cfg.Now())
	if err != nil {
		v.Err, v.Data = err.Error(), d
		s.renderStatus(w, r, http.StatusBadRequest, "audit", v)
		return
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit <= 0 || limit > maxPageLimit {
		limit = pageLimit
	}
	after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
	d.Oldest = q.Get("order") == "oldest"
	fq := cloneValues(q)
	fq.Del("after")
	if d.Oldest {
		fq.Del("order")
	} else {
		fq.Set("order", "oldest")
	}
	d.Flip = "/audit?" + fq.Encode()
	ctx, cancel := ask(r)
	defer cancel()
	// Newest first by default: what just happened is what one looks for.
	page, err := s.cfg.Mesh.AuditQuery(ctx, auditlogger.QueryRequest{Filter: f, Page: store.Page{After: after, Limit: limit, Newest: !d.Oldest}})
	status := http.StatusOK
	if err != nil {
		v.Err, d.Asked, status = err.Error(), false, http.StatusBadGateway // no "no event matches": nothing was asked
	}
	d.Rows = rowsOf(page.Events)
	if page.Next != 0 {
		nq := cloneValues(q)
		nq.Set("after", strconv.FormatInt(page.Next, 10))
		d.Next = "/audit?" + nq.Encode()
	}
	if after != 0 {
		fq := cloneValues(q)
		fq.Del("after")
		d.First = "/audit?" + fq.Encode()
	}
	eq := cloneValues(q)
	eq.Del("after")
	eq.Del("limit")
	d.Export = "/audit/export?" + eq.Encode()
	v.Data = d
	s.renderStatus(w, r, status, "audit", v)
}

func cloneValues(q url.Values) url.Values {
	out := url.Values{}
	for k, vs := range q {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// auditExport writes every event the filter selects, oldest first, as
// JSON Lines (format=jsonl, the default) or CSV (format=csv, the columns
// of meshctl audit export --format csv), a page at a time as the audit
// logger answers.
func (s *Server) auditExport(w http.ResponseWriter, r *http.Request) {
	f, err := auditFilterOf(r.URL.Query(), s.cfg.Now())
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	format := r.URL.Query().Get("format")
	if format == "" {
		format = "jsonl"
	}
	var write func(store.Event) error
	var fail func(error)
	done := func() {}
	name := "audit-" + s.cfg.Now().UTC().Format("20060102T150405Z")
	switch format {
	case "jsonl":
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		write = func(ev store.Event) error { return enc.Encode(ev) }
		fail = func(err error) { _ = enc.Encode(map[string]string{"export_error": err.Error()}) }
	case "csv":
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		cw := csv.NewWriter(w)
		_ = cw.Write(store.CSVHeader) // buffered: sent with the first page, or lost with an error before it
		write = func(ev store.Event) error {
			if err := cw.Write(csvsafe.Row(ev.CSVRecord())); err != nil {
				return err
			}
			cw.Flush()
			return cw.Error()
		}
		fail = func(err error) { _ = cw.Write(csvsafe.Row([]string{"export_error", err.Error()})); cw.Flush() }
		done = cw.Flush
	default:
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("format %q: want jsonl or csv", format))
		return
	}
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+"."+format+`"`)
	req := auditlogger.QueryRequest{Filter: f, Page: store.Page{Limit: maxPageLimit}}
	wrote := false
	for {
		ctx, cancel := ask(r)
		page, err := s.cfg.Mesh.AuditQuery(ctx, req)
		cancel()
		if err != nil {
			if !wrote {
				w.Header().Del("Content-Disposition")
				writeJSONError(w, http.StatusBadGateway, err.Error())
				return
			}
			// Past the first page the status is sent: the export ends
			// short, and a last line says why.
			fail(err)
			return
		}
		for _, ev := range page.Events {
			if err := write(ev); err != nil {
				return
			}
			wrote = true
		}
		if page.Next == 0 {
			done()
			return
		}
		req.Page.After = page.Next
	}
}

// auditEventView is an event's page data.
type auditEventView struct {
	Event   store.Event
	Cause   string // the cause's page, when it has one
	Effects []auditRow
	More    string // the search for all its effects, when there are more
}

// maxEffects is how many effects an event's page lists.
const maxEffects = 100

func (s *Server) auditEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := ask(r)
	defer cancel()
	ev, err := s.cfg.Mesh.AuditGet(ctx, id)
	if err != nil {
		s.fail(w, r, statusOf(err), "Event "+id, err.Error())
		return
	}
	d := auditEventView{Event: ev}
	if ev.CausationID != "" {
		d.Cause = eventLink(ev.CausationID)
	}
	v := view{Title: "Event " + ev.ID, Nav: "audit"}
	page, err := s.cfg.Mesh.AuditQuery(ctx, auditlogger.QueryRequest{Filter: store.Filter{CausationIDs: []string{ev.ID}}, Page: store.Page{Limit: maxEffects}})
	if err != nil {
		v.Err = "its effects: " + err.Error()
	}
	d.Effects = rowsOf(page.Events)
	if page.Next != 0 {
		d.More = "/audit?" + url.Values{"causation": {ev.ID}}.Encode()
	}
	v.Data = d
	s.render(w, r, "event", v)
}

// statusOf is the HTTP status of what the audit logger said: 404 for an
// event it does not hold, 502 for the rest.
func statusOf(err error) int {
	var te *sdk.ToolError
	if errors.As(err, &te) && te.Code == "not_found" {
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}

// traceView is a trace page's data.
type traceView struct {
	ID           string
	Causes       []auditRow // the root cause first
	Tree         *treeNode
	Timeline     svgTimeline
	Truncated    bool
	MissingCause string
}

// treeNode is an event of the trace's tree.
type treeNode struct {
	auditRow
	Focus  bool // the event the trace is of
	Caused []*treeNode
}

func (s *Server) auditTrace(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := ask(r)
	defer cancel()
	tr, err := s.cfg.Mesh.AuditTrace(ctx, id, 0)
	if err != nil {
		s.fail(w, r, statusOf(err), "Trace of "+id, err.Error())
		return
	}
	d := traceView{ID: id, Truncated: tr.Truncated, MissingCause: tr.MissingCause}
	for i := len(tr.Causes) - 1; i >= 0; i-- {
		d.Causes = append(d.Causes, auditRow{Event: tr.Causes[i], Link: eventLink(tr.Causes[i].ID)})
	}
	var walk func(c *store.Caused) *treeNode
	walk = func(c *store.Caused) *treeNode {
		n := &treeNode{auditRow: auditRow{Event: c.Event, Link: eventLink(c.Event.ID)}, Focus: c.Event.ID == id}
		for _, k := range c.Caused {
			n.Caused = append(n.Caused, walk(k))
		}
		return n
	}
	if tr.Root != nil {
		d.Tree = walk(tr.Root)
	}
	d.Timeline = layoutTimeline(tr, id)
	s.render(w, r, "trace", view{Title: "Trace of " + id, Nav: "audit", Data: d})
}
