package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"
)

// procLogTo is a node logger as a plugin module's is (the host's
// attributes: node, plugin, module), writing JSON into a buffer, and the
// pointer slogWriter reads it from.
func procLogTo(t *testing.T) (*atomic.Pointer[slog.Logger], *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("node", "anchor").With("plugin", "/opt/mesh/notifier").With("module", "notifier")
	var to atomic.Pointer[slog.Logger]
	to.Store(log)
	return &to, &buf
}

// logLines decodes the JSON lines of buf.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// hostsAttrsHold fails unless line carries the host's attributes, as the
// host set them, and no top-level key twice (a reader of the log would
// take one or the other).
func hostsAttrsHold(t *testing.T, raw string, line map[string]any) {
	t.Helper()
	for k, want := range map[string]string{"node": "anchor", "plugin": "/opt/mesh/notifier", "module": "notifier"} {
		if line[k] != want {
			t.Errorf("%s = %v, want the host's %q: %s", k, line[k], want, raw)
		}
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		if seen[k.(string)] {
			t.Errorf("%q twice at the top of %s", k, raw)
		}
		seen[k.(string)] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlogWriterKeepsTheHostsAttributes: a module process's line naming
// module, plugin, node, level or msg cannot change the node's log line's:
// its keys arrive under proc.
func TestSlogWriterKeepsTheHostsAttributes(t *testing.T) {
	to, buf := procLogTo(t)
	line := `{"@message":"x","@level":"warn","module":"billing","plugin":"/opt/mesh/billing","node":"other","level":"ERROR","msg":"forged","proc":"p","proc_dropped":9,"attempt":2}` + "\n"
	if n, err := (slogWriter{to: to}).Write([]byte(line)); n != len(line) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	got := logLines(t, buf)
	if len(got) != 1 {
		t.Fatalf("%d lines: %s", len(got), buf)
	}
	raw := strings.TrimSpace(buf.String())
	hostsAttrsHold(t, raw, got[0])
	if got[0]["msg"] != "x" || got[0]["level"] != "WARN" {
		t.Errorf("msg %v, level %v: want the line's x and WARN: %s", got[0]["msg"], got[0]["level"], raw)
	}
	if _, ok := got[0]["proc_dropped"]; ok {
		t.Errorf("the process set proc_dropped beside the host's attributes: %s", raw)
	}
	proc, _ := got[0]["proc"].(map[string]any)
	want := map[string]any{"module": "billing", "plugin": "/opt/mesh/billing", "node": "other", "level": "ERROR", "msg": "forged",
		"proc": "p", "proc_dropped": float64(9), "attempt": float64(2)}
	if fmt.Sprint(proc) != fmt.Sprint(want) {
		t.Errorf("proc = %v, want %v", proc, want)
	}
}

// TestPluginLoggerKeepsTheHostsAttributes: the same through hclog, as
// go-plugin logs what a process wrote to stderr (its JSON, whose keys
// override hclog's own: @module, @message).
func TestPluginLoggerKeepsTheHostsAttributes(t *testing.T) {
	to, buf := procLogTo(t)
	l := pluginLogger(to).Named("notifier")
	l.Error("paid", "module", "billing", "@module", "module", "plugin", "x", "time", "1999-01-01")
	got := logLines(t, buf)
	raw := strings.TrimSpace(buf.String())
	hostsAttrsHold(t, raw, got[0])
	proc, _ := got[0]["proc"].(map[string]any)
	if got[0]["level"] != "ERROR" || got[0]["msg"] != "paid" || proc["module"] != "billing" || proc["time"] != "1999-01-01" {
		t.Errorf("line %s", raw)
	}
	if got[0]["time"] == "1999-01-01" {
		t.Errorf("the process set the line's time: %s", raw)
	}
}

// TestSlogWriterBounds: a long message and long values are cut at 8 KiB
// and say so; past 32 attributes the rest are dropped and counted; a line
// that is not JSON is logged, cut the same way.
func TestSlogWriterBounds(t *testing.T) {
	to, buf := procLogTo(t)
	long := strings.Repeat("é", 10_000) // 20,000 bytes, 2 each: the cut falls inside a rune
	entry := map[string]any{"@message": long, "@level": "info", "value": long, strings.Repeat("k", 1000): 1,
		"nested": map[string]any{"list": []string{long}}, "small": map[string]any{"a": 1}}
	for i := range 40 {
		entry[fmt.Sprintf("z%02d", i)] = i
	}
	line, err := json.Marshal(entry)
	if err != nil {
		t.Fatal(err)
	}
	w := slogWriter{to: to}
	if _, err := w.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("not json " + long + "\n")); err != nil {
		t.Fatal(err)
	}
	got := logLines(t, buf)
	if len(got) != 2 {
		t.Fatalf("%d lines", len(got))
	}
	cut := func(what string, v any, prefix string) {
		t.Helper()
		s, _ := v.(string)
		mark := fmt.Sprintf("…[cut: %d bytes]", len(prefix)+len(long))
		if !strings.HasSuffix(s, mark) || len(s) > maxProcLogText+len(mark) || !strings.HasPrefix(s, prefix+"éé") || !utf8.ValidString(s) {
			t.Errorf("%s: %d bytes ending %q", what, len(s), s[max(0, len(s)-40):])
		}
	}
	cut("message", got[0]["msg"], "")
	cut("not json", got[1]["msg"], "not json ")
	proc, _ := got[0]["proc"].(map[string]any)
	cut("value", proc["value"], "")
	if len(proc) != maxProcLogAttrs {
		t.Errorf("%d attributes under proc, want %d", len(proc), maxProcLogAttrs)
	}
	// In key order: k..., nested, small, value, z00..z27; z28..z39 dropped.
	if got[0]["proc_dropped"] != float64(12) || proc["z27"] != float64(27) || proc["z28"] != nil {
		t.Errorf("proc_dropped %v, z27 %v, z28 %v", got[0]["proc_dropped"], proc["z27"], proc["z28"])
	}
	if n, ok := proc["nested"].(string); !ok || len(n) > maxProcLogText+40 || !strings.HasPrefix(n, `{"list":["éé`) {
		t.Errorf("nested: %.60q", proc["nested"])
	}
	if s, ok := proc["small"].(map[string]any); !ok || s["a"] != float64(1) {
		t.Errorf("small: %v", proc["small"])
	}
	for k := range proc {
		if len(k) > maxProcLogKey+40 {
			t.Errorf("a key of %d bytes", len(k))
		}
	}
}
