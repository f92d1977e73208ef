package console

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/internal/deadletters"
	"github.com/meshkit/mesh/internal/wire"
)

// clock is a clock a test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// browserClient is a client with a cookie jar of its own that follows no
// redirect: a browser, as far as the console can tell.
func browserClient(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// send sends a request with client (testToken is not sent: only what h
// says and the client's cookies).
func send(t *testing.T, client *http.Client, method, u, body string, h map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp, b.String()
}

// metaCSRF is the CSRF token in a page's meta tag, or "".
func metaCSRF(page string) string {
	_, rest, ok := strings.Cut(page, `<meta name="mesh-csrf" content="`)
	if !ok {
		return ""
	}
	tok, _, _ := strings.Cut(rest, `"`)
	return tok
}

// waitJob polls a job until it finishes (the fake acts at once: the job
// says so when its goroutine ends).
func waitJob(t *testing.T, client *http.Client, base, id string, h map[string]string) job {
	t.Helper()
	for {
		_, b := send(t, client, http.MethodGet, base+"/api/jobs/"+id, "", h)
		var jb job
		if err := json.Unmarshal([]byte(b), &jb); err != nil {
			t.Fatalf("job %s: %v: %s", id, err, b)
		}
		if jb.Finished {
			return jb
		}
	}
}

// TestALocalProcessWithoutTheSecretGetsNothing is issue 47: a console on
// loopback given no token at all is not open to a process of its own
// host. That process gets the login page and nothing else: not a page
// with a CSRF token, not the audit export, not the live stream, and its
// purge is refused (401) with whatever it could scrape. The one-time
// login URL logs one browser in, once; the action that browser takes is
// logged with "login-url".
func TestALocalProcessWithoutTheSecretGetsNothing(t *testing.T) {
	var logged bytes.Buffer
	var logMu sync.Mutex
	f := &fakeMesh{kept: []deadletters.Message{{ID: "u1", Type: "mesh.a.b"}},
		events: map[string]store.Event{"x": {ID: "x", Type: "mesh.secret.thing", Body: []byte(`{"card":"4111"}`)}}}
	clk := &clock{now: time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)}
	s, ts := serveOn(t, f, Config{Now: clk.Now, Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logged}, nil))}, httptest.NewUnstartedServer(nil), false)

	attacker := browserClient(t)
	// Every page it asks for sends it to the login page; every API call
	// is refused.
	for _, p := range []string{"/", "/audit", "/audit/export", "/audit/export?format=csv", "/audit/event/x", "/live", "/unrouted", "/graph?format=json"} {
		resp, body := send(t, attacker, http.MethodGet, ts.URL+p, "", nil)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") {
			t.Errorf("GET %s: %d to %q, want 303 to the login page", p, resp.StatusCode, resp.Header.Get("Location"))
		}
		if strings.Contains(body, "4111") || strings.Contains(body, "secret") {
			t.Errorf("GET %s gave away an event: %s", p, body)
		}
	}
	for _, p := range []string{"/api/live?pattern=%23", "/api/jobs/1"} {
		if resp, _ := send(t, attacker, http.MethodGet, ts.URL+p, "", nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s: %d, want 401", p, resp.StatusCode)
		}
	}
	// What it can scrape: the login page's CSRF token (none), or a guess.
	_, login := send(t, attacker, http.MethodGet, ts.URL+"/login", "", nil)
	scraped := metaCSRF(login)
	if scraped != "" {
		t.Errorf("the login page has a CSRF token: %q", scraped)
	}
	for _, h := range []map[string]string{
		{"X-Mesh-CSRF": scraped}, {"X-Mesh-CSRF": "guess"}, {"X-Mesh-CSRF": scraped, "Authorization": "Bearer "},
		{"X-Mesh-CSRF": scraped, "Cookie": cookieName + "="}, {"X-Mesh-CSRF": scraped, "Cookie": cookieName + "=guess", "Origin": ts.URL},
	} {
		if resp, body := send(t, attacker, http.MethodPost, ts.URL+"/api/unrouted/purge", `{"ids":["u1"]}`, h); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a purge with %v: %d %s, want 401", h, resp.StatusCode, body)
		}
	}
	f.mu.Lock()
	if len(f.purged)+len(f.actions) != 0 {
		t.Errorf("refused purges reached the mesh: %v %v", f.purged, f.actions)
	}
	f.mu.Unlock()

	// The login URL: once.
	u := s.LoginURL(ts.URL)
	if !strings.HasPrefix(u, ts.URL+"/login?once=") {
		t.Fatalf("login URL %q", u)
	}
	operator := browserClient(t)
	resp, _ := send(t, operator, http.MethodGet, u+"&next="+url.QueryEscape("/unrouted"), "", nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/unrouted" {
		t.Fatalf("the login URL: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if c := resp.Cookies(); len(c) != 1 || c[0].Name != cookieName || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Path != "/" {
		t.Errorf("the login URL's cookie: %+v", c)
	}
	resp, page := send(t, operator, http.MethodGet, ts.URL+"/", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("logged in by the login URL, /: %d", resp.StatusCode)
	}
	if resp, _ := send(t, browserClient(t), http.MethodGet, u, "", nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("the login URL a second time: %d, cookies %v; want 401 and none", resp.StatusCode, resp.Cookies())
	}
	// Its CSRF token is the logged-in browser's own: the attacker can
	// use it no more than its own.
	csrf := metaCSRF(page)
	if resp, _ := send(t, attacker, http.MethodPost, ts.URL+"/api/unrouted/purge", `{"ids":["u1"]}`, map[string]string{"X-Mesh-CSRF": csrf}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the attacker with the operator's CSRF token: %d, want 401", resp.StatusCode)
	}
	resp, body := send(t, operator, http.MethodPost, ts.URL+"/api/unrouted/purge", `{"ids":["u1"]}`, map[string]string{"X-Mesh-CSRF": csrf, "Origin": ts.URL})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the operator's purge: %d %s", resp.StatusCode, body)
	}
	var started struct{ Job string }
	if err := json.Unmarshal([]byte(body), &started); err != nil {
		t.Fatal(err)
	}
	waitJob(t, operator, ts.URL, started.Job, nil)
	f.mu.Lock()
	if len(f.actions) != 1 || f.actions[0].Who != "login-url (tester)" || f.actions[0].Auth != "login-url" || f.actions[0].Target != wire.QueueUnrouted {
		t.Errorf("the action recorded: %+v", f.actions)
	}
	f.mu.Unlock()
	logMu.Lock()
	if s := logged.String(); !strings.Contains(s, `who="login-url (tester)"`) || !strings.Contains(s, "auth=login-url") || strings.Contains(s, "loopback") {
		t.Errorf("the log: %s", s)
	}
	logMu.Unlock()

	// A code expires: good for LoginCodeTTL, not after.
	late := s.LoginURL(ts.URL)
	clk.add(LoginCodeTTL)
	if resp, _ := send(t, browserClient(t), http.MethodGet, late, "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a login URL %v old: %d, want 401", LoginCodeTTL, resp.StatusCode)
	}
	inTime := s.LoginURL(ts.URL)
	clk.add(LoginCodeTTL - time.Second)
	if resp, _ := send(t, browserClient(t), http.MethodGet, inTime, "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a login URL just in time: %d, want 303", resp.StatusCode)
	}
}

