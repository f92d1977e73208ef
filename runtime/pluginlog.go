package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
)

// What one line of a module process's log may put in the node's log. The
// process is not trusted: without bounds, one line could fill the node's
// log, or its disk.
const (
	// maxProcLogText bounds, in bytes, a line's message and each of its
	// values; longer text is cut and ends with "…[cut: N bytes]".
	maxProcLogText = 8 << 10
	// maxProcLogKey bounds, in bytes, an attribute's key.
	maxProcLogKey = 128
	// maxProcLogAttrs bounds a line's attributes; the rest, in key order,
	// are dropped and counted (procGroup+"_dropped").
	maxProcLogAttrs = 32
)

// procGroup is the group a module process's own attributes are logged
// under: {"msg":"...","module":"billing","proc":{"attempt":1}} with
// slog's JSON handler, proc.attempt=1 with its text handler.
const procGroup = "proc"

// pluginLogger is the hclog.Logger go-plugin logs a module process through
// (its own messages and every line the process writes to stderr, at the
// level the line says). It writes hclog's JSON lines into a writer that
// logs each one to the node's slog logger, tagged with the module; see
// slogWriter for what of a line arrives, and where.
func pluginLogger(to *atomic.Pointer[slog.Logger]) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "module",
		Level:      hclog.Trace, // the slog handler decides what to keep
		JSONFormat: true,
		Output:     slogWriter{to: to},
	})
}

// slogWriter logs each hclog JSON line written to it to the logger in to
// (the node's, with the host's attributes: plugin, module, and what the
// node's logger carries), at the line's level, with its message.
//
// The line's other keys are the process's: they are logged in the group
// procGroup, never beside the host's attributes, so a process cannot set
// or shadow module, plugin, node, level or msg of the node's own log line
// (a line of one module saying it is another). go-plugin's own messages
// (plugin started, exited, with path and pid) come through the same
// writer and look the same: a line says nothing the process could not
// have written, so none is trusted more. The message and each value are
// cut at maxProcLogText, a key at maxProcLogKey, the attributes at
// maxProcLogAttrs; nothing else is changed or escaped (the node's handler
// quotes what it writes). A line that is not JSON is logged at info, cut
// the same way.
type slogWriter struct {
	to *atomic.Pointer[slog.Logger]
}

func (w slogWriter) Write(p []byte) (int, error) {
	log := w.to.Load()
	for _, line := range bytes.Split(p, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var entry map[string]any
		if err := json.Unmarshal(line, &entry); err != nil {
			log.Info(cutText(string(line), maxProcLogText))
			continue
		}
		msg, _ := entry["@message"].(string)
		level, _ := entry["@level"].(string)
		keys := make([]string, 0, len(entry))
		for k := range entry {
			if strings.HasPrefix(k, "@") || k == "timestamp" { // hclog's, and go-plugin's copy of the process's time
				continue
			}
			keys = append(keys, k)
		}
		slices.Sort(keys) // the order hclog wrote them in, and which are kept past the bound
		dropped := 0
		if len(keys) > maxProcLogAttrs {
			dropped = len(keys) - maxProcLogAttrs
			keys = keys[:maxProcLogAttrs]
		}
		attrs := make([]any, 0, len(keys))
		for _, k := range keys {
			attrs = append(attrs, slog.Any(cutText(k, maxProcLogKey), boundValue(entry[k])))
		}
		var all []slog.Attr
		if len(attrs) > 0 {
			all = append(all, slog.Group(procGroup, attrs...))
		}
		if dropped > 0 {
			all = append(all, slog.Int(procGroup+"_dropped", dropped))
		}
		log.LogAttrs(context.Background(), slogLevel(level), cutText(msg, maxProcLogText), all...)
	}
	return len(p), nil
}

// boundValue is v, a value decoded from a log line's JSON, within
// maxProcLogText: a string cut, an object or array whose JSON is longer
// written as that JSON, cut.
func boundValue(v any) any {
	switch v := v.(type) {
	case string:
		return cutText(v, maxProcLogText)
	case map[string]any, []any:
		b, err := json.Marshal(v)
		if err != nil || len(b) > maxProcLogText {
			return cutText(string(b), maxProcLogText)
		}
	}
	return v
}

// cutText is s cut to at most n bytes, on a rune boundary, and marked as
// cut with how long it was: "…[cut: 12345 bytes]".
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + fmt.Sprintf("…[cut: %d bytes]", len(s))
}

func slogLevel(hclogLevel string) slog.Level {
	switch hclogLevel {
	case "trace", "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}
