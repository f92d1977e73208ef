package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/internal/wire"
)

func TestEscape(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"empty", "", ""},
		{"plain", "module.shop.order.paid", "module.shop.order.paid"},
		{"other scripts and emoji", "Grüße, 世界, שלום, 👨‍👩‍👧 नमस्ते", "Grüße, 世界, שלום, 👨‍👩‍👧 नमस्ते"},
		{"CSI", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"clear screen", "\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"OSC 52 clipboard", "\x1b]52;c;cm0gLXJmIH4=\x07", `\x1b]52;c;cm0gLXJmIH4=\x07`},
		{"OSC 8 with ST", "\x1b]8;;http://x\x1b\\link", `\x1b]8;;http://x\x1b\link`},
		{"CR LF TAB", "ok\rforged\nline\tcell", `ok\rforged\nline\tcell`},
		{"NUL BEL BS", "\x00\x07\x08", `\x00\x07\x08`},
		{"DEL", "a\x7fb", `a\x7fb`},
		{"C1 CSI", "a\u009b2Jb", `a\u009b2Jb`},
		{"C1 NEL", "a\u0085b", `a\u0085b`},
		{"bidi override", "invoice_\u202egnp.exe", `invoice_\u202egnp.exe`},
		{"bidi isolates and marks", "\u2066a\u2069\u200f\u061c", `\u2066a\u2069\u200f\u061c`},
		{"zero width space", "bil\u200bling", `bil\u200bling`},
		{"BOM", "\ufeffx", `\ufeffx`},
		{"line and paragraph separators", "a\u2028b\u2029", `a\u2028b\u2029`},
		{"tag characters", "hi\U000e0041\U000e007f", `hi\U000e0041\U000e007f`},
		{"not UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
		{"surrogate bytes", "\xed\xa0\x80", `\xed\xa0\x80`},
		{"backslash stays", `C:\x1b and \n`, `C:\x1b and \n`},
		{"NBSP and soft hyphen", "a\u00a0b\u00adc", "a\u00a0b\\u00adc"},
	} {
		if got := escape(c.in); got != c.want {
			t.Errorf("%s: escape(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"a\nb", "a\nb"},
		{"a\r\nb\x1b[K", "a\\r\nb\\x1b[K"},
		{"\n\u202e\n", "\n\\u202e\n"},
	} {
		if got := escapeLines(c.in); got != c.want {
			t.Errorf("escapeLines(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestEscapeJSON: encoding/json escapes C0 controls in strings but leaves
// DEL, C1 controls and bidi characters as they are (and json.RawMessage
// its bytes); escapeJSON escapes them, and the JSON means the same.
func TestEscapeJSON(t *testing.T) {
	nasty := "\x1b[2J \x7f \u009b \u202e \u2066 \U000e0041 \xff"
	b, err := json.Marshal(map[string]any{"v": nasty, "raw": json.RawMessage("\"\u202e\u0085\"")})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexByte(b, 0x1b) >= 0 || !strings.Contains(string(b), "\u202e") || !strings.Contains(string(b), "\u009b") {
		t.Fatalf("encoding/json is not what this test assumes: %q", b)
	}
	for _, c := range []struct{ in, want string }{
		{string(b), `{"raw":"\u202e\u0085","v":"\u001b[2J \u007f \u009b \u202e \u2066 \udb40\udc41 \ufffd"}`},
		{`{"a": "x\u001by"}`, `{"a": "x\u001by"}`},
		{"{\n  \"a\": [\n\t1,\r\n  \"\u202e\"]\n}", "{\n  \"a\": [\n\t1, \n  \"\\u202e\"]\n}"},
		{`"\u202e"`, `"\u202e"`}, // escaped already: nothing to do
		{`"Grüße 👨‍👩‍👧"`, `"Grüße 👨‍👩‍👧"`},
	} {
		got := escapeJSON([]byte(c.in))
		if string(got) != c.want {
			t.Errorf("escapeJSON(%q) =\n%q, want\n%q", c.in, got, c.want)
		}
		var before, after any
		if json.Unmarshal([]byte(c.in), &before) != nil || json.Unmarshal(got, &after) != nil || !reflect.DeepEqual(before, after) {
			t.Errorf("escapeJSON(%q) = %q: not the same JSON", c.in, got)
		}
	}
}

// checkTerminalSafe fails unless out is UTF-8 with no character escape
// writes as an escape (but line feeds when lines, and also tabs when json).
func checkTerminalSafe(t *testing.T, in, out string, lines, json bool) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("%q -> %q: not UTF-8", in, out)
	}
	for _, r := range out {
		if escaped(r) && !(lines && r == '\n') && !(json && r == '\t') {
			t.Fatalf("%q -> %q: holds %U", in, out, r)
		}
	}
	if len(in) > 0 && len(out) == 0 {
		t.Fatalf("%q -> empty", in)
	}
}

// FuzzEscapeText: escape's output is UTF-8 without a control, format or
// separator character (escapeLines': but line feeds), never empty for a
// non-empty input, the input itself when it has nothing to escape, and
// strconv.Unquote gives the input back when it holds no backslash or
// double quote.
func FuzzEscapeText(f *testing.F) {
	for _, s := range []string{"", "plain", "\x1b[31mred", "\x1b]52;c;aGk=\x07", "a\r\nb", "\u202e", "\xff\xfe", "\U000e0041", "👨‍👩‍👧", `\x1b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		clean := utf8.ValidString(s)
		for _, r := range s {
			clean = clean && !escaped(r)
		}
		for _, lines := range []bool{false, true} {
			out := escapeText(s, lines)
			checkTerminalSafe(t, s, out, lines, false)
			if clean && out != s {
				t.Fatalf("%q has nothing to escape but became %q", s, out)
			}
			if strings.ContainsAny(s, `\"`) {
				continue
			}
			var back []string
			for _, part := range strings.Split(out, "\n") { // escape's has none
				u, err := strconv.Unquote(`"` + part + `"`)
				if err != nil {
					t.Fatalf("%q -> %q: %v", s, out, err)
				}
				back = append(back, u)
			}
			if got := strings.Join(back, "\n"); got != s {
				t.Fatalf("%q -> %q unquotes to %q", s, out, got)
			}
		}
	})
}