// lockedWriter is a writer for a logger that the test reads meanwhile.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestOperatorTokens: the tokens of a TokenFile let their holders in by
// name; a read-only one views and is refused every action; each token's
// pages carry a CSRF token of its own; a token revoked (or a file made
// writable by others) is refused from the next request, without a
// restart.
func TestOperatorTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mesh", "console-tokens")
	tf := OpenTokenFile(path)
	now := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	alice, err := tf.Add("alice", false, now)
	if err != nil {
		t.Fatal(err)
	}
	viewer, err := tf.Add("viewer", true, now)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMesh{}
	_, ts := serve(t, f, Config{Tokens: tf.Tokens})
	as := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("testToken, not given: %d", resp.StatusCode)
	}
	resp, alicePage := do(t, http.MethodGet, ts.URL+"/", "", as(alice))
	if resp.StatusCode != http.StatusOK || strings.Contains(alicePage, `class="read-only"`) {
		t.Fatalf("alice: %d", resp.StatusCode)
	}
	resp, viewerPage := do(t, http.MethodGet, ts.URL+"/dispatcher", "", as(viewer))
	if resp.StatusCode != http.StatusOK || !strings.Contains(viewerPage, `class="read-only"`) {
		t.Fatalf("viewer: %d, or the page is not read-only", resp.StatusCode)
	}
	aliceCSRF, viewerCSRF := metaCSRF(alicePage), metaCSRF(viewerPage)
	if aliceCSRF == "" || aliceCSRF == viewerCSRF {
		t.Errorf("CSRF tokens: alice %q, viewer %q: want two, not the same", aliceCSRF, viewerCSRF)
	}
	for _, p := range []string{"/api/dispatcher/pause", "/api/dlq/purge", "/api/unrouted/replay"} {
		body := `{"ids":["a"],"queue":"q"}`
		if strings.Contains(p, "dispatcher") {
			body = `{"trigger":"orders"}`
		}
		h := as(viewer)
		h["X-Mesh-CSRF"] = viewerCSRF
		if resp, b := do(t, http.MethodPost, ts.URL+p, body, h); resp.StatusCode != http.StatusForbidden || !strings.Contains(b, "viewer is read-only") {
			t.Errorf("the read-only token, %s: %d %s", p, resp.StatusCode, b)
		}
	}
	h := as(alice)
	h["X-Mesh-CSRF"] = viewerCSRF
	if resp, b := do(t, http.MethodPost, ts.URL+"/api/dispatcher/pause", `{"trigger":"orders"}`, h); resp.StatusCode != http.StatusForbidden {
		t.Errorf("alice with the viewer's CSRF token: %d %s", resp.StatusCode, b)
	}
	if len(f.paused)+len(f.purged)+len(f.actions) != 0 {
		t.Fatalf("refused actions reached the mesh: %v %v %v", f.paused, f.purged, f.actions)
	}
	h["X-Mesh-CSRF"] = aliceCSRF
	if resp, b := do(t, http.MethodPost, ts.URL+"/api/dispatcher/pause", `{"trigger":"orders"}`, h); resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's pause: %d %s", resp.StatusCode, b)
	}
	if len(f.actions) != 1 || f.actions[0].Who != "alice (tester)" || f.actions[0].Auth != "token" {
		t.Errorf("the action recorded: %+v", f.actions)
	}

	// Logged in by the form, alice's browser holds her token; revoked,
	// it is refused at once, the cookie too.
	browser := browserClient(t)
	resp, _ = send(t, browser, http.MethodPost, ts.URL+"/login", url.Values{"token": {alice}}.Encode(), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("alice's login: %d", resp.StatusCode)
	}
	if resp, _ := send(t, browser, http.MethodGet, ts.URL+"/", "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's browser: %d", resp.StatusCode)
	}
	if err := tf.Revoke("alice"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", as(alice)); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("alice's token, revoked: %d, want 303 to the login page", resp.StatusCode)
	}
	if resp, _ := send(t, browser, http.MethodGet, ts.URL+"/", "", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("alice's browser, her token revoked: %d, want 303 to the login page", resp.StatusCode)
	}
	if resp, _ := do(t, http.MethodPost, ts.URL+"/api/dispatcher/resume", `{"trigger":"orders"}`, h); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("alice's action, her token revoked: %d, want 401", resp.StatusCode)
	}
	// A token added while the console runs works at once.
	bob, err := tf.Add("bob", false, now)
	if err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", as(bob)); resp.StatusCode != http.StatusOK {
		t.Errorf("bob, added while it runs: %d", resp.StatusCode)
	}
	// A file anyone may write gives no token.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, http.MethodGet, ts.URL+"/", "", as(bob)); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("bob, the file writable by all: %d, want 303", resp.StatusCode)
	}
	if _, err := tf.Tokens(); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("the file writable by all: %v", err)
	}
}

