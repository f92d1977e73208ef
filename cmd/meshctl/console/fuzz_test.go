package console

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzSafeNext: whatever a login form's next says, the console sends the
// browser to a path of its own, never to another site.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/", "/audit?type=a.b.c", "//evil.example", "/\\evil", "https://evil.example/", "javascript:alert(1)", "", "/%2F%2Fevil", "/\t/evil.example", "/\r\n/evil"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := safeNext(next)
		if !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") || strings.ContainsAny(got, "\\") {
			t.Fatalf("safeNext(%q) = %q: not a local path", next, got)
		}
		// What browsers drop from a URL (tabs, newlines) could make one
		// of another site: none is left.
		if strings.IndexFunc(got, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
			t.Fatalf("safeNext(%q) = %q keeps a control character", next, got)
		}
		u, err := url.Parse(got)
		if err == nil && (u.Scheme != "" || u.Host != "") {
			t.Fatalf("safeNext(%q) = %q leaves the console (%q, %q)", next, got, u.Scheme, u.Host)
		}
	})
}

// FuzzAuditFilterOf: any query string is read into a filter or refused
// with an error, never a panic; what it reads, it reads as given.
func FuzzAuditFilterOf(f *testing.F) {
	for _, s := range []string{"type=module.%23&source=a", "header=x-schema%3D2&body=order.id%3D42", "from=1h&to=2026-12-01T00:00:00Z", "header=novalue", "from=yesterday", "malformed=1&dead=on", "%zz"} {
		f.Add(s)
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := auditFilterOf(q, now)
		if err != nil {
			return
		}
		for _, ty := range flt.Types {
			if strings.TrimSpace(ty) == "" || !contains(q["type"], ty) {
				t.Fatalf("type %q not as given in %v", ty, q["type"])
			}
		}
		for k := range flt.Headers {
			if k == "" {
				t.Fatal("a header filter without a name")
			}
		}
	})
}

func contains(vs []string, s string) bool {
	for _, v := range vs {
		if strings.TrimSpace(v) == s {
			return true
		}
	}
	return false
}

// FuzzParseTokens: any tokens file is read into tokens or refused with an
// error, never a panic; what it reads has valid, distinct names.
func FuzzParseTokens(f *testing.F) {
	h := strings.Repeat("ab", 32)
	for _, s := range []string{"# c\nalice " + h + " read-write 2026-12-03T14:00:00Z\n", "bob " + h + " read-only 2026-12-03T14:00:00Z\r\nbob x", "login-url " + h + " read-only x", "", "\x00 \x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		ts, err := parseTokens("f", []byte(text))
		if err != nil {
			if ts != nil {
				t.Fatalf("an error and tokens: %v", ts)
			}
			return
		}
		seen := map[string]bool{}
		for _, tk := range ts {
			if ValidTokenName(tk.Name) != nil || seen[tk.Name] {
				t.Fatalf("token %q read from %q", tk.Name, text)
			}
			seen[tk.Name] = true
		}
	})
}
