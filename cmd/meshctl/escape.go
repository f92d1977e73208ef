package main

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What meshctl prints comes from the wire (headers, routing keys, bodies,
// a tool's answer and errors) or from modules (heartbeats, audit records),
// both untrusted: a value with ESC [ ..., OSC 52, \r or a bidi override
// could move the cursor, rewrite the screen, set the clipboard or reorder
// what the operator reads. Every human-readable printer writes such values
// through escape (or escapeLines); --json output goes through jsonWriter.

// escape returns s made safe to print on a terminal, on one line: C0 and
// C1 control characters and DEL are written as Go escapes (\n, \r, \t,
// \x1b, \u009b), Unicode's format characters (bidi embeddings, overrides
// and isolates, zero-width spaces, U+FEFF, tag characters; but not the
// zero-width joiners that emoji and several scripts need) and the line
// and paragraph separators as \u202e, \U000e0041, and bytes that are not
// UTF-8 as \xff. Other text, in any script, is left as it is; so is a
// backslash, so a value holding `\x1b` as text prints the same as one
// holding ESC (strconv.Unquote reverses escape for text with no backslash
// or double quote).
func escape(s string) string { return escapeText(s, false) }

// escapeLines is escape that keeps line feeds, for text printed over
// several lines (an error, a multi-line header value).
func escapeLines(s string) string { return escapeText(s, true) }

func escapeText(s string, lines bool) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || escaped(r) && !(lines && r == '\n') {
			break
		}
		i += size
	}
	if i == len(s) {
		return s // nothing to escape, the usual case
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !escaped(r) || lines && r == '\n':
			b.WriteString(s[i : i+size])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}

// escaped says whether escape writes r as an escape: a control character
// (C0, DEL, C1), a format character other than the zero-width
// (non-)joiners, or the line or paragraph separator.
func escaped(r rune) bool {
	switch {
	case r < 0x20 || r >= 0x7f && r < 0xa0:
		return true
	case r < 0xa0:
		return false // printable ASCII, the fast path
	case r == '\u200c' || r == '\u200d': // ZWNJ, ZWJ: emoji sequences, Persian, Indic scripts
		return false
	case r == '\u2028' || r == '\u2029':
		return true
	}
	return unicode.Is(unicode.Cf, r)
}

// escapeJSON returns JSON text b (valid JSON, as encoding/json writes it
// or validates it) safe to print on a terminal, and still the same JSON:
// encoding/json escapes C0 controls inside strings but writes DEL, C1
// controls and bidi or other format characters as they are, and a raw
// json.RawMessage keeps its bytes. Each such character becomes a \u
// escape (valid JSON only inside a string, which is the only place valid
// JSON can hold it); a byte that is not UTF-8 becomes \ufffd, as
// encoding/json decodes it; a carriage return, valid JSON only as
// whitespace between tokens, becomes a space. Line feeds, tabs and spaces
// stay: indented JSON stays indented.
func escapeJSON(b []byte) []byte {
	i := 0
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 || escaped(r) && r != '\n' && r != '\t' {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case !escaped(r) || r == '\n' || r == '\t':
			out = append(out, b[i:i+size]...)
		case r == '\r':
			out = append(out, ' ')
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

// jsonWriter writes JSON text to w through escapeJSON. Each Write must
// hold whole JSON values, as json.Encoder's and a Fprintf of one
// json.Marshal result do.
type jsonWriter struct{ w io.Writer }

func (j jsonWriter) Write(p []byte) (int, error) {
	if _, err := j.w.Write(escapeJSON(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
