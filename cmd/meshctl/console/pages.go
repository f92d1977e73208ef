package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// pages are the parsed templates, one set per page.
type pages struct {
	byName map[string]*template.Template
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"timeText":     timeText,
	"ago":          ago,
	"pretty":       prettyBody,
	"join":         strings.Join,
	"query":        func(k, v string) string { return url.Values{k: {v}}.Encode() },
	"path":         url.PathEscape,
	"rate":         func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"upper":        strings.ToUpper,
	"add":          func(a, b int) int { return a + b },
	"ownsText":     ownsText,
	"filterFields": func() []filterField { return filterFields },
	"sortedHeaders": func(h map[string]string) []header {
		out := make([]header, 0, len(h))
		for k, v := range h {
			out = append(out, header{k, v})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out
	},
}

// filterField is a repeatable field of the audit search.
type filterField struct{ Name, Label, Hint string }

// filterFields are the audit search's repeatable fields, named as
// `meshctl audit query`'s flags.
var filterFields = []filterField{
	{"type", "type", "AMQP topic pattern: module.umami.#"},
	{"source", "source", "emitting module"},
	{"node", "node", "emitting node"},
	{"user", "user", "broker user that published it"},
	{"id", "id", "event id"},
	{"causation", "causation", "causing event id"},
	{"header", "header", "NAME=VALUE"},
	{"body", "body", "PATH=JSON: order.id=42"},
}

// header is one header, for a sorted list.
type header struct{ Name, Value string }

func loadPages() (*pages, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("console: layout: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	p := &pages{byName: map[string]*template.Template{}}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("console: page %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// view is what every page gets: its own data and the layout's.
type view struct {
	Title    string
	Nav      string // the section it belongs to, for the menu
	CSRF     string
	ReadOnly bool
	Err      string // an error to show above the page (the page may be partial)
	Data     any
}

// render writes the page name with data; an error in rendering is a 500
// (the page is built in memory first, so nothing half-written is sent).
func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, v view) {
	s.renderStatus(w, r, http.StatusOK, name, v)
}

// renderStatus is render with another status than 200.
func (s *Server) renderStatus(w http.ResponseWriter, r *http.Request, status int, name string, v view) {
	v.CSRF, v.ReadOnly = s.csrfFor(callerFrom(r)), s.readOnly(r)
	t, ok := s.pages.byName[name]
	if !ok {
		http.Error(w, "no page "+name, http.StatusInternalServerError)
		return
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "layout.html", v); err != nil {
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail renders the error page with status.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	s.renderStatus(w, r, status, "error", view{Title: title, Err: msg})
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// ago says how long before now t was, coarsely ("3s", "4m", "2h").
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roughly(time.Since(t))
}

func roughly(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// prettyBody is a body indented when it is JSON, as text when it is
// UTF-8, and said to be binary otherwise.
func prettyBody(b []byte) string {
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") == nil {
		return out.String()
	}
	if isText(b) {
		return string(b)
	}
	return fmt.Sprintf("(%d bytes, not text)", len(b))
}

func isText(b []byte) bool {
	s := string(b)
	for _, r := range s {
		if r == 0xFFFD || (r < 0x20 && r != '\n' && r != '\t' && r != '\r') {
			return false
		}
	}
	return true
}

// writeJSON writes v as the response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONError writes {"error": msg}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// eventLink is the page of an audited event.
func eventLink(id string) string { return "/audit/event/" + url.PathEscape(id) }

// auditEvents are events for a table: each with its page.
type auditRow struct {
	store.Event
	Link string
}

func rowsOf(evs []store.Event) []auditRow {
	out := make([]auditRow, 0, len(evs))
	for _, ev := range evs {
		out = append(out, auditRow{Event: ev, Link: eventLink(ev.ID)})
	}
	return out
}
