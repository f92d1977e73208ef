package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestListenAddr: http_addr without a host is loopback's; every other
// address is listened on as given (every interface only when named).
func TestListenAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{":9464", "127.0.0.1:9464"},
		{":0", "127.0.0.1:0"},
		{"127.0.0.1:9464", "127.0.0.1:9464"},
		{"localhost:9464", "localhost:9464"},
		{"0.0.0.0:9464", "0.0.0.0:9464"},
		{"[::]:9464", "[::]:9464"},
		{"[::1]:9464", "[::1]:9464"},
		{"10.0.0.7:9464", "10.0.0.7:9464"},
		{"no-port", ""},
		{"", ""},
	} {
		got, err := listenAddr(c.in)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("listenAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// TestServeHealthWithoutHostIsLoopback: serveHealth on ":0" listens on
// 127.0.0.1 (as its log line says) and answers there.
func TestServeHealthWithoutHostIsLoopback(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	srv, err := serveHealth(":0", &readiness{}, http.NotFoundHandler(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var line struct{ Addr string }
	if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
		t.Fatalf("log %q: %v", logs.String(), err)
	}
	host, _, err := net.SplitHostPort(line.Addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("serving on %q, want 127.0.0.1", line.Addr)
	}
	resp, err := http.Get("http://" + line.Addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("/healthz: %d %q", resp.StatusCode, body)
	}
	if _, err := serveHealth("no-port", &readiness{}, http.NotFoundHandler(), log); err == nil || !strings.Contains(err.Error(), "http_addr") {
		t.Errorf("serveHealth(no-port): %v, want an error naming http_addr", err)
	}
}