// TestTokenFile: Add keeps only the SHA-256, in a 0600 file; names are
// checked and unique; Revoke removes one; a malformed file gives none.
func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	tf := OpenTokenFile(filepath.Join(dir, "sub", "tokens"))
	if ts, err := tf.Tokens(); err != nil || len(ts) != 0 {
		t.Fatalf("a missing file: %v, %v; want no token and no error", ts, err)
	}
	now := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	secret, err := tf.Add("ci-deploy", true, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(secret) < 32 {
		t.Errorf("secret %q", secret)
	}
	b, err := os.ReadFile(tf.Path())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) {
		t.Error("the file holds the secret")
	}
	if fi, _ := os.Stat(tf.Path()); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	ts, err := tf.Tokens()
	if err != nil || len(ts) != 1 || ts[0].Name != "ci-deploy" || !ts[0].ReadOnly || ts[0].SHA256 != HashToken(secret) || !ts[0].Created.Equal(now) {
		t.Fatalf("tokens: %+v, %v", ts, err)
	}
	for _, name := range []string{"ci-deploy", "", "a b", "-x", "login-url", "token-file", strings.Repeat("x", 65), "évé"} {
		if _, err := tf.Add(name, false, now); err == nil {
			t.Errorf("Add(%q): no error", name)
		}
	}
	if err := tf.Revoke("nobody"); !errors.Is(err, ErrNoToken) {
		t.Errorf("Revoke(nobody): %v, want ErrNoToken", err)
	}
	if err := tf.Revoke("ci-deploy"); err != nil {
		t.Fatal(err)
	}
	if ts, err := tf.Tokens(); err != nil || len(ts) != 0 {
		t.Errorf("after the revoke: %+v, %v", ts, err)
	}

	h := strings.Repeat("ab", 32)
	for _, c := range []struct{ text, err string }{
		{"# only a comment\n\nalice " + h + " read-write 2026-12-03T14:00:00Z\n", ""},
		{"alice " + h + " read-write\n", "want NAME"},
		{"alice " + h[:62] + " read-write 2026-12-03T14:00:00Z\n", "64 hex digits"},
		{"alice " + h + " admin 2026-12-03T14:00:00Z\n", "access"},
		{"alice " + h + " read-only yesterday\n", "RFC 3339"},
		{"login-url " + h + " read-only 2026-12-03T14:00:00Z\n", "reserved"},
		{"alice " + h + " read-only 2026-12-03T14:00:00Z\nalice " + h + " read-only 2026-12-03T14:00:00Z\n", "twice"},
	} {
		p := filepath.Join(dir, "t")
		if err := os.WriteFile(p, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		ts, err := OpenTokenFile(p).Tokens()
		switch {
		case c.err == "" && (err != nil || len(ts) != 1):
			t.Errorf("%q: %v, %v", c.text, ts, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || len(ts) != 0):
			t.Errorf("%q: %v, %v; want no token and an error saying %q", c.text, ts, err, c.err)
		}
	}
}

