package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshkit/mesh/internal/brokertest"
	"github.com/meshkit/mesh/runtime/nodeconfig"
)

// TestGuestWarnedAtStart: meshd's start warning against the test broker,
// which accepts guest/guest from this host: a node of its own user is
// warned of guest, one that logs in as guest of that too.
func TestGuestWarnedAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := brokertest.VHost(t)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	name, password := brokertest.User(t)
	brokertest.Ctl(t, "set_permissions", "-p", strings.TrimPrefix(u.Path, "/"), name, ".*", ".*", ".*")
	u.User = neturl.UserPassword(name, password)
	accepts := "the broker at " + brokertest.Host() + " accepts guest/guest from this host: any local process can publish as any node and module; " +
		"delete guest or keep it to loopback and give each node a user of its own (docs/security.md)"
	for _, c := range []struct {
		url  string
		want []string
	}{
		{u.String(), []string{accepts}},
		{url, []string{accepts, "this node logs in to the broker at " + brokertest.Host() + " as guest"}},
	} {
		var out bytes.Buffer
		warnGuest(ctx, slog.New(slog.NewJSONHandler(&out, nil)), nodeconfig.File{Node: "anchor", AMQPURL: c.url})
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var line map[string]any
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			lines = append(lines, line)
		}
		if len(lines) != len(c.want) {
			t.Fatalf("%d warnings, want %d:\n%s", len(lines), len(c.want), out.String())
		}
		for i, want := range c.want {
			if msg, _ := lines[i]["msg"].(string); lines[i]["level"] != "WARN" || !strings.HasPrefix(msg, want) || lines[i]["broker"] != brokertest.Host() {
				t.Errorf("warning %d: %v, want %q", i, lines[i], want)
			}
		}
		if strings.Contains(out.String(), password) {
			t.Errorf("the log shows the password:\n%s", out.String())
		}
	}
}