// FuzzEscapeJSON: escapeJSON's output has no character escape writes as
// an escape but line feeds and tabs, whatever the input; of valid JSON it
// is valid JSON with the same meaning.
func FuzzEscapeJSON(f *testing.F) {
	for _, s := range []string{`{"a":"\u001b"}`, "\"\u202e\u0085\x7f\"", "[1,\r2]", "{\n\t\"k\": \"\xff\"\n}", `"\ud83d\ude00"`, "\x1b[2J"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := escapeJSON(b)
		checkTerminalSafe(t, string(b), string(out), true, true)
		if !json.Valid(b) {
			return
		}
		var before, after any
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%q -> %q: %v", b, out, err)
		}
		if err := json.Unmarshal(b, &before); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("%q -> %q: %v, was %v", b, out, after, before)
		}
	})
}

// TestTailEscapes: an event published raw, with terminal control
// sequences in its routing key, a header and its body, is printed by
// `meshctl tail` escaped, and by `tail --json` as JSON, and neither prints
// ESC, BEL, CR or a bidi override as it is.
func TestTailEscapes(t *testing.T) {
	url := brokertest.VHost(t)
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type tailProc struct {
		cmd    *exec.Cmd
		mu     sync.Mutex
		out    bytes.Buffer
		follow chan struct{}
	}
	start := func(args ...string) *tailProc {
		p := &tailProc{cmd: exec.CommandContext(ctx, bin, append([]string{"--amqp-url", url, "tail"}, args...)...), follow: make(chan struct{})}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr, err := p.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "tail: following") {
					close(p.follow)
				}
			}
		}()
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := stdout.Read(buf)
				p.mu.Lock()
				p.out.Write(buf[:n])
				p.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		t.Cleanup(func() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		})
		select {
		case <-p.follow:
		case <-ctx.Done():
			t.Fatalf("tail %v never followed", args)
		}
		return p
	}
	human, asJSON := start("mesh.ops.#"), start("--json", "mesh.ops.#")

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const (
		key    = "mesh.ops.\x1b[2Jwiped"
		header = "\x1b]52;c;cm0gLXJmIH4=\x07\rapproved \u202eexe.txt"
		body   = "\x1b[31mred\x1b[0m \u009b2J"
	)
	err = ch.PublishWithContext(ctx, wire.ExchangeEvents, key, false, false, amqp.Publishing{
		Headers: amqp.Table{"x-note": header, "x-\x1b[8mkey": "v"}, ContentType: "application/octet-stream", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(p *tailProc, want string) string {
		t.Helper()
		for {
			p.mu.Lock()
			out := p.out.String()
			p.mu.Unlock()
			if strings.Contains(out, want) {
				return out
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("tail never printed %q; it printed %q", want, out)
			}
		}
	}
	out := wait(human, `\x1b[31mred\x1b[0m \u009b2J`)
	for _, want := range []string{`  mesh.ops.\x1b[2Jwiped` + "\n", `  x-note: \x1b]52;c;cm0gLXJmIH4=\x07\rapproved \u202eexe.txt` + "\n", `  x-\x1b[8mkey: v` + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("tail does not print %q:\n%s", want, out)
		}
	}
	jsonOut := wait(asJSON, `"x-note"`)
	for name, o := range map[string]string{"tail": out, "tail --json": jsonOut} {
		if strings.ContainsAny(o, "\x1b\x07\r\u202e\u009b") {
			t.Errorf("%s printed a control character as it is: %q", name, o)
		}
	}
	var got struct {
		Type    string
		Headers map[string]string
		Body    string
	}
	line, _, _ := strings.Cut(jsonOut, "\n")
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("tail --json line %q: %v", line, err)
	}
	if got.Type != key || got.Headers["x-note"] != header || got.Body != body {
		t.Errorf("tail --json does not give the event back: %+v", got)
	}
}