// TestTLSCookie: over TLS the login cookie is __Host-, Secure, HttpOnly,
// SameSite=Strict and for the whole host; a plain one is not read.
func TestTLSCookie(t *testing.T) {
	s, ts := serveOn(t, &fakeMesh{}, Config{Token: testToken}, httptest.NewUnstartedServer(nil), true)
	client := ts.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	check := func(what string, resp *http.Response) {
		t.Helper()
		c := resp.Cookies()
		if resp.StatusCode != http.StatusSeeOther || len(c) != 1 || c[0].Name != "__Host-mesh_console" || !c[0].Secure || !c[0].HttpOnly ||
			c[0].SameSite != http.SameSiteStrictMode || c[0].Path != "/" || c[0].Domain != "" {
			t.Errorf("%s over TLS: %d, cookies %+v", what, resp.StatusCode, c)
		}
	}
	resp, _ := send(t, client, http.MethodPost, ts.URL+"/login", "token="+testToken, map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	check("the login form", resp)
	resp, _ = send(t, client, http.MethodGet, s.LoginURL(ts.URL), "", nil)
	check("a login URL", resp)
	if resp, _ := send(t, client, http.MethodGet, ts.URL+"/", "", map[string]string{"Cookie": "mesh_console=" + testToken}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a plain cookie over TLS: %d, want 303", resp.StatusCode)
	}
	if resp, _ := send(t, client, http.MethodGet, ts.URL+"/", "", map[string]string{"Cookie": "__Host-mesh_console=" + testToken}); resp.StatusCode != http.StatusOK {
		t.Errorf("the __Host- cookie over TLS: %d, want 200", resp.StatusCode)
	}
}

// TestCSVExportNeutralisesFormulas: a cell a spreadsheet would run as a
// formula (=, +, -, @, tab, CR first) gets a quote before it; the others
// are as they were.
func TestCSVExportNeutralisesFormulas(t *testing.T) {
	f := &fakeMesh{events: map[string]store.Event{
		"evil": {ID: `=HYPERLINK("http://evil.example","x")`, Type: "mesh.a.b", Source: "@SUM(A1)", UserID: "+cmd|'/c calc'!A0", Malformed: "-2+3",
			Node: "\tnode", CausationID: "\rcause", Body: []byte(`-1`)},
		"plain": {ID: "01JPLAIN", Type: "mesh.a.b", Source: "shop", UserID: "guest", Body: []byte(`{"a":1}`)},
	}}
	_, ts := serve(t, f, Config{})
	resp, body := do(t, http.MethodGet, ts.URL+"/audit/export?format=csv", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("export: %d %s", resp.StatusCode, body)
	}
	rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil || len(rows) != 3 {
		t.Fatalf("rows %v, %v", rows, err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, row := range rows[1:] {
		if row[col["source"]] == "shop" {
			if row[col["id"]] != "01JPLAIN" || row[col["user_id"]] != "guest" || row[col["body"]] != `{"a":1}` {
				t.Errorf("a plain row changed: %v", row)
			}
			continue
		}
		for name, want := range map[string]string{"id": `'=HYPERLINK("http://evil.example","x")`, "source": "'@SUM(A1)", "user_id": "'+cmd|'/c calc'!A0",
			"malformed": "'-2+3", "node": "'\tnode", "causation_id": "'\rcause", "body": "'-1"} {
			if got := row[col[name]]; got != want {
				t.Errorf("%s: %q, want %q", name, got, want)
			}
		}
	}
}
