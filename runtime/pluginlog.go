package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// pluginLogger is the hclog.Logger go-plugin logs a module process through
// (its own messages and every line the process writes to stderr, at the
// level the line says). It writes hclog's JSON lines into a writer that
// logs each one to the node's slog logger, tagged with the module.
func pluginLogger(to *atomic.Pointer[slog.Logger]) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "module",
		Level:      hclog.Trace, // the slog handler decides what to keep
		JSONFormat: true,
		Output:     slogWriter{to: to},
	})
}

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
			log.Info(string(line))
			continue
		}
		msg, _ := entry["@message"].(string)
		level, _ := entry["@level"].(string)
		attrs := make([]slog.Attr, 0, len(entry))
		for k, v := range entry {
			if strings.HasPrefix(k, "@") || k == "timestamp" {
				continue
			}
			attrs = append(attrs, slog.Any(k, v))
		}
		log.LogAttrs(context.Background(), slogLevel(level), msg, attrs...)
	}
	return len(p), nil
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
